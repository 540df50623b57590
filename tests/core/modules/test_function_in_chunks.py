"""The registered function in query chunks, recomputed in the backward pass, equals the plain call.

Every registered method without a selection (ReLA and its ablations, hard retrieval, the entmax
family) is compared in the module that runs it, with the chunk budget lowered so that a short
sequence is cut into several chunks: outputs and gradients of the input, of the projections and of
the method's own parameters (ReLA's norm, alpha-entmax's alphas), with padding on either side,
causal masks, queries with no key, key counts, attention dropout and hard retrieval's sampling.
"""

import pytest
import torch

from attention_cases import CASES, NAMES
from fairseq_sparse.core.attention import get_attention
from fairseq_sparse.core.modules import function_in_chunks
from fairseq_sparse.core.modules.sparse_multihead_attention import SparseMultiheadAttention

UNSELECTED = [name for name in NAMES if get_attention(name).selection is None]


def test_every_method_without_a_selection_is_covered():
    assert {"rela_g", "rela_i", "relu", "hard", "sparsemax", "entmax15", "entmax_alpha"} <= set(UNSELECTED)


@pytest.fixture
def chunked(monkeypatch):
    """A budget of 40 entries: 2 sentences x 4 heads x 9 keys is 72 a query, so one query a chunk."""
    monkeypatch.setitem(function_in_chunks.FUNCTION_CHUNK_ELEMENTS, "cpu", 40)
    calls = []
    original = function_in_chunks.checkpoint
    monkeypatch.setattr(function_in_chunks, "checkpoint", lambda *a, **kw: calls.append(1) or original(*a, **kw))
    return calls


def causal_mask(length):
    return torch.triu(torch.full((length, length), float("-inf")), 1)


def padding_of(kind: str, length: int) -> torch.Tensor:
    padding = torch.zeros(2, length, dtype=torch.bool)
    if kind == "left":
        padding[1, :3] = True
    elif kind == "right":
        padding[1, -3:] = True
    return padding


def outputs_and_gradients(module, seed, x, memory=None, **kwargs):
    torch.manual_seed(seed)
    inputs = x.clone().requires_grad_(True)
    keys = inputs if memory is None else memory
    out, _ = module(inputs, keys, keys, need_weights=False, **kwargs)
    (out * torch.linspace(-1, 1, out.size(-1))).sum().backward()
    return [out.detach(), inputs.grad] + [p.grad.clone() for p in module.parameters() if p.grad is not None]


def build(name, **kwargs):
    torch.manual_seed(0)
    module = SparseMultiheadAttention(16, 4, attn_fn=name, attn_k=CASES[name].k, **kwargs).train()
    return module


def compare(name, monkeypatch, chunked, module_kwargs, call_kwargs, x, memory=None, tolerance=1e-5):
    """The same module's outputs and gradients in chunks and (a budget no input reaches) in one call."""
    module = build(name, **module_kwargs)
    got = outputs_and_gradients(module, 3, x, memory, **call_kwargs)
    assert chunked, "the chunked path was not taken"
    module.zero_grad(set_to_none=True)
    monkeypatch.setitem(function_in_chunks.FUNCTION_CHUNK_ELEMENTS, "cpu", 10**9)
    expected = outputs_and_gradients(module, 3, x, memory, **call_kwargs)
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert (a - b).abs().max() <= tolerance * max(1.0, b.abs().max())


