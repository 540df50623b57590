#!/usr/bin/env bash
# Hard Retrieval Attention, Table 1: WMT14 En-De and En-Fr BLEU of Transformer Base/Big with and without hard retrieval decoder attention.
#   PROFILE=smoke bash scripts/tables/hard_table1.sh    # tiny models on the offline Bible corpus, CPU, minutes
#   PROFILE=paper RAW_DATA=~/raw bash scripts/tables/hard_table1.sh   # the paper's settings (GPU)
# Extra arguments go to python -m fairseq_sparse.tables (see --help), e.g. --dry-run.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup-env.sh
exec .venv/bin/python -m fairseq_sparse.tables configs/tables/hard_table1.yaml --profile "${PROFILE:-smoke}" "$@"
