"""The benchmarks in fairseq_sparse.bench run and print their tables (smallest settings; timings are never checked)."""

import csv
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fairseq_sparse.core.attention import attention_names

ROOT = Path(__file__).resolve().parents[2]
# One intra-op thread: the smoke tests must not depend on (or fight over) the machine's cores.
TINY_MODEL = ["--arch", "transformer_sparse_mini", "--threads", "1"]

RUNS = {
    "l0drop.py": (TINY_MODEL + ["--batch-size", "2", "--repeats", "1", "--levels", "subword", "--decode-len", "2"],
                  ["| subword | "]),
    "operations.py": (["--threads", "1", "--iterations", "5", "--repeats", "1", "--hypotheses", "4"],
                      ["| normalise / argmax |", "hard / standard time:"]),
    "memory.py": (["--threads", "1", "--lengths", "16", "24", "--embed-dim", "16", "--heads", "2", "--functions", "softmax", "topk",
                   "--causal"],
                  ["| fairseq | ", "| topk | ", "causal (decoder), length 16,", "causal (decoder), length 24,",
                   "| function | forward MiB | ×fairseq | ×softmax |"]),
    "cuda_equality.py": (TINY_MODEL[:2] + ["--device", "cpu", "--threads", "1", "--batch-size", "2", "--src-len", "6",
                                           "--vocab", "50", "--functions", "softmax", "hard", "l0drop", "fairseq"],
                         ["| hard | decoder+cross | 0.00e+00 | 0.00e+00 |", "| fairseq | ", "0 of 4 rows differ or failed",
                          "max abs Δ logits, decoding"]),
    "profile_decode.py": (TINY_MODEL + ["--batch-size", "1", "--decode-len", "2", "--vocab", "50",
                                        "--functions", "softmax", "hard", "l0drop"],
                          ["| hard | ", "| l0drop | ", "Amdahl bound"]),
}
# flops.py runs in-process in tests/bench/test_flops.py.


def run(script, *args):
    return subprocess.run([sys.executable, "-m", f"fairseq_sparse.bench.{Path(script).stem}", *args], capture_output=True, text=True, timeout=600)


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
                 "--long-lengths", "12", "--csv", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    for line in ["## Plugin softmax vs stock fairseq (transformer_sparse_mini vs transformer_iwslt_de_en, encoder_layers=2, "
                 "decoder_layers=2, same weights", "* max |logits difference|, large batch",
                 "* beam hypotheses (beam 4, 2 forced steps, large batch): identical in all 2 sentences",
                 "| function | sublayers | train ×fairseq | train ×softmax | decode batch 1 ×fairseq |",
                 "| fairseq | encoder+decoder+cross (stock fairseq transformer_iwslt_de_en, encoder_layers=2, decoder_layers=2) | 1.00× |",
                 "| topk | encoder+decoder+cross |", "| hard | decoder+cross |", "| window | encoder+decoder |",
                 "| l0drop | encoder+decoder+cross (softmax), L0Drop ", "| hard retrieval vs softmax | ≥ 1.50× |",
                 "| ReLA-g vs softmax | ≥ 0.95× | not measured | not measured |", "softmax, absolute: train ",
                 "fairseq, absolute: train ", "## Long sequences: train step on 2 sequences of L source and L target tokens",
                 "| function | L=12 ×fairseq | L=12 ×softmax |", "fairseq, absolute: L=12 ", "repetition 1/1 done"]:
        assert line in result.stdout, result.stdout[-3000:]
    rows = list(csv.DictReader(out.open()))
    assert [r["function"] for r in rows] == ["fairseq", "softmax", "topk", "hard", "window", "l0drop"]
    assert float(rows[1]["decodeN_ratio"]) == 1.0 and float(rows[0]["decodeN_ratio_fairseq"]) == 1.0
    assert float(rows[0]["long12_ratio_fairseq"]) == 1.0 and float(rows[3]["long12_per_second"]) > 0
    assert float(rows[3]["train_per_second"]) > 0
    # the same weights give the same function: stock fairseq and the plugin's softmax agree (not a timing)
    assert float(rows[0]["softmax_vs_fairseq_max_abs_logit_diff"]) < 1e-4
    assert rows[0]["softmax_vs_fairseq_hypotheses_differ"] == "0"


def test_run_rejects_unknown_rows(capsys):
    module = importlib.import_module("fairseq_sparse.bench.run")
    assert module.parse_args([]).functions == module.DEFAULT_FUNCTIONS
    assert module.parse_args([]).long_lengths == []
    assert module.parse_args([]).dtype == "fp32" and module.parse_args(["--dtype", "bf16"]).dtype == "bf16"
    with pytest.raises(SystemExit) as exit_info:
        module.parse_args(["--functions", "softmax", "nosuch"])
    assert exit_info.value.code == 2 and "unknown row 'nosuch'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        module.parse_args(["--arch", "transformer_tiny"])
    assert exit_info.value.code == 2 and "no stock fairseq counterpart" in capsys.readouterr().err


