#!/usr/bin/env bash
# ReLA, Table 3: SacreBLEU of softmax, sparsemax, 1.5-entmax and ReLA-g on WMT14 En-Fr, WMT18 En-Fi, WMT18 Zh-En, WMT16 Ro-En.
#   PROFILE=smoke bash scripts/tables/rela_table3.sh    # tiny models on the offline Bible corpus, CPU, minutes
#   PROFILE=paper RAW_DATA=~/raw bash scripts/tables/rela_table3.sh   # the paper's settings (GPU)
# Extra arguments go to python -m fairseq_sparse.tables (see --help), e.g. --dry-run.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup-env.sh
exec .venv/bin/python -m fairseq_sparse.tables configs/tables/rela_table3.yaml --profile "${PROFILE:-smoke}" "$@"
