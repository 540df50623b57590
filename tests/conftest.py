import os
import sys

if os.environ.get("PYTEST_XDIST_WORKER"):
    # one thread per worker (and per command a test runs): two 2-thread workers on 2 cores would fight
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"

# Triton's kernels (fairseq_sparse/core/kernels) run on the CPU through its interpreter, which Triton
# chooses when a kernel is defined: set before anything imports them. On a machine with a GPU they
# compile for it instead.
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# tests import their shared helpers (attention_cases, helpers) as top-level modules
sys.path.insert(0, os.path.dirname(__file__))


import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EVAL_PAIRS = 40


@pytest.fixture
def fused(monkeypatch):
    """The Triton kernels' route (tests/core/kernels): where the attention module takes them on a GPU, and on the CPU
    through Triton's interpreter (``device.INTERPRETED_ON_CPU``), for this test only."""
    from fairseq_sparse.core.kernels import device

    assert torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1", "the interpreter is set above"
    monkeypatch.setattr(device, "INTERPRETED_ON_CPU", True)


@pytest.fixture(scope="session")
def bible(tmp_path_factory):
    """A few hundred German-English verse pairs of the offline Bible corpus, BPE'd and binarised."""
    out = tmp_path_factory.mktemp("bible-de-en")
    subprocess.run(
        [sys.executable, "-m", "fairseq_sparse.data.bible", "--pair", "de-en", "--out", str(out),
         "--max-train-pairs", "400", "--max-eval-pairs", str(EVAL_PAIRS), "--bpe-merges", "1000", "--binarize"],
        check=True, capture_output=True, timeout=900,
    )
    return out


# The files that take longest (minutes each on 2 cores; `pytest --durations`), handed out first, the
# others after them in collection order (scripts/test.sh: --dist loadfile --no-loadscope-reorder;
# xdist would otherwise order files by their number of tests, and a long file of few tests started
# last keeps one worker busy alone at the end).
LONGEST_FIRST = ["experiments/test_slurm_launcher.py", "experiments/test_table_smoke_runs.py", "test_fairseq_features.py", "experiments/test_tables.py",
                 "test_wheel_install.py", "test_end_to_end.py", "core/models/test_half_precision.py",
                 "core/models/test_distributed.py", "test_continue_training.py"]


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        path = item.path.relative_to(Path(__file__).parent).as_posix()
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the tests of a file keep their order
