#!/usr/bin/env bash
# Set up (or reuse) .venv and run the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
exec .venv/bin/python -m pytest tests "$@"
