"""The plugin as a library: its wheel, installed into a fresh environment that has only torch, the
fairseq fork and the declared dependencies, runs every entry point from outside the checkout.

Slow (a virtual environment is built, ~2 minutes from pip's cache), so it is one test that does it all.
"""

import os
import subprocess
import sys
from pathlib import Path

from test_packaging import install_requires

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--arch", "transformer_sparse_mini", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
        "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--share-all-embeddings", "--cpu"]


def sh(*argv, cwd=None, env=None, timeout=900, stdout_only=False) -> str:
    result = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(map(str, argv))} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout if stdout_only else result.stdout + result.stderr


def torch_version(python: Path) -> str:
    return sh(python, "-c", "import torch; print(torch.__version__)", stdout_only=True).strip()


def test_wheel_in_a_fresh_environment_runs_outside_the_checkout(tmp_path, bible):
    wheels = tmp_path / "wheels"
    sh(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", wheels, ROOT)
    wheel = next(wheels.glob("fairseq_sparse-*.whl"))

    venv = tmp_path / "venv"
    sh(sys.executable, "-m", "venv", venv)
    python, pip = venv / "bin" / "python", [venv / "bin" / "python", "-m", "pip", "install", "--quiet"]
    pins = ROOT / "requirements.txt"
    sh(*pip, "-c", pins, "torch")
    torch_before = torch_version(python)
    sh(*pip, "--no-deps", "ve-fairseq==0.12.3")
    sh(*pip, "-c", pins, *[str(r) for r in install_requires()])
    sh(*pip, "--no-deps", wheel)
    # installing the plugin (with its declared ranges) keeps the environment's torch build
    sh(*pip, "-c", pins, wheel)
    assert torch_version(python) == torch_before

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    user_dir = sh(python, "-c", "import fairseq_sparse, os; print(os.path.dirname(fairseq_sparse.__file__))",
                  cwd=outside, env=env, stdout_only=True).strip()
    assert Path(user_dir).is_relative_to(venv) and not Path(user_dir).is_relative_to(ROOT), user_dir

    sh(python, "-m", "fairseq_sparse.data.bible", "--pair", "de-en", "--out", "bible", "--max-train-pairs", "200",
       "--max-eval-pairs", "10", "--bpe-merges", "300", "--binarize", cwd=outside, env=env)
    sh(venv / "bin" / "fairseq-train", "bible/bin", "--user-dir", user_dir, *TINY, "--encoder-attn-fn", "topk",
       "--optimizer", "adam", "--lr", "0.001", "--max-tokens", "2000", "--max-update", "3", "--save-dir", "ck",
       "--no-epoch-checkpoints", "--disable-validation", "--num-workers", "0", cwd=outside, env=env)
    out = sh(venv / "bin" / "fairseq-generate", "bible/bin", "--user-dir", user_dir, "--path", "ck/checkpoint_last.pt",
             "--beam", "2", "--max-len-b", "5", "--cpu", "--required-batch-size-multiple", "1", "--post-process", "subword_nmt",
             cwd=outside, env=env)
    assert "Translated 10 sentences" in out
    # a table by name from the package's configurations and data-prep scripts, every command parsed by its
    # tool (tests/experiments/test_table_smoke_runs.py runs the demo table end to end from the checkout)
    report = sh(python, "-m", "fairseq_sparse.tables", "hard_table4", "--profile", "smoke", "--dry-run", cwd=outside, env=env)
    assert "hard_table4 (smoke): " in report and " commands parse" in report and str(venv) in report


def test_pip_keeps_a_cuda_build_of_another_torch_version(tmp_path):
    """A researcher's environment with a CUDA torch 2.11 (as on the GPU machines): pip's plan for
    installing the plugin installs no torch. The CUDA build is stood in for by its metadata alone."""
    wheels = tmp_path / "wheels"
    sh(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", wheels, ROOT)
    venv = tmp_path / "venv"
    sh(sys.executable, "-m", "venv", venv)
    site = Path(sh(venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                   stdout_only=True).strip())
    info = site / "torch-2.11.0+cu128.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.11.0+cu128\n")
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text("")
    report = tmp_path / "report.json"
    sh(venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--dry-run", "--report", report,
       next(wheels.glob("fairseq_sparse-*.whl")))
    import json

    planned = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert "fairseq-sparse" in planned and "torch" not in planned, sorted(planned)
