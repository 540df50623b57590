#!/usr/bin/env bash
# ReLA, Table 2: parameters and training/decoding speedups (batch 1) of softmax, sparsemax, 1.5-entmax and ReLA-g on WMT14 En-De.
#   PROFILE=smoke bash scripts/tables/rela_table2.sh    # tiny models on the offline Bible corpus, CPU, minutes
#   PROFILE=paper RAW_DATA=~/raw bash scripts/tables/rela_table2.sh   # the paper's settings (GPU)
# Extra arguments go to python -m fairseq_sparse.tables (see --help), e.g. --dry-run.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup-env.sh
exec .venv/bin/python -m fairseq_sparse.tables configs/tables/rela_table2.yaml --profile "${PROFILE:-smoke}" "$@"
