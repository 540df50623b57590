#!/usr/bin/env bash
# Extremely Sparse Transformer (Top-k), Table 2: sparse attention methods x k on document-level MT (TED, News-Commentary; d-BLEU).
#   PROFILE=smoke bash scripts/tables/topk_table2.sh    # tiny models on the offline Bible corpus, CPU, minutes
#   PROFILE=paper RAW_DATA=~/raw bash scripts/tables/topk_table2.sh   # the paper's settings (GPU)
# Extra arguments go to python -m fairseq_sparse.tables (see --help), e.g. --dry-run.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup-env.sh
exec .venv/bin/python -m fairseq_sparse.tables configs/tables/topk_table2.yaml --profile "${PROFILE:-smoke}" "$@"