@pytest.mark.parametrize("padding", ["none", "left", "right"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("name", UNSELECTED)
def test_chunks_equal_the_plain_call(name, causal, padding, chunked, monkeypatch):
    hard_train = {"hard_train": "argmax"} if name == "hard" else {}  # sampling is checked below
    kwargs = dict(key_padding_mask=None if padding == "none" else padding_of(padding, 9),
                  attn_mask=causal_mask(9) if causal else None)
    compare(name, monkeypatch, chunked, dict(self_attention=True, **hard_train), kwargs, torch.randn(9, 2, 16))


@pytest.mark.parametrize("name", [n for n in UNSELECTED if get_attention(n).supports_key_counts])
def test_cross_attention_with_key_counts(name, chunked, monkeypatch):
    """L0Drop's compressed memory (a counted padding mask) in encoder-decoder attention."""
    memory = torch.randn(5, 2, 16)
    memory[0] = 0.0
    counts = torch.tensor([[3, 1, 1, 1, 0], [0, 1, 1, 1, 1]])
    hard_train = {"hard_train": "argmax"} if name == "hard" else {}
    monkeypatch.setitem(function_in_chunks.FUNCTION_CHUNK_ELEMENTS, "cpu", 2 * 4 * 5)
    compare(name, monkeypatch, chunked, dict(encoder_decoder_attention=True, kdim=16, vdim=16, **hard_train),
            dict(key_padding_mask=counts, static_kv=True), torch.randn(7, 2, 16), memory)


@pytest.mark.parametrize("name", UNSELECTED)
def test_a_query_with_no_key_gets_zero_output_and_finite_gradients(name, chunked, monkeypatch):
    hide_all = torch.zeros(9, 9)
    hide_all[4] = float("-inf")
    hard_train = {"hard_train": "argmax"} if name == "hard" else {}
    compare(name, monkeypatch, chunked, dict(self_attention=True, **hard_train), dict(attn_mask=hide_all), torch.randn(9, 2, 16))


@pytest.mark.parametrize("name", UNSELECTED)
def test_the_backward_pass_draws_dropout_and_samples_as_the_forward_pass_did(name, chunked, monkeypatch):
    """With attention dropout (and hard retrieval's sampled keys) the recomputation must see the
    forward pass's random numbers: gradients equal those of the same chunks kept by autograd."""
    module = build(name, self_attention=True, dropout=0.3)
    x = torch.randn(9, 2, 16)
    got = outputs_and_gradients(module, 5, x, attn_mask=causal_mask(9))
    assert chunked
    module.zero_grad(set_to_none=True)
    # the same chunks, without recomputation: autograd keeps each chunk's tensors
    monkeypatch.setattr(function_in_chunks, "checkpoint", lambda fn, *args, **kw: fn(*args))
    expected = outputs_and_gradients(module, 5, x, attn_mask=causal_mask(9))
    for a, b in zip(got, expected):
        assert (a - b).abs().max() <= 1e-5 * max(1.0, b.abs().max())
    assert not torch.equal(got[0], outputs_and_gradients(module, 6, x, attn_mask=causal_mask(9))[0]), "no randomness seen"


def test_inference_chunks_without_recomputation(chunked, monkeypatch):
    """Under no_grad (a long source at inference) the chunks bound memory and nothing is checkpointed."""
    module = build("rela_g", self_attention=True).eval()
    x = torch.randn(9, 2, 16)
    with torch.no_grad():
        out, _ = module(x, x, x, need_weights=False)
    assert not chunked
    monkeypatch.setitem(function_in_chunks.FUNCTION_CHUNK_ELEMENTS, "cpu", 10**9)
    with torch.no_grad():
        expected, _ = module(x, x, x, need_weights=False)
    assert (out - expected).abs().max() <= 1e-5


def test_sentence_level_batches_take_the_plain_call():
    """A sentence-level batch fits one chunk: no recomputation, the plain call."""
    q = torch.zeros(64, 8, 30, 64)
    assert function_in_chunks.function_chunks(q, q) is None
    long = torch.zeros(1, 8, 4096, 64)
    chunks = function_in_chunks.function_chunks(long, long)
    assert chunks[0] == slice(0, 16) and chunks[-1].stop == 4096 and len(chunks) == 256


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("name", ["rela_g", "hard", "entmax15"])
def test_half_precision_chunks_are_close_to_float32(name, dtype, chunked, monkeypatch):
    module = build(name, self_attention=True, hard_train="argmax").eval()
    x = torch.randn(9, 2, 16)
    with torch.enable_grad():
        expected, _ = module(x, x, x, attn_mask=causal_mask(9), need_weights=False)
    half = module.to(dtype)
    inputs = x.to(dtype).requires_grad_(True)
    out, _ = half(inputs, inputs, inputs, attn_mask=causal_mask(9).to(dtype), need_weights=False)
    out.float().sum().backward()
    assert chunked and out.dtype == dtype and torch.isfinite(out).all() and torch.isfinite(inputs.grad).all()
    assert (out.float() - expected).abs().max() <= 0.1


def test_attn_impl_reference_runs_the_registered_function_everywhere(monkeypatch, chunked):
    """--attn-impl reference: no chunks, no fused kernel, no gathered keys; the same result."""
    from fairseq_sparse.core.modules import fused_softmax

    calls = []
    original = fused_softmax.F.scaled_dot_product_attention
    monkeypatch.setattr(fused_softmax.F, "scaled_dot_product_attention", lambda *a, **kw: calls.append(1) or original(*a, **kw))
    x = torch.randn(9, 2, 16)
    for name in ("rela_g", "softmax", "topk"):
        auto = build(name, self_attention=True)
        reference = build(name, self_attention=True, impl="reference")
        assert "impl=reference" in repr(reference)
        assert reference.output_norm is None or not reference.output_norm.kernel
        expected = outputs_and_gradients(auto, 3, x, attn_mask=causal_mask(9))
        before = (len(chunked), len(calls))
        got = outputs_and_gradients(reference, 3, x, attn_mask=causal_mask(9))
        assert (len(chunked), len(calls)) == before, f"{name}: --attn-impl reference took a fast path"
        for a, b in zip(got, expected):
            assert (a - b).abs().max() <= 1e-5 * max(1.0, b.abs().max())
    assert chunked and calls, "auto took its fast paths"


@pytest.mark.parametrize("checkpoint_activations", [False, True], ids=["plain", "checkpoint-activations"])
def test_a_whole_model_in_chunks_equals_the_plain_model(checkpoint_activations, monkeypatch):
    """Every sublayer in chunks, also inside fairseq's --checkpoint-activations (its recomputation
    wraps ours): logits and every parameter's gradient as without chunks."""
    from helpers import build_model, random_batch

    results = []
    for budget in (10**9, 50):
        monkeypatch.setitem(function_in_chunks.FUNCTION_CHUNK_ELEMENTS, "cpu", budget)
        model = build_model(encoder_attn_fn="rela_g", decoder_attn_fn="entmax15", cross_attn_fn="hard", hard_train="argmax",
                            checkpoint_activations=checkpoint_activations, seed=3).train()
        logits, _ = model(**random_batch(lengths=[7, 4, 9], tgt_lengths=[6, 3, 5], seed=7))
        logits.float().logsumexp(-1).sum().backward()
        results.append((logits.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (plain, plain_grads), (chunked, chunked_grads) = results
    assert (plain - chunked).abs().max() <= 1e-5 and plain_grads.keys() == chunked_grads.keys()
    for name, grad in plain_grads.items():
        assert (grad - chunked_grads[name]).abs().max() <= 1e-4 * max(1.0, grad.abs().max()), name
