"""``python -m fairseq_sparse`` (usage, ``--user-dir``) and the package's top-level exports."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import fairseq_sparse


def run_module(*args, cwd):
    return subprocess.run([sys.executable, "-m", "fairseq_sparse", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def test_user_dir_prints_the_installed_package_directory_from_anywhere(tmp_path):
    result = run_module("--user-dir", cwd=tmp_path)  # not the repository root: no ./fairseq_sparse here
    assert result.returncode == 0, result.stderr
    printed = Path(result.stdout.strip())
    # fairseq's --user-dir imports the directory's basename from its parent: it must be this very package
    assert result.stdout.count("\n") == 1 and printed.is_absolute()
    assert printed == Path(fairseq_sparse.__file__).resolve().parent and printed.name == "fairseq_sparse"


def test_without_arguments_it_lists_the_entry_points(tmp_path):
    result = run_module(cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m fairseq_sparse [--user-dir]")
    assert "--user-dir $(python -m fairseq_sparse --user-dir)" in result.stdout
    # the lines after the header (a summary may say "commands" too)
    listed = [line.split()[0] for line in result.stdout.split("\ncommands (python -m MODULE")[1].splitlines()[1:]]
    assert {"fairseq_sparse.evaluate", "fairseq_sparse.analysis", "fairseq_sparse.average_checkpoints",
            "fairseq_sparse.l0drop_pruned"} <= set(listed)
    assert all(importlib.util.find_spec(module) is not None for module in listed)
    assert run_module("--no-such-option", cwd=tmp_path).returncode == 2


def test_hub_class_is_exported_at_the_top_level():
    # a fresh interpreter: importing it first must not meet an import cycle
    code = ("from fairseq_sparse import SparseTransformerModel as M; from fairseq.models import MODEL_REGISTRY; "
            "assert MODEL_REGISTRY['transformer_sparse'] is M and callable(M.from_pretrained); print(M.__module__)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "fairseq_sparse.core.models.sparse_transformer"
    assert "SparseTransformerModel" in fairseq_sparse.__all__
