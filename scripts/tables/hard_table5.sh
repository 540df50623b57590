#!/usr/bin/env bash
# Hard Retrieval Attention, Table 5: BLEU of softmax vs hard retrieval decoder attention on 12 WMT17 news translation directions.
#   PROFILE=smoke bash scripts/tables/hard_table5.sh    # tiny models on the offline Bible corpus, CPU, minutes
#   PROFILE=paper RAW_DATA=~/raw bash scripts/tables/hard_table5.sh   # the paper's settings (GPU)
# Extra arguments go to python -m fairseq_sparse.tables (see --help), e.g. --dry-run.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup-env.sh
exec .venv/bin/python -m fairseq_sparse.tables configs/tables/hard_table5.yaml --profile "${PROFILE:-smoke}" "$@"
