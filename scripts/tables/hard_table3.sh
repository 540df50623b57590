#!/usr/bin/env bash
# Hard Retrieval Attention, Table 3: BLEU and decoding speed-up (WMT14 En-De, beam 4) with hard attention in different attention sublayers.
#   PROFILE=smoke bash scripts/tables/hard_table3.sh    # tiny models on the offline Bible corpus, CPU, minutes
#   PROFILE=paper RAW_DATA=~/raw bash scripts/tables/hard_table3.sh   # the paper's settings (GPU)
# Extra arguments go to python -m fairseq_sparse.tables (see --help), e.g. --dry-run.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup-env.sh
exec .venv/bin/python -m fairseq_sparse.tables configs/tables/hard_table3.yaml --profile "${PROFILE:-smoke}" "$@"
