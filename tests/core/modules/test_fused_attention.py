"""The fused path (scaled_dot_product_attention over a method's selection) equals the registered function.

Every registered method with a selection (and Top-k (OOW) with its window set: ``attention_cases.ROWS``)
is compared, in every sublayer it may sit in,
against the same module with the selection removed (which runs the function over float32
scores): outputs and gradients to float tolerance, with padding, causal masks, incremental
decoding, key counts, query chunking and queries that have no key left.
"""

import dataclasses

import pytest
import torch

from attention_cases import ROWS, case_of, function_of, model_options, module_options
from fairseq_sparse.core.attention import AttentionContext, get_attention
from fairseq_sparse.core.modules import attention_masks, fused_softmax
from fairseq_sparse.core.modules.sparse_multihead_attention import SparseMultiheadAttention
from helpers import build_model, random_batch

FUSED = [name for name in ROWS if get_attention(function_of(name)).selection is not None]
SUBLAYERS = ("encoder", "decoder", "cross")
GRID = [(name, sublayer) for name in FUSED for sublayer in SUBLAYERS if not (sublayer == "cross" and case_of(name).self_only)]


def unfused(module: torch.nn.Module) -> torch.nn.Module:
    """The same weights, every attention module running its registered function."""
    for m in module.modules():
        if isinstance(m, SparseMultiheadAttention):
            m.spec = dataclasses.replace(m.spec, selection=None)
    return module


def test_the_methods_the_issue_names_take_the_fused_path():
    assert {"softmax", "topk", "block", "window", "dilated", "global", "random", "bigbird", "topk_oow",
            "topk_oow:window"} <= set(FUSED)


