"""The benchmark scripts run and print their tables (smallest settings; timings are never checked)."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"

RUNS = {
    "benchmark_speed.py": (["--arch", "transformer_sparse_mini", "--batch-size", "2", "--src-len", "6", "--decode-len", "3",
                            "--repeats", "1", "--vocab", "50", "--functions", "softmax", "topk", "hard", "window"],
                           ["| topk | encoder+decoder+cross |", "| hard | decoder+cross |", "| window | encoder+decoder |"]),
    "benchmark_l0drop.py": (["--arch", "transformer_sparse_mini", "--batch-size", "2", "--repeats", "1", "--levels", "subword"],
                            ["| subword | "]),
    "benchmark_operations.py": (["--iterations", "5", "--repeats", "1", "--hypotheses", "4"],
                                ["| normalise / argmax |", "hard / standard time:"]),
    "benchmark_memory.py": (["--length", "16", "--embed-dim", "16", "--heads", "2", "--functions", "softmax", "topk"],
                            ["topk"]),
}


@pytest.mark.parametrize("script", sorted(RUNS))
def test_benchmark_script_runs(script):
    args, expected = RUNS[script]
    result = subprocess.run([sys.executable, str(SCRIPTS / script), *args], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    for line in expected:
        assert line in result.stdout, result.stdout[-3000:]