def check_plan(text):
    """The GPU report's plan names every registered function, both precisions and every benchmark."""
    for name in attention_names() + ["l0drop", "l0drop_every_layer"]:
        assert f"[train] train {name} fp16: " in text and f"[train] train {name} bf16: " in text, name
    for fragment in ["--fp16", "--bf16", "--l0drop-every-layer", "fairseq_cli.train", "fairseq_sparse.train", "fairseq_cli.preprocess",
                     "fairseq_sparse.bench.run --device cuda", "--beam 4 --batch-size 128 --long-lengths 512 1024 2048 4096",
                     "fairseq_sparse.bench.operations --device cuda", "fairseq_sparse.bench.memory --device cuda --dtype bf16 --lengths 512 1024 2048 4096",
                     "--causal", "fairseq_sparse.bench.cuda_equality --device cuda", "torch.cuda.get_device_name"]:
        assert fragment in text, fragment


def test_gpu_report_dry_run_prints_the_plan():
    result = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-report.sh"), "--dry-run"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    check_plan(result.stdout)


def test_gpu_report_speed_profile_measures_the_users_regime_into_results():
    """--profile speed lists every measurement of the users' regime, in bf16 by default, the report under
    results/bench named by device: the kernels against the reference in float32 and bf16; bf16 training at 512-8,192
    tokens against stock fairseq for top-k, window, block, ReLA-g and hard retrieval; bf16 decoding against softmax
    for hard retrieval, top-k, ReLA-g and L0Drop; peak memory; then window and block through FlexAttention."""
    result = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-report.sh"), "--profile", "speed", "--budget", "540",
                             "--dry-run"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    text = result.stdout
    assert "[train]" not in text and "[operations]" not in text and "plan: 9 steps" in text
    kernels = "--functions entmax15 hard rela_g rela_g_gelu rela_g_layernorm rela_g_leaky_relu rela_i relu relu_rmsnorm"
    assert f"cuda_equality --device cuda {kernels}" in text and f"cuda_equality --device cuda --dtype bf16 {kernels}" in text
    assert ("bench.run --device cuda --arch transformer_sparse --repeats 3 --skip-decode --long-lengths 512 1024 2048 "
            "4096 8192 --long-batch-size 1 --functions topk window block rela_g hard --dtype bf16 --csv") in text
    assert ("bench.run --device cuda --arch transformer_sparse --repeats 3 --skip-train --beam 4 --batch-size 128 "
            "--functions hard topk rela_g l0drop --dtype bf16 --csv") in text
    assert ("bench.memory --device cuda --dtype bf16 --lengths 1024 4096 8192 --functions softmax topk window block "
            "rela_g hard") in text
    assert "--device-attn-impl flex --functions window block bigbird" in text
    assert "--functions window block --attn-impl flex --dtype bf16 --csv" in text and "_bf16.speed.flex.csv" in text
    device = "nogpu" if not torch.cuda.is_available() else ""
    assert f"results/bench/gpu_{device}" in text and "_bf16.md" in text and "_bf16.speed.train.csv" in text
    fp16 = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-report.sh"), "--profile", "speed", "--dtype", "fp16",
                           "--dry-run"], capture_output=True, text=True, timeout=300)
    assert "--dtype fp16 --lengths" in fp16.stdout and "_fp16.md" in fp16.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a CUDA device the script runs the whole report")
def test_gpu_report_without_cuda_says_so_and_prints_the_plan(tmp_path):
    out = tmp_path / "report" / "REPORT.md"
    result = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-report.sh"), "--out", str(out)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "no CUDA device is present" in result.stdout
    check_plan(result.stdout)
    assert not out.exists()


def test_run_without_the_train_step_says_not_measured():
    result = run("run.py", *TINY_MODEL, "--batch-size", "2", "--single-sentences", "1", "--src-len", "6",
                 "--decode-len", "2", "--repeats", "1", "--vocab", "50", "--functions", "topk", "--skip-train")
    assert result.returncode == 0, result.stderr[-3000:]
    table = result.stdout[result.stdout.index("## Throughput"):]
    row = next(line for line in table.splitlines() if line.startswith("| topk |"))
    assert "not measured | not measured" in row and "nan" not in row
    assert "nan" not in table and "softmax, absolute: decode batch 1 " in table


def test_run_without_decoding_times_the_train_steps_only():
    """--skip-decode (the GPU report times training and decoding of different rows): the train columns and the
    long steps are measured, the decoding columns say not measured, and nothing prints NaN."""
    result = run("run.py", *TINY_MODEL, "--batch-size", "2", "--single-sentences", "1", "--src-len", "6",
                 "--decode-len", "2", "--repeats", "1", "--vocab", "50", "--functions", "topk", "--skip-decode",
                 "--long-lengths", "12")
    assert result.returncode == 0, result.stderr[-3000:]
    table = result.stdout[result.stdout.index("## Throughput"):]
    row = next(line for line in table.splitlines() if line.startswith("| topk |"))
    assert row.count("not measured") >= 2 and "nan" not in table
    assert "| function | L=12 ×fairseq | L=12 ×softmax |" in table and "softmax, absolute: train " in table
    assert "decode batch 1 ×" not in table.split("softmax, absolute: train ")[1].splitlines()[0]
