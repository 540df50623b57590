"""ReLA's sequence kernel equals the registered function of every method that declares it (outputs and gradients of
q, k and v, under Triton's interpreter on the CPU): padding, fairseq's future mask, L0Drop's key counts, queries
with no key, several blocks of queries and keys, and attention dropout with the kernel's own mask; the attention
module takes it exactly where it applies (compiled for every GPU architecture in test_shared_memory.py)."""

import pytest
import torch
from helpers import relatively_close

from fairseq_sparse.bench.dispatch_counts import count
from fairseq_sparse.core.attention import AttentionContext, attention_names, get_attention
from fairseq_sparse.core.kernels import device
from fairseq_sparse.core.kernels import rectified_attention as kernel
from fairseq_sparse.core.kernels import tiles
from fairseq_sparse.core.modules.sparse_multihead_attention import SparseMultiheadAttention

pytestmark = pytest.mark.skipif(device.triton is None, reason="Triton is not installed (requirements.txt pins it)")
ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
WITH_KERNEL = [name for name in attention_names()
               if getattr(get_attention(name).sequence_kernel, "func", None) is kernel.rectified_attention]
FORWARD_OP = "fairseq_sparse.rectified_attention"


def test_every_rela_variant_declares_the_kernel():
    assert set(WITH_KERNEL) == {"rela_g", "rela_i", "relu", "relu_rmsnorm", "rela_g_layernorm", "rela_g_gelu",
                                "rela_g_leaky_relu"}


def _reference(name, q, k, v, padding, counts, scaling, causal, keep=None, dropout_p=0.0):
    """The registered function on the scores the attention module computes; with ``keep``, dropout by that mask."""
    scores = torch.matmul(q * scaling, k.transpose(-1, -2)).float()
    mask = None if padding is None else padding[:, None, None, :]
    if causal:
        future = torch.ones(q.size(2), k.size(2), dtype=torch.bool, device=q.device).triu(1)[None, None]
        mask = future if mask is None else mask | future
    ctx = AttentionContext(training=True, need_weights=True)
    ctx.key_counts = counts
    out, weights = get_attention(name).fn(scores, v, mask, ctx)
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
    counts = torch.randint(1, 4, (batch, 1, 1, keys), device=DEVICE).float()  # L0Drop's compressed memory
    return q, k, v, padding, counts


def _gradients(output, grad, tensors):
    return torch.autograd.grad(output, tensors, grad)


# self-attention in one block; several blocks of queries and keys, odd head size; a short target against a long source
SHAPES = [(7, 7, 16), (70, 70, 24), (9, 131, 16)]


@pytest.mark.parametrize("queries,keys,head_dim", SHAPES)
@pytest.mark.parametrize("name", WITH_KERNEL)
def test_the_kernel_and_its_gradients_equal_the_registered_function(name, queries, keys, head_dim, fused):
    q, k, v, padding, counts = _inputs(3, 2, queries, keys, head_dim, seed=queries + keys)
    grad = torch.randn(3, 2, queries, head_dim, device=DEVICE)
    scaling = head_dim ** -0.5
    mode = get_attention(name).sequence_kernel.keywords["mode"]
    causal_cases = (False, True) if queries == keys else (False,)
    for causal in causal_cases:
        for pad, cnt in ((None, None), (padding, None), (padding, counts)):
            expected = _reference(name, q, k, v, pad, cnt, scaling, causal)
            got = kernel.rectified_attention(q, k, v, pad, cnt, scaling, causal, 0.0, mode=mode)
            assert got.shape == expected.shape and got.dtype == v.dtype
            case = (causal, pad is None, cnt is None)
            assert relatively_close(got, expected), case
            for got_grad, expected_grad in zip(_gradients(got, grad, (q, k, v)), _gradients(expected, grad, (q, k, v))):
                assert relatively_close(got_grad, expected_grad), case
    got = kernel.rectified_attention(q, k, v, padding, None, scaling, False, 0.0, mode=mode)
    assert torch.equal(got[-1], torch.zeros_like(got[-1]))  # no key: a zero row, as the registered function gives
    assert all(torch.equal(g[-1], torch.zeros_like(g[-1])) for g in _gradients(got, grad, (q, k, v)))


@pytest.mark.parametrize("name", ["rela_g", "rela_g_gelu"])
def test_dropout_draws_one_mask_for_the_forward_and_backward_passes(name, fused):
    """The kernel's output and gradients are the registered function's with the kernel's own dropout mask
    (``dropout_keep``, the same seed), which keeps about 1 - p of the weights and differs between calls."""
    queries, keys, head_dim, p = 70, 67, 16, 0.3
    q, k, v, padding, counts = _inputs(2, 3, queries, keys, head_dim, seed=1)
    grad = torch.randn(2, 3, queries, head_dim, device=DEVICE)
    mode = get_attention(name).sequence_kernel.keywords["mode"]
    torch.manual_seed(11)
    got = kernel.rectified_attention(q, k, v, padding, counts, 0.25, False, p, mode=mode)
    got_grads = _gradients(got, grad, (q, k, v))
    torch.manual_seed(11)
    keep = tiles.dropout_keep(tiles.dropout_seed(q.device), 2, 3, queries, keys, p)
    assert abs(keep.float().mean().item() - (1 - p)) < 0.02
    expected = _reference(name, q, k, v, padding, counts, 0.25, False, keep, p)
    assert relatively_close(got, expected)
    for got_grad, expected_grad in zip(got_grads, _gradients(expected, grad, (q, k, v))):
        assert relatively_close(got_grad, expected_grad)
    again = kernel.rectified_attention(q, k, v, padding, counts, 0.25, False, p, mode=mode)
    assert not torch.equal(again, got)  # each call draws its own mask


def test_the_module_keeps_its_other_paths_where_the_kernel_does_not_apply(fused):
    module = SparseMultiheadAttention(32, 2, attn_fn="rela_g", self_attention=True).to(DEVICE).train()
    x = torch.randn(6, 2, 32, device=DEVICE)
    bias = torch.randn(6, 6, device=DEVICE)  # an attention mask that is not fairseq's future mask
    weights_asked = count(lambda: module(x, x, x, need_weights=True))
    other_mask = count(lambda: module(x, x, x, attn_mask=bias, need_weights=False))
    plain = count(lambda: module(x, x, x, need_weights=False))
    for counter in (weights_asked, other_mask):
        assert FORWARD_OP not in counter.by_operation
    assert plain.by_operation.get(FORWARD_OP) == 1


def test_the_cpu_runs_the_function_unless_asked():
    module = SparseMultiheadAttention(32, 2, attn_fn="rela_g", self_attention=True).train()
    x = torch.randn(6, 2, 32)
    counter = count(lambda: module(x, x, x, need_weights=False)[0].sum().backward())
    assert FORWARD_OP not in counter.by_operation
