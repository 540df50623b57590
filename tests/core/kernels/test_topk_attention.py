"""Top-k's sequence kernel equals the registered function (outputs and gradients of q, k and v, under Triton's
interpreter on the CPU): padding, fairseq's future mask, queries with fewer than k keys or none, keys tied with
the k-th score, several blocks of queries and keys, k from 1 to more than the keys, and attention dropout with the
kernel's own mask; the attention module takes it exactly where it applies (compiled for every GPU architecture in
test_shared_memory.py)."""

import pytest
import torch
from helpers import relatively_close

from fairseq_sparse.bench.dispatch_counts import count
from fairseq_sparse.core.attention import AttentionContext, get_attention
from fairseq_sparse.core.kernels import device, tiles
from fairseq_sparse.core.kernels import topk_attention as kernel
from fairseq_sparse.core.modules.sparse_multihead_attention import SparseMultiheadAttention

pytestmark = pytest.mark.skipif(device.triton is None, reason="Triton is not installed (requirements.txt pins it)")
ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
FORWARD_OP = "fairseq_sparse.topk_attention"


def test_top_k_declares_the_kernel():
    spec = get_attention("topk")
    assert spec.sequence_kernel is kernel.topk_attention and spec.sequence_kernel_takes is kernel.takes_kernel


def _reference(q, k, v, padding, scaling, causal, attended, keep=None, dropout_p=0.0):
    """The registered function on the scores the attention module computes; with ``keep``, dropout by that mask."""
    scores = torch.matmul(q * scaling, k.transpose(-1, -2)).float()
    mask = None if padding is None else padding[:, None, None, :]
    if causal:
        future = torch.ones(q.size(2), k.size(2), dtype=torch.bool, device=q.device).triu(1)[None, None]
        mask = future if mask is None else mask | future
    out, weights = get_attention("topk").fn(scores, v, mask, AttentionContext(k=attended, training=True))
    if keep is None:
        return out
    return torch.matmul((weights * keep / (1 - dropout_p)).to(v.dtype), v)


def _inputs(batch, heads, queries, keys, head_dim, seed):
    torch.manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, length, head_dim, device=DEVICE, requires_grad=True)
               for length in (queries, keys, keys))
    padding = torch.zeros(batch, keys, dtype=torch.bool, device=DEVICE)
    padding[0, : keys // 3] = True  # left padding, as fairseq pads a source
    padding[-1] = True  # a sentence with no key: zero rows, zero gradients
    return q, k, v, padding


def _assert_equal_to_reference(q, k, v, padding, scaling, causal, attended):
    grad = torch.randn(q.shape, device=DEVICE)
    expected = _reference(q, k, v, padding, scaling, causal, attended)
    got = kernel.topk_attention(q, k, v, padding, None, scaling, causal, 0.0, attended)
    assert got.shape == expected.shape and got.dtype == v.dtype
    assert relatively_close(got, expected)
    for got_grad, expected_grad in zip(torch.autograd.grad(got, (q, k, v), grad),
                                       torch.autograd.grad(expected, (q, k, v), grad)):
        assert relatively_close(got_grad, expected_grad)


# one block; several blocks of queries and keys with an odd head size; a short target against a long source
SHAPES = [(7, 7, 16), (70, 70, 24), (9, 131, 16)]


@pytest.mark.parametrize("attended", [1, 3, 8])
@pytest.mark.parametrize("queries,keys,head_dim", SHAPES)
def test_the_kernel_and_its_gradients_equal_the_registered_function(queries, keys, head_dim, attended, fused):
    q, k, v, padding = _inputs(3, 2, queries, keys, head_dim, seed=queries + keys + attended)
    for causal in ((False, True) if queries == keys else (False,)):
        for pad in (None, padding):
            _assert_equal_to_reference(q, k, v, pad, head_dim ** -0.5, causal, attended)
    got = kernel.topk_attention(q, k, v, padding, None, head_dim ** -0.5, False, 0.0, attended)
    assert torch.equal(got[-1], torch.zeros_like(got[-1]))  # no key: a zero row, as the registered function gives


def test_a_k_beyond_the_keys_keeps_every_visible_key(fused):
    q, k, v, padding = _inputs(3, 2, 7, 7, 16, seed=3)
    for causal in (False, True):
        _assert_equal_to_reference(q, k, v, padding, 0.25, causal, 9)
    assert not kernel.takes_kernel(None, kernel.MAX_K + 1) and not kernel.takes_kernel(torch.ones(1, 1, 1, 7), 8)


def test_every_key_tied_with_the_kth_score_is_kept_across_key_blocks(fused):
    """Scores on a coarse grid: many keys, some in other blocks of 64, tie with the k-th largest."""
    torch.manual_seed(2)
    q = torch.ones(2, 2, 40, 16, device=DEVICE, requires_grad=True)
    levels = torch.randint(0, 4, (2, 2, 150, 1), device=DEVICE).float()
    k = (levels.expand(2, 2, 150, 16) / 16).requires_grad_()
    v = torch.randn(2, 2, 150, 16, device=DEVICE, requires_grad=True)
    for attended in (1, 5, 8):
        _assert_equal_to_reference(q, k, v, None, 1.0, False, attended)


def test_dropout_draws_one_mask_for_the_forward_and_backward_passes(fused):
    queries, keys, head_dim, p = 70, 67, 16, 0.3
    q, k, v, padding = _inputs(2, 3, queries, keys, head_dim, seed=1)
    grad = torch.randn(2, 3, queries, head_dim, device=DEVICE)
    torch.manual_seed(11)
    got = kernel.topk_attention(q, k, v, padding, None, 0.25, False, p, 8)
    got_grads = torch.autograd.grad(got, (q, k, v), grad)
    torch.manual_seed(11)
    keep = tiles.dropout_keep(tiles.dropout_seed(q.device), 2, 3, queries, keys, p)
    expected = _reference(q, k, v, padding, 0.25, False, 8, keep, p)
    assert relatively_close(got, expected)
    for got_grad, expected_grad in zip(got_grads, torch.autograd.grad(expected, (q, k, v), grad)):
        assert relatively_close(got_grad, expected_grad)


def test_the_module_keeps_its_other_paths_where_the_kernel_does_not_apply(fused):
    module = SparseMultiheadAttention(32, 2, attn_fn="topk", attn_k=3, self_attention=True).to(DEVICE).train()
    x = torch.randn(6, 2, 32, device=DEVICE)
    counts = torch.randint(1, 3, (2, 6), device=DEVICE)  # L0Drop's counted memory: a key fills c of the k places
    wide = SparseMultiheadAttention(32, 2, attn_fn="topk", attn_k=kernel.MAX_K + 1, self_attention=True).to(DEVICE)
    weights_asked = count(lambda: module(x, x, x, need_weights=True))
    counted = count(lambda: module(x, x, x, key_padding_mask=counts, need_weights=False))
    too_many = count(lambda: wide(x, x, x, need_weights=False))
    plain = count(lambda: module(x, x, x, need_weights=False))
    for counter in (weights_asked, counted, too_many):
        assert FORWARD_OP not in counter.by_operation
    assert plain.by_operation.get(FORWARD_OP) == 1
