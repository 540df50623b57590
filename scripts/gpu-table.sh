#!/usr/bin/env bash
# A study table on a lent GPU machine (docs/study.md, "On a lent GPU"): installs the packages from the
# wheels carried in .whl/ into the machine's own Python, so that fairseq-train and fairseq-generate sit
# beside it where the table runner looks for them; turns on TF32 matrix products (TF32=0: float32 ones, as
# on the CPU, for a table whose other seeds trained there); runs the table for at most MINUTES (a decimal
# number; the runner resumes from what a cut leaves), its record started from results/study's;
# writes the record of what finished into OUT/record and packs it with every log and decoding
# (no checkpoints) into OUT/table.tar.gz.
# Usage: bash scripts/gpu-table.sh OUT MINUTES TABLE [python -m fairseq_sparse.tables options]
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 3 ] || { echo "usage: bash scripts/gpu-table.sh OUT MINUTES TABLE [options]"; exit 2; }
out=$1 minutes=$2
shift 2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --find-links .whl \
    ve-fairseq hydra-core omegaconf antlr4-python3-runtime bitarray entmax sacremoses click || exit 1
bin=$(python3 -c 'import os, sys; print(os.path.dirname(sys.executable))')
for tool in fairseq-train fairseq-generate; do
    [ -x "$bin/$tool" ] || { echo "$tool was not installed beside $bin/python3"; exit 1; }
done
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
[ "${TF32:-1}" = 0 ] || export TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
mkdir -p "$out/record"
# seeds recorded before (results/study) count, as on the CPU: a row's difference needs its baseline's cells;
# and so do their curves: the report keeps the recorded curve of a model this machine never trained
for kept in seeds.csv curves.csv; do cp results/study/"$1.$kept" "$out/record/" 2>/dev/null; done
timeout --kill-after 20 "${minutes}m" python3 -m fairseq_sparse.tables "$@" --record "$out/record"
echo "table: exit $?"
python3 -m fairseq_sparse.tables "$@" --report-only --record "$out/record"
echo "record: exit $?"
tar czf "$out/table.tar.gz" --exclude='*.pt' "$out/record" runs/tables runs/models
