"""The decoding-step kernel equals the registered function of every method that declares it (under Triton's
interpreter on the CPU), the attention module takes it exactly where that function would run on one query
without weights, mask, dropout or gradient (compiled for every GPU architecture in test_shared_memory.py)."""

import pytest
import torch

from fairseq_sparse.bench.dispatch_counts import count
from fairseq_sparse.core.attention import DEFAULT_K, AttentionContext, attention_names, get_attention
from fairseq_sparse.core.kernels import decoding_step as kernel
from fairseq_sparse.core.kernels import device
from fairseq_sparse.core.modules.sparse_multihead_attention import SparseMultiheadAttention

pytestmark = pytest.mark.skipif(device.triton is None, reason="Triton is not installed (requirements.txt pins it)")
ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
WITH_KERNEL = [name for name in attention_names() if get_attention(name).decoding_kernel is not None]
KERNEL_OP = "fairseq_sparse.decoding_step"


def test_hard_retrieval_top_k_sparsemax_entmax15_and_every_rela_variant_declare_the_kernel():
    assert {"hard", "topk", "rela_g", "rela_i", "relu", "rela_g_gelu", "rela_g_leaky_relu", "sparsemax",
            "entmax15"} <= set(WITH_KERNEL)


def _reference(name, q, k, v, padding, counts, scaling, attended=DEFAULT_K):
    """The registered function on the scores the attention module computes for one query."""
    scores = torch.matmul(q * scaling, k.transpose(-1, -2)).float()
    mask = None if padding is None else padding[:, None, None, :]
    ctx = AttentionContext(k=attended, training=False, need_weights=False)
    if counts is not None and get_attention(name).supports_key_counts:
        ctx.key_counts = counts
    return get_attention(name).fn(scores, v, mask, ctx)[0]


