"""What the sequence kernels' conformance tests did not reach, under Triton's interpreter on the CPU: head sizes whose
d_h^-0.5 is not a power of two, with real and with integer inputs (exact ties of the k-th score), half precision held
to the registered function applied to float32 scores, offsets past 2^31, and the positions of the dropout stream."""

import pytest
import torch
from helpers import relatively_close

from fairseq_sparse.core.attention import AttentionContext, get_attention
from fairseq_sparse.core.kernels import device, tiles

pytestmark = pytest.mark.skipif(device.triton is None, reason="Triton is not installed (requirements.txt pins it)")
ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
ATTENDED = 4
# Half precision where the interpreter multiplies it (numpy has float16, not bfloat16); a GPU runs bfloat16.
HALF = torch.bfloat16 if ON_GPU else torch.float16


def _reference(name, q, k, v, padding, scaling, causal, float32_scores=False):
    """The registered function on the scores the attention module computes (``q * scaling`` in q's dtype, then its
    product with k); ``float32_scores``: that product in float32, as the kernels accumulate it."""
    scaled = q * scaling
    scores = (torch.matmul(scaled.float(), k.float().transpose(-1, -2)) if float32_scores
              else torch.matmul(scaled, k.transpose(-1, -2)).float())
    mask = None if padding is None else padding[:, None, None, :]
    if causal:
        future = torch.ones(q.size(2), k.size(2), dtype=torch.bool, device=q.device).triu(1)[None, None]
        mask = future if mask is None else mask | future
    return get_attention(name).fn(scores, v, mask, AttentionContext(k=ATTENDED, training=True))[0]


def _kernel(name, q, k, v, padding, scaling, causal):
    return get_attention(name).sequence_kernel(q, k, v, padding, None, scaling, causal, 0.0, ATTENDED)


