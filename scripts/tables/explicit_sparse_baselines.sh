#!/usr/bin/env bash
# Explicit Sparse Transformer, Table 3: top-k vs sparsemax / 1.5-entmax / alpha-entmax on IWSLT14 De-En (BLEU, speed).
#   PROFILE=smoke bash scripts/tables/explicit_sparse_baselines.sh    # tiny models on the offline Bible corpus, CPU, minutes
#   PROFILE=paper RAW_DATA=~/raw bash scripts/tables/explicit_sparse_baselines.sh   # the paper's settings (GPU)
# Extra arguments go to python -m fairseq_sparse.tables (see --help), e.g. --dry-run.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup-env.sh
exec .venv/bin/python -m fairseq_sparse.tables configs/tables/explicit_sparse_baselines.yaml --profile "${PROFILE:-smoke}" "$@"
