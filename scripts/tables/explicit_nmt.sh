#!/usr/bin/env bash
# Explicit Sparse Transformer, Table 1: Transformer vs top-k attention on WMT14 En-De, IWSLT15 En-Vi, IWSLT14 De-En.
#   PROFILE=smoke bash scripts/tables/explicit_nmt.sh    # tiny models on the offline Bible corpus, CPU, minutes
#   PROFILE=paper RAW_DATA=~/raw bash scripts/tables/explicit_nmt.sh   # the paper's settings (GPU)
# Extra arguments go to python -m fairseq_sparse.tables (see --help), e.g. --dry-run.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup-env.sh
exec .venv/bin/python -m fairseq_sparse.tables configs/tables/explicit_nmt.yaml --profile "${PROFILE:-smoke}" "$@"
