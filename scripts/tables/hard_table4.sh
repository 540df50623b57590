#!/usr/bin/env bash
# Hard Retrieval Attention, Table 4: WMT14 En-De BLEU when training and decoding with soft or hard decoder attention.
#   PROFILE=smoke bash scripts/tables/hard_table4.sh    # tiny models on the offline Bible corpus, CPU, minutes
#   PROFILE=paper RAW_DATA=~/raw bash scripts/tables/hard_table4.sh   # the paper's settings (GPU)
# Extra arguments go to python -m fairseq_sparse.tables (see --help), e.g. --dry-run.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup-env.sh
exec .venv/bin/python -m fairseq_sparse.tables configs/tables/hard_table4.yaml --profile "${PROFILE:-smoke}" "$@"
