#!/usr/bin/env bash
# Explicit Sparse Transformer, Figure (choice of k): valid BLEU vs k on IWSLT15 En-Vi and IWSLT14 De-En.
#   PROFILE=smoke bash scripts/tables/explicit_k_selection.sh    # tiny models on the offline Bible corpus, CPU, minutes
#   PROFILE=paper RAW_DATA=~/raw bash scripts/tables/explicit_k_selection.sh   # the paper's settings (GPU)
# Extra arguments go to python -m fairseq_sparse.tables (see --help), e.g. --dry-run.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup-env.sh
exec .venv/bin/python -m fairseq_sparse.tables configs/tables/explicit_k_selection.yaml --profile "${PROFILE:-smoke}" "$@"
