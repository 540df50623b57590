#!/usr/bin/env bash
# One-command GPU report (python -m fairseq_sparse.bench.gpu_report): fp16/bf16 fairseq-train runs of every attention
# function and L0Drop, CUDA-vs-CPU outputs, run.py / operations.py / memory.py on the GPU, written
# to one Markdown report (--out, default runs/gpu-report/REPORT.md). Without a CUDA device it prints
# the plan and exits 0; --dry-run prints the plan anywhere. Arguments go to fairseq_sparse.bench.gpu_report (--help).
# Python: $PYTHON if set, else .venv/bin/python if present, else python3 (e.g. a GPU machine's own,
# with the other packages installed from wheels: README "How to run on a lent GPU").
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" -m fairseq_sparse.bench.gpu_report "$@"
