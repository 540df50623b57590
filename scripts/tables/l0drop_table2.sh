#!/usr/bin/env bash
# L0Drop, Table 2: sparsity and BLEU of L0Drop and rule-based sparse patterns on WMT14 En-De.
#   PROFILE=smoke bash scripts/tables/l0drop_table2.sh    # tiny models on the offline Bible corpus, CPU, minutes
#   PROFILE=paper RAW_DATA=~/raw bash scripts/tables/l0drop_table2.sh   # the paper's settings (GPU)
# Extra arguments go to python -m fairseq_sparse.tables (see --help), e.g. --dry-run.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup-env.sh
exec .venv/bin/python -m fairseq_sparse.tables configs/tables/l0drop_table2.yaml --profile "${PROFILE:-smoke}" "$@"