def _inputs(head_dim, integer, seed, batch=2, heads=2, length=37, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    if integer:  # small integers: many keys whose products with a query are exactly equal
        q, k, v = (torch.randint(-2, 3, (batch, heads, length, head_dim), generator=generator).float() for _ in range(3))
    else:
        q, k, v = (torch.randn(batch, heads, length, head_dim, generator=generator) for _ in range(3))
    q, k, v = (x.to(device=DEVICE, dtype=dtype).requires_grad_() for x in (q, k, v))
    padding = torch.zeros(batch, length, dtype=torch.bool, device=DEVICE)
    padding[0, : length // 3] = True
    return q, k, v, padding


@pytest.mark.parametrize("integer", [False, True], ids=["real", "integer"])
@pytest.mark.parametrize("head_dim", [24, 96, 128])
@pytest.mark.parametrize("name", ["rela_g", "topk"])
def test_the_kernels_equal_the_function_at_head_sizes_of_every_tile(name, head_dim, integer, fused):
    """Head tiles of 32 and 128, d_h^-0.5 not a power of two; outputs and gradients, padded and causal."""
    q, k, v, padding = _inputs(head_dim, integer, seed=head_dim)
    scaling = head_dim ** -0.5
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    for pad, causal in ((padding, False), (None, True)):
        got, expected = _kernel(name, q, k, v, pad, scaling, causal), _reference(name, q, k, v, pad, scaling, causal)
        assert relatively_close(got, expected), (pad is None, causal)
        for got_grad, expected_grad in zip(torch.autograd.grad(got, (q, k, v), grad),
                                           torch.autograd.grad(expected, (q, k, v), grad)):
            assert relatively_close(got_grad, expected_grad, 5e-5), (pad is None, causal)


@pytest.mark.parametrize("head_dim", [24, 96])
def test_exact_ties_select_the_same_keys_as_the_function(head_dim, fused):
    """Integer queries and keys: many keys tie with the k-th score. The kernel scales q before its product with k, as
    the module does, so a tie is a tie on both paths; scaling the product instead (fl(n x s) against the sum of
    fl(q_i s) k_j) split ties the function kept, at head sizes whose d_h^-0.5 is not a power of two."""
    q, k, v, _ = _inputs(head_dim, True, seed=3, batch=4, heads=4, length=40)
    scaling = head_dim ** -0.5
    with torch.no_grad():
        got, expected = _kernel("topk", q, k, v, None, scaling, False), _reference("topk", q, k, v, None, scaling, False)
    assert relatively_close(got, expected)


@pytest.mark.parametrize("name", ["rela_g", "topk"])
def test_half_precision_equals_the_function_on_float32_scores(name, fused):
    """The kernels accumulate q k^T in float32 and never round the scores to half precision (the eager path does,
    and selects top-k's keys from the rounded scores): held to the registered function applied to float32 scores of
    the same half-precision q (scaled in half, as the module scales it), k and v."""
    q, k, v, padding = _inputs(64, False, seed=5, length=70, dtype=HALF)
    scaling = 64 ** -0.5
    with torch.no_grad():
        got = _kernel(name, q, k, v, padding, scaling, True)
        expected = _reference(name, q, k, v, padding, scaling, True, float32_scores=True)
    assert got.dtype == HALF
    assert relatively_close(got.float(), expected.float(), 4e-3)


def _huge_storage(elements: int, dtype) -> torch.Tensor:
    """A tensor of ``elements`` that is reserved but never written whole (the OS commits only the pages touched)."""
    try:
        return torch.empty(elements, dtype=dtype, device=DEVICE)
    except RuntimeError as error:  # a machine that cannot reserve it (no overcommit, or too small a GPU)
        pytest.skip(f"cannot reserve {elements * torch.finfo(dtype).bits // 8 / 2 ** 30:.0f} GiB: {error}")


@pytest.mark.parametrize("name", ["rela_g", "topk"])
def test_offsets_past_2_31_elements(name, fused):
    """q a view whose third sentence starts 2^31 elements past the first (sentence stride 2^30, an int32 index
    times an int32 stride wraps there), on 8 GiB of half precision of which a few pages are ever touched: the
    output and gradients equal those of the same q made contiguous."""
    batch, heads, length, head_dim = 3, 2, 9, 16
    stride = 2 ** 30
    base = 2 ** 31  # the first sentence 2^31 elements in, so that a wrapped offset still lands in the storage
    storage = _huge_storage(base + (batch - 1) * stride + heads * length * head_dim, HALF)
    values = torch.randn(batch, heads, length, head_dim, generator=torch.Generator().manual_seed(7)).to(DEVICE, HALF)
    q = storage.as_strided(values.shape, (stride, length * head_dim, head_dim, 1), base)
    q.copy_(values)
    storage[:base].view(-1)[: 2 ** 20].zero_()  # what a wrapped offset would read instead
    _, k, v, padding = _inputs(head_dim, False, seed=8, batch=batch, heads=heads, length=length, dtype=HALF)
    scaling = head_dim ** -0.5
    grad = torch.randn(values.shape, generator=torch.Generator().manual_seed(9)).to(DEVICE, HALF)
    q.requires_grad_()
    contiguous = values.clone().requires_grad_()
    got, expected = _kernel(name, q, k, v, padding, scaling, False), _kernel(name, contiguous, k, v, padding, scaling, False)
    assert torch.equal(got, expected)
    for got_grad, expected_grad in zip(torch.autograd.grad(got, (q, k, v), grad),
                                       torch.autograd.grad(expected, (contiguous, k, v), grad)):
        assert torch.equal(got_grad, expected_grad)


def _agreement(first: torch.Tensor, second: torch.Tensor) -> float:
    return (first == second).float().mean().item()


def test_the_dropout_stream_does_not_repeat_within_a_call(fused):
    """Entries T x S = 2^32 positions apart (query 0 and query 2^16 of 2^16 keys) draw independent masks: a 32-bit
    position query x S + key made them the same entry of the stream. Checked at the positions, without the mask."""
    seed = torch.tensor([12345], dtype=torch.int64, device=DEVICE)
    keys = torch.arange(2048, device=DEVICE)
    num_queries, num_keys = 2 ** 16 + 1, 2 ** 16
    rows = torch.zeros_like(keys)
    first = tiles.dropout_keep_at(seed, rows, torch.zeros_like(keys), keys, num_queries, num_keys, 0.5)
    wrapped = tiles.dropout_keep_at(seed, rows, torch.full_like(keys, 2 ** 16), keys, num_queries, num_keys, 0.5)
    assert 0.4 < first.float().mean().item() < 0.6
    assert _agreement(first, wrapped) < 0.6


def test_the_dropout_streams_of_adjacent_calls_and_rows_differ(fused):
    """Row r + 1 of a call with seed s and row r of the call with seed s + 1 draw independent masks (the seed was
    added to the row, so they were one stream), and so do the rows of one call."""
    keys = torch.arange(2048, device=DEVICE)
    zeros = torch.zeros_like(keys)
    seed = torch.tensor([777], dtype=torch.int64, device=DEVICE)
    this_call_next_row = tiles.dropout_keep_at(seed, zeros + 1, zeros, keys, 1, 2048, 0.5)
    next_call_this_row = tiles.dropout_keep_at(seed + 1, zeros, zeros, keys, 1, 2048, 0.5)
    this_call_this_row = tiles.dropout_keep_at(seed, zeros, zeros, keys, 1, 2048, 0.5)
    assert _agreement(this_call_next_row, next_call_this_row) < 0.6
    assert _agreement(this_call_next_row, this_call_this_row) < 0.6


def test_dropout_keep_at_reads_the_mask_the_kernels_draw(fused):
    """``dropout_keep_at`` is ``dropout_keep`` (which the kernels' dropout tests compare with) at given positions."""
    seed = tiles.dropout_seed(torch.device(DEVICE))
    batch, heads, num_queries, num_keys = 2, 3, 70, 67
    keep = tiles.dropout_keep(seed, batch, heads, num_queries, num_keys, 0.3)
    rows, queries, keys = (index.reshape(-1) for index in torch.meshgrid(
        torch.arange(batch * heads, device=DEVICE), torch.arange(num_queries, device=DEVICE),
        torch.arange(num_keys, device=DEVICE), indexing="ij"))
    at = tiles.dropout_keep_at(seed, rows, queries, keys, num_queries, num_keys, 0.3)
    assert torch.equal(at, keep.reshape(-1))


TABLE_BLOCKS = sorted({(entry.block_queries, entry.block_keys) for table in tiles.SEQUENCE_TILES.values()
                       for entry in table.values() if entry is not None})


@pytest.mark.parametrize("blocks", TABLE_BLOCKS, ids=lambda blocks: "x".join(map(str, blocks)))
@pytest.mark.parametrize("name", ["rela_g", "topk"])
def test_every_block_size_of_the_table_computes_the_same(name, blocks, fused, monkeypatch):
    """The blocks a smaller card gets (queries and keys per block unequal, 16 to 64), run under the interpreter in
    place of its 64 x 64: outputs and gradients, padded and causal (the causal walks start and stop at block
    boundaries of either size)."""
    monkeypatch.setattr(tiles, "INTERPRETER_TILES", tiles.Tiles(*blocks))
    q, k, v, padding = _inputs(24, False, seed=11, length=45)
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(12)).to(DEVICE)
    for pad, causal in ((padding, False), (padding, True)):
        got, expected = _kernel(name, q, k, v, pad, 24 ** -0.5, causal), _reference(name, q, k, v, pad, 24 ** -0.5, causal)
        assert relatively_close(got, expected), causal
        for got_grad, expected_grad in zip(torch.autograd.grad(got, (q, k, v), grad),
                                           torch.autograd.grad(expected, (q, k, v), grad)):
            assert relatively_close(got_grad, expected_grad, 5e-5), causal


@pytest.mark.skipif(ON_GPU, reason="records the interpreter's launches")
@pytest.mark.parametrize("name", ["rela_g", "topk"])
def test_sentences_times_heads_go_on_the_grid_axis_without_a_65535_cap(name, fused, monkeypatch):
    """4,100 sentences x 16 heads = 65,600 programs per block of queries: CUDA caps grid axes 1 and 2 at 65,535, so
    they go on axis 0 (2^31 - 1), for the forward and both backward kernels. The launches are recorded, not run."""
    from triton.runtime.interpreter import InterpretedFunction

    grids = []

    def record(self, *args, grid, warmup, **kwargs):
        grids.append((self.fn.__name__, tuple(grid)))

    monkeypatch.setattr(InterpretedFunction, "run", record)
    q, k, v = (torch.zeros(4100, 16, 2, 16, device=DEVICE, requires_grad=True) for _ in range(3))
    out = _kernel(name, q, k, v, None, 0.25, False)
    torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    assert len(grids) == 3, grids
    assert all(grid[0] == 4100 * 16 and all(size <= 65535 for size in grid[1:]) for _, grid in grids), grids