@pytest.mark.parametrize("keys,head_dim", [(1, 16), (37, 24), (130, 16)])  # one key; odd dims; several key blocks
@pytest.mark.parametrize("name", WITH_KERNEL)
def test_the_kernel_equals_the_registered_function(name, keys, head_dim, fused):
    torch.manual_seed(keys + head_dim)
    batch, heads = 3, 2
    q = torch.randn(batch, heads, 1, head_dim, device=DEVICE)
    k = torch.randn(batch, heads, keys, head_dim, device=DEVICE)
    v = torch.randn(batch, heads, keys, head_dim, device=DEVICE)
    padding = torch.zeros(batch, keys, dtype=torch.bool, device=DEVICE)
    padding[0, : keys // 3] = True  # left padding, as fairseq pads a source
    padding[2] = True  # a query with no key reads a zero row
    counts = torch.randint(1, 4, (batch, 1, 1, keys), device=DEVICE).float()  # L0Drop's compressed memory
    scaling = head_dim ** -0.5
    for pad, cnt in ((None, None), (padding, None), (padding, counts)):
        expected = _reference(name, q, k, v, pad, cnt, scaling)
        got = kernel.decoding_step(q, k, v, pad, cnt, scaling, DEFAULT_K, kernel_mode(name))
        assert got.shape == expected.shape and got.dtype == v.dtype
        assert (got - expected).abs().max() <= 1e-5 * max(1.0, expected.abs().max()), (pad is None, cnt is None)
    assert torch.equal(kernel.decoding_step(q, k, v, padding, None, scaling, DEFAULT_K, kernel_mode(name))[2],
                       torch.zeros(heads, 1, head_dim, device=DEVICE))


def _rows_of_scores():
    """Score rows where a threshold is hard to find: ramps (the support shrinks a key at a time), near-equal
    peaks, one dominant key, scales from 0.01 to 100, up to 4,096 keys."""
    generator = torch.Generator().manual_seed(0)
    rows = [torch.linspace(0, 1, 50), torch.linspace(0, 3, 50), torch.tensor([1.0, 1.0 - 1e-6, 0.3, -2.0]),
            torch.tensor([5.0, 0.0, 0.0]), torch.full((7,), 0.25), torch.randn(4096, generator=generator) * 3]
    for scale in (0.01, 1.0, 100.0):
        rows.append(torch.randn(300, generator=generator) * scale)
    return rows


@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
def test_the_threshold_of_sparsemax_and_entmax_equals_the_packages(name, fused):
    """Scores set directly (the query is the first unit vector, the keys' first coordinate the scores): the
    output the package's sort gives, to float rounding."""
    for scores in _rows_of_scores():
        keys = scores.numel()
        q = torch.zeros(1, 1, 1, 16, device=DEVICE)
        q[..., 0] = 1.0
        k = torch.randn(1, 1, keys, 16, device=DEVICE)
        k[..., 0] = scores.to(DEVICE)
        v = torch.randn(1, 1, keys, 16, device=DEVICE)
        expected = _reference(name, q, k, v, None, None, 1.0)
        got = kernel.decoding_step(q, k, v, None, None, 1.0, DEFAULT_K, kernel_mode(name))
        assert (got - expected).abs().max() <= 1e-5 * max(1.0, expected.abs().max()), (keys, scores[:3])


def kernel_mode(name):
    return get_attention(name).decoding_kernel.keywords["mode"]


def test_tied_keys_go_to_the_first_of_them_across_blocks(fused):
    """Hard retrieval's argmax, like torch.argmax: the first of equal scores, also in a later key block."""
    head_dim, keys = 16, 150
    q = torch.randn(1, 1, 1, head_dim, device=DEVICE)
    k = torch.randn(1, 1, keys, head_dim, device=DEVICE) * 0.01
    v = torch.randn(1, 1, keys, head_dim, device=DEVICE)
    for first, second in ((3, 140), (70, 71), (66, 130)):
        tied = k.clone()
        tied[0, 0, first] = tied[0, 0, second] = q[0, 0, 0]
        got = kernel.decoding_step(q, tied, v, None, None, 1.0, DEFAULT_K, "argmax")
        assert torch.equal(got[0, 0, 0], v[0, 0, first]), (first, second)
        assert torch.equal(got, _reference("hard", q, tied, v, None, None, 1.0))


@pytest.mark.parametrize("attended", [1, 3, 8, 40])  # 40: more than the keys, every visible key kept
def test_top_k_keeps_every_key_tied_with_the_kth_and_reads_counts_as_places(attended, fused):
    head_dim, keys = 8, 20
    q = torch.ones(2, 1, 1, head_dim, device=DEVICE)
    levels = torch.tensor([5.0, 3.0, 3.0, 3.0, 1.0] * 4, device=DEVICE)  # runs of equal scores
    k = levels.view(1, 1, keys, 1).expand(2, 1, keys, head_dim) / head_dim
    v = torch.randn(2, 1, keys, head_dim, device=DEVICE)
    counts = torch.randint(1, 4, (2, 1, 1, keys), device=DEVICE).float()
    padding = torch.zeros(2, keys, dtype=torch.bool, device=DEVICE)
    padding[1, :7] = True
    for cnt in (None, counts):
        expected = _reference("topk", q, k, v, padding, cnt, 1.0, attended)
        got = kernel.decoding_step(q, k, v, padding, cnt, 1.0, attended, "topk")
        assert (got - expected).abs().max() <= 1e-5, cnt is None


def test_strided_caches_as_the_module_keeps_them(fused):
    """Keys of a cross-attention cache are a permuted view of the projected memory (not contiguous)."""
    memory = torch.randn(9, 2, 4 * 16, device=DEVICE)  # (S, B, E)
    k = memory.view(9, 2, 4, 16).permute(1, 2, 0, 3)  # (B, H, S, d_h), as _split_heads leaves it
    q = torch.randn(2, 4, 1, 16, device=DEVICE)
    for name in ("hard", "rela_g", "topk"):
        expected = _reference(name, q, k, k, None, None, 0.25)
        assert (kernel.decoding_step(q, k, k, None, None, 0.25, DEFAULT_K, kernel_mode(name)) - expected).abs().max() <= 1e-5


def _decode(module, steps, memory=None, memory_padding=None):
    """Outputs of ``steps`` incremental calls, (steps, B, E)."""
    state, outputs = {}, []
    with torch.no_grad():
        for step in steps:
            if memory is None:
                out, _ = module(step, step, step, incremental_state=state, need_weights=False)
            else:
                out, _ = module(step, memory, memory, key_padding_mask=memory_padding, incremental_state=state,
                                static_kv=True, need_weights=False)
            outputs.append(out)
    return torch.cat(outputs)


@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
@pytest.mark.parametrize("name", ["hard", "topk", "rela_g", "rela_g_gelu", "sparsemax", "entmax15"])
def test_the_module_decodes_with_the_kernel_as_with_the_reference(name, cross, fused):
    torch.manual_seed(5)
    embed, heads = 64, 4
    modules = {}
    for impl in ("auto", "reference"):
        torch.manual_seed(5)
        modules[impl] = SparseMultiheadAttention(embed, heads, attn_fn=name, attn_k=3, impl=impl, self_attention=not cross,
                                                 encoder_decoder_attention=cross).to(DEVICE).eval()
    steps = torch.randn(5, 1, 3, embed, device=DEVICE)  # 5 steps of (T=1, B=3, E)
    memory = torch.randn(11, 3, embed, device=DEVICE) if cross else None
    padding = None
    if cross:
        padding = torch.zeros(3, 11, dtype=torch.bool, device=DEVICE)
        padding[1, :4] = True
    got = _decode(modules["auto"], steps, memory, padding)
    expected = _decode(modules["reference"], steps, memory, padding)
    assert (got - expected).abs().max() <= 1e-5 * max(1.0, expected.abs().max())

    state = {}
    with torch.no_grad():
        step = steps[0]
        module = modules["auto"]
        call = (lambda: module(step, memory, memory, key_padding_mask=padding, incremental_state=state, static_kv=True,
                               need_weights=False)) if cross else (
            lambda: module(step, step, step, incremental_state=state, need_weights=False))
        call()
        counter = count(call)
    assert counter.by_operation.get(KERNEL_OP) == 1


def test_the_module_keeps_the_function_where_the_kernel_does_not_apply(fused):
    module = SparseMultiheadAttention(32, 2, attn_fn="hard", self_attention=True).to(DEVICE).eval()
    x = torch.randn(1, 2, 32, device=DEVICE)
    with torch.no_grad():
        weights_asked = count(lambda: module(x, x, x, incremental_state={}, need_weights=True))
        full_pass = count(lambda: module(torch.randn(4, 2, 32, device=DEVICE), None, None, need_weights=False))
        plain = count(lambda: module(x, x, x, incremental_state={}, need_weights=False))
    with torch.enable_grad():
        gradient = count(lambda: module(x, x, x, incremental_state={}, need_weights=False))
    module.train()
    with torch.no_grad():
        training = count(lambda: module(x, x, x, incremental_state={}, need_weights=False))
    for counter in (weights_asked, full_pass, gradient, training):
        assert KERNEL_OP not in counter.by_operation
    assert plain.by_operation.get(KERNEL_OP) == 1


def test_the_cpu_runs_the_function_unless_asked():
    module = SparseMultiheadAttention(32, 2, attn_fn="hard", self_attention=True).eval()
    x = torch.randn(1, 2, 32)
    with torch.no_grad():
        counter = count(lambda: module(x, x, x, incremental_state={}, need_weights=False))
    assert KERNEL_OP not in counter.by_operation


# Integer inputs only where the output is continuous in the scores: the step sums q k in a tree of its own (tl.sum),
# torch's matmul sequentially, and at d_h whose d_h^-0.5 is not a power of two the two round equal integer sums of
# fl(q_i d_h^-0.5) k_i differently in the last bit, so hard retrieval's and top-k's exact ties may split either
# way (as a GPU's reduction order may against cuBLAS); under the interpreter the sequence kernels' tl.dot is numpy's
# matmul, which sums as torch's does (test_sequence_numerics.py's ties).
HEAD_SIZE_CASES = [(name, integer) for name in ("hard", "topk", "rela_g", "entmax15")
                   for integer in ((False, True) if name in ("rela_g", "entmax15") else (False,))]


@pytest.mark.parametrize("head_dim", [24, 96, 128])
@pytest.mark.parametrize("name,integer", HEAD_SIZE_CASES, ids=lambda case: str(case))
def test_the_kernel_equals_the_function_at_head_sizes_of_every_tile(name, integer, head_dim, fused):
    """d_h whose d_h^-0.5 is not a power of two, with real inputs, and integer ones where no tie decides."""
    generator = torch.Generator().manual_seed(head_dim)
    shape = {"q": (3, 2, 1, head_dim), "k": (3, 2, 70, head_dim), "v": (3, 2, 70, head_dim)}
    if integer:
        q, k, v = (torch.randint(-2, 3, shape[x], generator=generator).float().to(DEVICE) for x in "qkv")
    else:
        q, k, v = (torch.randn(shape[x], generator=generator).to(DEVICE) for x in "qkv")
    padding = torch.zeros(3, 70, dtype=torch.bool, device=DEVICE)
    padding[0, :20] = True
    scaling = head_dim ** -0.5
    expected = _reference(name, q, k, v, padding, None, scaling)
    got = kernel.decoding_step(q, k, v, padding, None, scaling, DEFAULT_K, kernel_mode(name))
    assert (got - expected).abs().max() <= 1e-5 * max(1.0, expected.abs().max())
