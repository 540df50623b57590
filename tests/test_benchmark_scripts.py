"""The benchmarks in benchmarks/ run and print their tables (smallest settings; timings are never checked)."""

import csv
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
# One intra-op thread: the smoke tests must not depend on (or fight over) the machine's cores.
TINY_MODEL = ["--arch", "transformer_sparse_mini", "--threads", "1"]

RUNS = {
    "l0drop.py": (TINY_MODEL + ["--batch-size", "2", "--repeats", "1", "--levels", "subword", "--decode-len", "2"],
                  ["| subword | "]),
    "operations.py": (["--threads", "1", "--iterations", "5", "--repeats", "1", "--hypotheses", "4"],
                      ["| normalise / argmax |", "hard / standard time:"]),
    "memory.py": (["--threads", "1", "--length", "16", "--embed-dim", "16", "--heads", "2", "--functions", "softmax", "topk"],
                  ["topk"]),
    "profile_decode.py": (TINY_MODEL + ["--batch-size", "1", "--decode-len", "2", "--vocab", "50",
                                        "--functions", "softmax", "hard", "l0drop"],
                          ["| hard | ", "| l0drop | ", "Amdahl bound"]),
}
# flops.py runs in-process in tests/test_flops.py.


def run(script, *args):
    return subprocess.run([sys.executable, str(BENCHMARKS / script), *args], capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("script", sorted(RUNS))
def test_benchmark_script_runs(script):
    args, expected = RUNS[script]
    result = run(script, *args)
    assert result.returncode == 0, result.stderr[-3000:]
    for line in expected:
        assert line in result.stdout, result.stdout[-3000:]


def test_run_prints_tables_and_writes_csv(tmp_path):
    out = tmp_path / "speed.csv"
    result = run("run.py", *TINY_MODEL, "--batch-size", "2", "--single-sentences", "1", "--src-len", "6",
                 "--decode-len", "2", "--repeats", "1", "--vocab", "50", "--functions", "topk", "hard", "window", "l0drop",
                 "--csv", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    for line in ["| topk | encoder+decoder+cross |", "| hard | decoder+cross |", "| window | encoder+decoder |",
                 "| l0drop | encoder+decoder+cross (softmax), L0Drop ", "| hard retrieval vs softmax | ≥ 1.50× |",
                 "| ReLA-g vs softmax | ≥ 0.95× | not measured | not measured |", "softmax, absolute: train ",
                 "repetition 1/1 done"]:
        assert line in result.stdout, result.stdout[-3000:]
    rows = list(csv.DictReader(out.open()))
    assert [r["function"] for r in rows] == ["softmax", "topk", "hard", "window", "l0drop"]
    assert float(rows[0]["decodeN_ratio"]) == 1.0 and float(rows[2]["train_per_second"]) > 0


def test_run_rejects_unknown_rows(capsys):
    spec = importlib.util.spec_from_file_location("benchmarks_run", BENCHMARKS / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.parse_args([]).functions == module.DEFAULT_FUNCTIONS
    with pytest.raises(SystemExit) as exit_info:
        module.parse_args(["--functions", "softmax", "nosuch"])
    assert exit_info.value.code == 2 and "unknown row 'nosuch'" in capsys.readouterr().err