def assert_training_pass_equals_the_function_path(name, sublayer):
    """A model with ``name`` in ``sublayer``: logits and every parameter's gradient of a training pass
    equal those of the same model running the registered function."""
    batch = random_batch(lengths=[7, 4, 9], tgt_lengths=[6, 3, 5], seed=7)
    results = []
    for make in (lambda m: m, unfused):
        model = make(build_model(**model_options(name, sublayer), seed=3)).train()
        logits, _ = model(**batch)
        logits.float().logsumexp(-1).sum().backward()
        results.append((logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (fused_logits, fused_grads), (plain_logits, plain_grads) = results
    assert (fused_logits - plain_logits).abs().max() <= 1e-5
    assert fused_grads.keys() == plain_grads.keys()
    for key in plain_grads:
        assert (fused_grads[key] - plain_grads[key]).abs().max() <= 1e-4 * max(1.0, plain_grads[key].abs().max()), key


@pytest.mark.parametrize("name,sublayer", GRID)
def test_model_outputs_and_gradients_equal_the_function_path(name, sublayer):
    assert_training_pass_equals_the_function_path(name, sublayer)


@pytest.mark.parametrize("name,sublayer", GRID)
def test_incremental_decoding_equals_the_fused_full_pass(name, sublayer):
    """Incremental steps (one query a call: the registered function) against the full pass
    (several queries: the fused path) of the same model, in every layer but the alignment one."""
    assert_incremental_decoding_equals_the_full_pass(name, sublayer)


def assert_incremental_decoding_equals_the_full_pass(name, sublayer):
    model = build_model(**model_options(name, sublayer), seed=4).eval()
    batch = random_batch(lengths=[6, 8], tgt_lengths=[5, 5], seed=8)
    with torch.no_grad():
        expected, _ = model(**batch)
        encoder_out = model.encoder(batch["src_tokens"], src_lengths=batch["src_lengths"])
        state, steps = {}, []
        for t in range(batch["prev_output_tokens"].size(1)):
            steps.append(model.decoder(batch["prev_output_tokens"][:, : t + 1], encoder_out=encoder_out, incremental_state=state)[0])
    assert (torch.cat(steps, dim=1) - expected).abs().max() <= 1e-5


def module_pair(name, seed=0, **kwargs):
    torch.manual_seed(seed)
    fused = SparseMultiheadAttention(16, 4, **module_options(name), **kwargs)
    plain = unfused(SparseMultiheadAttention(16, 4, **module_options(name), **kwargs))
    plain.load_state_dict(fused.state_dict())
    return fused, plain


def causal_mask(length):
    return torch.triu(torch.full((length, length), float("-inf")), 1)


@pytest.mark.parametrize("name", FUSED)
def test_query_chunks_give_the_unchunked_result(name, monkeypatch):
    """A selection computed a few queries at a time (long sequences) selects the same keys."""
    fused, plain = module_pair(name, self_attention=True)
    x = torch.randn(11, 2, 16, requires_grad=True)
    padding = torch.zeros(2, 11, dtype=torch.bool)
    padding[1, :3] = True
    expected, _ = plain(x, x, x, key_padding_mask=padding, attn_mask=causal_mask(11), need_weights=False)
    # one query a chunk (2 x 4 x 11 entries each)
    monkeypatch.setattr(fused_softmax, "SELECTION_CHUNK_ELEMENTS", 2 * 11 * 3)
    monkeypatch.setattr(fused_softmax, "PATTERN_MASK_ELEMENTS", 0)  # patterns chunked too
    out, _ = fused(x, x, x, key_padding_mask=padding, attn_mask=causal_mask(11), need_weights=False)
    assert (out - expected).abs().max() <= 1e-5


@pytest.mark.parametrize("name", [n for n in FUSED if get_attention(function_of(n)).supports_key_counts])
def test_key_counts_on_the_fused_path(name):
    """L0Drop's compressed memory: log counts enter the kernel as an additive mask."""
    fused, plain = module_pair(name, encoder_decoder_attention=True, kdim=16, vdim=16)
    query, memory = torch.randn(3, 2, 16), torch.randn(5, 2, 16)
    memory[0] = 0.0  # the zero slot standing for pruned encodings
    counts = torch.tensor([[3, 1, 1, 1, 0], [0, 1, 1, 1, 1]])  # a counted padding mask
    outputs = []
    for module in (fused, plain):
        outputs.append(module(query, memory, memory, key_padding_mask=counts, need_weights=False, static_kv=True)[0])
    assert (outputs[0] - outputs[1]).abs().max() <= 1e-5


@pytest.mark.parametrize("name", FUSED)
def test_a_query_with_no_key_gets_zero_output_and_finite_gradients(name):
    fused, plain = module_pair(name, self_attention=True)
    x = torch.randn(4, 2, 16, requires_grad=True)
    hide_all = torch.zeros(4, 4)
    hide_all[1] = float("-inf")  # query 1 sees nothing
    out, _ = fused(x, x, x, attn_mask=hide_all, need_weights=False)
    expected, _ = plain(x, x, x, attn_mask=hide_all, need_weights=False)
    assert (out - expected).abs().max() <= 1e-5
    # output 0 before the output projection: out_proj's bias exactly
    assert torch.allclose(out[1], fused.out_proj.bias.expand(2, 16))
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("name", FUSED)
def test_half_precision_fused_path_is_close_to_float32(name, dtype):
    fused, _ = module_pair(name, self_attention=True)
    reference, _ = module_pair(name, self_attention=True)
    fused = fused.to(dtype)
    x = torch.randn(9, 2, 16)
    expected, _ = reference(x, x, x, attn_mask=causal_mask(9), need_weights=False)
    out, _ = fused(x.to(dtype), x.to(dtype), x.to(dtype), attn_mask=causal_mask(9).to(dtype), need_weights=False)
    assert out.dtype == dtype and torch.isfinite(out).all()
    assert (out.float() - expected).abs().max() <= 0.1


def test_weights_requested_take_the_function_path():
    calls = []
    module = SparseMultiheadAttention(16, 4, attn_fn="softmax", self_attention=True)
    original = module.spec.fn
    module.spec = dataclasses.replace(module.spec, fn=lambda *a: calls.append(1) or original(*a))
    x = torch.randn(3, 1, 16)
    module(x, x, x, need_weights=False)
    assert not calls
    _, weights = module(x, x, x, need_weights=True)
    assert calls and weights.shape == (1, 3, 3)


def test_context_positions_are_cut_to_the_chunk():
    ctx = AttentionContext(query_positions=torch.arange(6).view(1, 1, 6), key_positions=torch.arange(6).view(1, 1, 6))
    part = attention_masks.query_rows_of_context(ctx, slice(2, 4))
    assert part.query_positions.tolist() == [[[2, 3]]] and torch.equal(part.key_positions, ctx.key_positions)


@pytest.mark.parametrize("name", [n for n in FUSED if get_attention(function_of(n)).selection_reads_scores])
def test_chunked_selection_reproduces_attention_dropout_and_its_gradients(name):
    """With attention dropout the chunked path drops the same weights as the function (same
    random stream, one chunk) and its backward reuses that dropout mask."""
    fused, plain = module_pair(name, self_attention=True, dropout=0.3)
    fused.train(), plain.train()
    x = torch.randn(6, 2, 16)
    results = []
    for module in (fused, plain):
        torch.manual_seed(11)
        inputs = x.clone().requires_grad_(True)
        out, _ = module(inputs, inputs, inputs, attn_mask=causal_mask(6), need_weights=False)
        (out * torch.linspace(-1, 1, 16)).sum().backward()
        results.append((out.detach(), inputs.grad, module.q_proj.weight.grad, module.v_proj.weight.grad))
    for got, expected in zip(*results):
        assert (got - expected).abs().max() <= 1e-5


def test_softmax_never_takes_the_chunked_or_gathered_path(monkeypatch):
    """softmax's selection is the mask itself: always the fused kernel, at any length."""
    monkeypatch.setattr(fused_softmax, "PATTERN_MASK_ELEMENTS", 0)
    monkeypatch.setattr(fused_softmax, "SELECTION_CHUNK_ELEMENTS", 1)
    calls = []
    for name in ("SelectedSoftmaxInChunks", "GatheredSoftmax"):
        function = getattr(fused_softmax, name)
        monkeypatch.setattr(function, "apply", lambda *a, original=function.apply: calls.append(1) or original(*a))
    x = torch.randn(6, 2, 16)
    SparseMultiheadAttention(16, 4, attn_fn="softmax", self_attention=True)(x, x, x, need_weights=False)
    assert not calls
    SparseMultiheadAttention(16, 4, attn_fn="window", attn_k=2, self_attention=True)(x, x, x, need_weights=False)
    assert calls


def test_a_plain_causal_mask_goes_to_the_kernel_as_is_causal(monkeypatch):
    """fairseq's float future mask without padding: the kernel's is_causal, same outputs and gradients."""
    fused, plain = module_pair("softmax", self_attention=True)
    seen = []
    original = fused_softmax.F.scaled_dot_product_attention
    monkeypatch.setattr(fused_softmax.F, "scaled_dot_product_attention",
                        lambda *a, **kw: seen.append((kw["attn_mask"], kw["is_causal"])) or original(*a, **kw))
    x = torch.randn(7, 2, 16)
    results = []
    for module in (fused, plain):
        inputs = x.clone().requires_grad_(True)
        out, _ = module(inputs, inputs, inputs, attn_mask=causal_mask(7), need_weights=False)
        out.sum().backward()
        results.append((out.detach(), inputs.grad))
    assert seen == [(None, True)]
    assert (results[0][0] - results[1][0]).abs().max() <= 1e-5 and (results[0][1] - results[1][1]).abs().max() <= 1e-5
