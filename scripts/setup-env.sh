#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install the pinned dependencies.
# Usage: bash scripts/setup-env.sh        (VENV=path overrides the default .venv)
#        PYTHON=python3.12 VENV=.venv312 bash scripts/setup-env.sh   (3.12: every pin has a cp312
#        wheel, tests/test_packaging.py; the registry's torch 2.13.0 for 3.12 is its CUDA build)
# Re-running is cheap: it reinstalls only when requirements.txt or setup.py changed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}

if [ ! -x "$VENV/bin/python" ]; then
    echo "setup-env: creating $VENV with $($PYTHON --version)"
    "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.fairseq-sparse-installed"
want=$(cat requirements.txt setup.py | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
echo "setup-env: installing pinned dependencies into $VENV (a few minutes on a fresh machine)"
"$VENV/bin/python" -m pip install --quiet -r requirements.txt
# The fork's metadata requires torchaudio, whose releases all pin another torch: install it
# without dependencies; requirements.txt lists what it really needs.
"$VENV/bin/python" -m pip install --quiet --no-deps ve-fairseq==0.12.3
"$VENV/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e .
"$VENV/bin/python" -c "import fairseq, fairseq_sparse, torch; print('setup-env: fairseq', fairseq.__version__, '| torch', torch.__version__, '| fairseq-sparse', fairseq_sparse.__version__)"
echo "$want" > "$stamp"
