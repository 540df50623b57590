#!/usr/bin/env bash
# Set up (or reuse) .venv and run the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
# the Slurm launcher's tests submit to a real one-node cluster on this machine (installs Slurm as root)
bash scripts/slurm-local.sh start
# Two workers, one thread each (tests/conftest.py), a test file per worker at a time (its module
# fixtures built once): most tests run small models whose operations a second thread barely speeds
# up, so two single-thread workers use 2 cores better than one process. Files are handed out longest
# first (tests/conftest.py: LONGEST_FIRST), not by their number of tests. TEST_WORKERS=0: one process.
exec .venv/bin/python -m pytest tests -n "${TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "$@"
