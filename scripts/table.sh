#!/usr/bin/env bash
# Regenerate one published table or figure by name (python -m fairseq_sparse.tables NAME).
#   bash scripts/table.sh                                   # list the tables
#   PROFILE=smoke bash scripts/table.sh hard_table4         # tiny models on the offline Bible corpus, CPU, minutes
#   PROFILE=paper RAW_DATA=~/raw bash scripts/table.sh hard_table4   # the paper's settings (GPU); raw files in ~/raw/<dataset id>/
#   bash scripts/table.sh hard_table4 --dry-run             # build every command and check that it parses
# Extra arguments go to python -m fairseq_sparse.tables (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
if [ $# -eq 0 ]; then
    echo "usage: bash scripts/table.sh NAME [options]; tables:"
    ls fairseq_sparse/configs/tables | sed -n 's/\.yaml$//p' | sed 's/^/  /'
    exit 2
fi
exec .venv/bin/python -m fairseq_sparse.tables "$@" --profile "${PROFILE:-smoke}"
