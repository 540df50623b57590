"""Host synchronisations and dispatched operations per step, counted on the CPU along the route a GPU takes.

No registered method (nor L0Drop's compressed memory) may add a host synchronisation to softmax's
training step, at sentence level and on one 512-token sequence, or to its decoding step; the
decoding steps of top-k, hard retrieval and L0Drop's compressed memory dispatch at most 1.05x
softmax's operations, ReLA-g's (whose every sublayer adds its gated RMSNorm) at most 1.10x.
"""

import pytest
import torch

from fairseq_sparse.bench import dispatch_counts
from fairseq_sparse.bench.common import L0DROP
from fairseq_sparse.core.attention import attention_names
from fairseq_sparse.core.kernels import device as kernel_device

ROWS = attention_names() + [L0DROP]


@pytest.fixture(scope="module")
def counts():
    """Every row's steady-state counts, once for the module (a GPU's route: slots of fixed size, the kernels
    launched through the interpreter without running their bodies)."""
    torch.set_num_threads(1)
    with dispatch_counts.gpu_route():
        yield {row: dispatch_counts.count_rows(row, k=8, long=512) for row in ROWS}


def test_the_counter_sees_a_synchronisation_and_boolean_indexing():
    x = torch.randn(5)
    assert len(dispatch_counts.count(lambda: bool(x.sum() > 0)).synchronisations) == 1
    assert len(dispatch_counts.count(lambda: x[x > 0]).synchronisations) == 1
    assert len(dispatch_counts.count(lambda: x.masked_fill(x > 0, 0.0)).synchronisations) == 0
    counter = dispatch_counts.count(lambda: x.masked_fill(x > 0, 0.0))
    assert counter.operations == 2 and counter.by_operation["aten.masked_fill"] == 1


def test_the_counts_skip_the_kernels_bodies_without_changing_a_count(monkeypatch):
    """The module fixture launches the interpreted kernels without running their bodies (minutes at 512 tokens):
    the counts equal those of running them. ReLA-g's steps launch three kernels (its sequence kernel, its output
    norm's, the decoding step's); skipping is the same for every kernel."""
    from triton.runtime import interpreter

    row = "rela_g"
    bodies_run = []
    grid_call = interpreter.GridExecutor.__call__
    monkeypatch.setattr(interpreter.GridExecutor, "__call__",
                        lambda self, *args, **kwargs: bodies_run.append(1) or grid_call(self, *args, **kwargs))
    counts, runs = {}, {}
    for run_kernels in (True, False):
        bodies_run.clear()
        with dispatch_counts.gpu_route(run_kernels):
            assert kernel_device.INTERPRETED_ON_CPU, "tests/conftest.py sets the interpreter"
            counts[run_kernels] = dispatch_counts.count_rows(row, k=8, long=16)
        runs[run_kernels] = len(bodies_run)
    assert runs[True] > 0 and runs[False] == 0
    for step, counter in counts[True].items():
        assert any(op.startswith("fairseq_sparse.") for op in counter.by_operation), step  # a kernel launched
        assert counter.by_operation == counts[False][step].by_operation, step
        assert counter.synchronisations == counts[False][step].synchronisations, step


@pytest.mark.parametrize("row", ROWS)
def test_no_method_adds_a_host_synchronisation(row, counts):
    for step in counts["softmax"]:
        extra = len(counts[row][step].synchronisations) - len(counts["softmax"][step].synchronisations)
        assert extra <= 0, (step, counts[row][step].synchronisations)


def test_softmax_has_only_fairseqs_own_synchronisations(counts):
    """The plugin's own code reads nothing on the host in softmax's steps: what is left is stock
    fairseq's (its padding checks and positional embeddings)."""
    counter = dispatch_counts.count_rows("softmax", k=8, long=32, where=True)
    for step in counter.values():
        assert all("fairseq_sparse" not in place for place in step.synchronisations), step.synchronisations


@pytest.mark.parametrize("row", ["topk", "hard", L0DROP])
def test_decoding_steps_dispatch_about_as_many_operations_as_softmax(row, counts):
    assert counts[row]["decode"].operations <= 1.05 * counts["softmax"]["decode"].operations


def test_rela_g_decoding_step_dispatches_at_most_a_tenth_more_than_softmax(counts):
    assert kernel_device.INTERPRETED_ON_CPU, "the GPU's route runs the norm as one kernel (Triton installed and interpreted)"
    assert counts["rela_g"]["decode"].operations <= 1.10 * counts["softmax"]["decode"].operations
