"""The memory criterion of the users' regime, at a scale the suite can run: every registered function's
forward + backward peak of one self-attention sublayer within 1.5x stock fairseq's.

The full-size measurement (4,096 tokens, d_model 512: ``python -m fairseq_sparse.bench.memory --threads 1
--lengths 4096``) takes minutes a function on two cores; here the sequence is 8x shorter and the model
4x narrower, and the budgets that choose and cut the lean paths shrink by the same 32x, so that every
method takes the path it takes at full size and keeps the share of the working memory it keeps there
(a chunk's (queries x keys) against the sequence's (tokens x d_model)). results/bench/memory_cpu.md has the full-size table.
"""

import pytest

from fairseq_sparse.bench import memory
from fairseq_sparse.core.attention import attention_names
from fairseq_sparse.core.modules import function_in_chunks, fused_softmax

SCALE = 32  # (4096 x 512) / (512 x 128)


def test_every_function_stays_within_one_and_a_half_times_stock_memory(monkeypatch):
    """Bidirectional (the encoder's self-attention), as the criterion's command measures it."""
    monkeypatch.setitem(function_in_chunks.FUNCTION_CHUNK_ELEMENTS, "cpu", function_in_chunks.FUNCTION_CHUNK_ELEMENTS["cpu"] // SCALE)
    for budget in ("PATTERN_MASK_ELEMENTS", "SELECTION_CHUNK_ELEMENTS"):
        monkeypatch.setattr(fused_softmax, budget, getattr(fused_softmax, budget) // SCALE)
    gather_budget = memory.GATHER_CHUNK_ELEMENTS["cpu"] // SCALE
    monkeypatch.setitem(memory.GATHER_CHUNK_ELEMENTS, "cpu", gather_budget)
    tables = memory.main(["--threads", "1", "--lengths", "512", "--embed-dim", "128", "--heads", "8",
                          "--gather-chunk-elements", str(gather_budget), "--functions", *attention_names()])
    peaks = tables[512]
    stock = peaks["fairseq"]["forward+backward"]
    over = {name: round(p["forward+backward"] / stock, 2) for name, p in peaks.items() if p["forward+backward"] > 1.5 * stock}
    assert over == {}, f"forward + backward peak above 1.5x stock fairseq's ({stock:.2f} MiB): {over}"
