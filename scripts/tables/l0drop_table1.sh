#!/usr/bin/env bash
# L0Drop, Table 1: decoding time, speedup, sparsity and BLEU of L0Drop fine-tuning on WMT14 En-De (subwords, characters) and WMT18 Zh-En.
#   PROFILE=smoke bash scripts/tables/l0drop_table1.sh    # tiny models on the offline Bible corpus, CPU, minutes
#   PROFILE=paper RAW_DATA=~/raw bash scripts/tables/l0drop_table1.sh   # the paper's settings (GPU)
# Extra arguments go to python -m fairseq_sparse.tables (see --help), e.g. --dry-run.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup-env.sh
exec .venv/bin/python -m fairseq_sparse.tables configs/tables/l0drop_table1.yaml --profile "${PROFILE:-smoke}" "$@"
