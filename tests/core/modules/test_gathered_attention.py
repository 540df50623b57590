"""The gathered path (a selection's keys gathered, top-k and the patterns at length) equals the registered function.

Thresholds are lowered so that short test sequences take the path a document-length one takes,
and chunks are made small so that every test runs several of them. Every registered method
with a selection (but softmax, whose selection is the mask), and Top-k (OOW) with its window set, is
compared against the same module running its registered function: outputs and gradients to float tolerance, with
padding on either side, causal masks, ties, queries with no key, attention dropout, half
precision, and in every sublayer of a model with incremental decoding.
"""

import pytest
import torch

from attention_cases import CASES, case_of, function_of, module_options
from fairseq_sparse.core.attention import functions
from fairseq_sparse.core.modules import attention_masks, fused_softmax, gathered_attention, sparse_multihead_attention
from test_fused_attention import (FUSED, assert_incremental_decoding_equals_the_full_pass,
                                  assert_training_pass_equals_the_function_path, causal_mask, module_pair, unfused)

GATHERED = [name for name in FUSED if name != "softmax"]
SUBLAYERS = ("encoder", "decoder", "cross")
GRID = [(name, sublayer) for name in GATHERED for sublayer in SUBLAYERS if not (sublayer == "cross" and case_of(name).self_only)]


@pytest.fixture
def gathered(monkeypatch):
    """Send every length to the gathered path, in chunks of a few queries; count its calls."""
    monkeypatch.setattr(fused_softmax, "SCORED_GATHER_FROM_KEYS", 1)
    monkeypatch.setattr(fused_softmax, "PATTERN_MASK_ELEMENTS", 0)
    monkeypatch.setitem(gathered_attention.GATHER_CHUNK_ELEMENTS, "cpu", 300)
    calls = []
    original = gathered_attention.GatheredSoftmax.apply
    monkeypatch.setattr(fused_softmax.GatheredSoftmax, "apply", lambda *a: calls.append(1) or original(*a))
    return calls


def padding_of(kind: str, length: int) -> torch.Tensor:
    padding = torch.zeros(3, length, dtype=torch.bool)
    if kind == "left":  # fairseq's sources
        padding[1, :4], padding[2, :1] = True, True
    elif kind == "right":  # fairseq's targets
        padding[1, -4:], padding[2, -1:] = True, True
    return padding


def outputs_and_gradients(module, x, **kwargs):
    inputs = x.clone().requires_grad_(True)
    out, _ = module(inputs, inputs, inputs, need_weights=False, **kwargs)
    (out * torch.linspace(-1, 1, out.size(-1))).sum().backward()
    return [out.detach(), inputs.grad] + [p.grad for p in module.parameters() if p.grad is not None]


@pytest.mark.parametrize("padding", ["none", "left", "right"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("k", [1, 2, 5])
@pytest.mark.parametrize("name", GATHERED)
def test_gathered_path_equals_the_function_path(name, k, causal, padding, gathered):
    """Every query, padding queries included, with its outputs and the gradients of input and weights."""
    torch.manual_seed(k)
    fused = sparse_multihead_attention.SparseMultiheadAttention(16, 4, **module_options(name, k), self_attention=True)
    plain = unfused(sparse_multihead_attention.SparseMultiheadAttention(16, 4, **module_options(name, k), self_attention=True))
    plain.load_state_dict(fused.state_dict())
    x = torch.randn(13, 3, 16)
    kwargs = dict(key_padding_mask=None if padding == "none" else padding_of(padding, 13),
                  attn_mask=causal_mask(13) if causal else None)
    got, expected = outputs_and_gradients(fused, x, **kwargs), outputs_and_gradients(plain, x, **kwargs)
    assert gathered, "the gathered path was not taken"
    for a, b in zip(got, expected):
        assert (a - b).abs().max() <= 1e-5


@pytest.mark.parametrize("name", [n for n in GATHERED if function_of(n) in ("topk", "topk_oow")])
def test_ties_at_the_kth_score_are_all_kept(name, gathered):
    """Equal scores (queries of zero): every key tied with the k-th is attended, as topk_mask keeps them."""
    fused, plain = module_pair(name, self_attention=True)
    for module in (fused, plain):
        with torch.no_grad():
            module.q_proj.weight.zero_(), module.q_proj.bias.zero_()
    x = torch.randn(9, 2, 16)
    got = outputs_and_gradients(fused, x, attn_mask=causal_mask(9))
    expected = outputs_and_gradients(plain, x, attn_mask=causal_mask(9))
    assert gathered
    for a, b in zip(got, expected):
        assert (a - b).abs().max() <= 1e-5


@pytest.mark.parametrize("name", GATHERED)
def test_a_query_with_no_key_gets_zero_output_and_finite_gradients(name, gathered):
    """Left padding under a causal mask: the padding queries see no key at all."""
    fused, plain = module_pair(name, self_attention=True)
    x = torch.randn(7, 3, 16)
    kwargs = dict(key_padding_mask=padding_of("left", 7), attn_mask=causal_mask(7))
    got, expected = outputs_and_gradients(fused, x, **kwargs), outputs_and_gradients(plain, x, **kwargs)
    assert gathered
    assert torch.allclose(got[0][:4, 1], fused.out_proj.bias.expand(4, 16))  # output 0 before out_proj
    assert all(torch.isfinite(g).all() for g in got[1:])
    for a, b in zip(got, expected):
        assert (a - b).abs().max() <= 1e-5


@pytest.mark.parametrize("name", GATHERED)
def test_attention_dropout_drops_selected_weights_and_its_backward_reuses_the_draw(name, gathered, monkeypatch):
    """The gathered path draws one keep bit per selected key; the function path dropping the same
    (query, key) weights gives the same outputs and gradients."""
    p = 0.4
    fused, plain = module_pair(name, self_attention=True, dropout=p)
    fused.train(), plain.train()
    draws, selections = [], []
    original_keep, original_slices = gathered_attention.dropout_keep, gathered_attention._slices

    def recording_keep(weights, p):
        draws.append(original_keep(weights, p))
        return draws[-1]

    def recording_slices(*args):
        parts = original_slices(*args)
        selections.extend(parts)
        return parts

    monkeypatch.setattr(gathered_attention, "dropout_keep", recording_keep)
    monkeypatch.setattr(gathered_attention, "_slices", recording_slices)
    x = torch.randn(11, 2, 16)
    got = outputs_and_gradients(fused, x, attn_mask=causal_mask(11))
    assert gathered and len(draws) == len(selections) > 1
    keep = torch.ones(2, 4, 11, 11)
    for (rows, selection), kept in zip(selections, draws):
        dropped = (~kept & ~selection.empty).float()  # empty slots repeat a key: they must not drop it
        indices = selection.indices.expand(kept.shape)
        keep[:, :, rows].scatter_reduce_(-1, indices, 1.0 - dropped, reduce="amin")
    assert 0 < (keep == 0).sum()
    # the function path drops through attention.functions.attention_dropout: the same weights, fixed
    monkeypatch.setattr(functions, "attention_dropout", lambda weights, ctx: weights * keep / (1.0 - p))
    expected = outputs_and_gradients(plain, x, attn_mask=causal_mask(11))
    for a, b in zip(got, expected):
        assert (a - b).abs().max() <= 1e-5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("name", GATHERED)
def test_half_precision_gathered_path_is_close_to_float32(name, dtype, gathered):
    fused, reference = module_pair(name, self_attention=True)
    x = torch.randn(9, 2, 16)
    expected, _ = reference(x, x, x, attn_mask=causal_mask(9), need_weights=False)
    fused = fused.to(dtype)
    inputs = x.to(dtype).requires_grad_(True)
    out, _ = fused(inputs, inputs, inputs, attn_mask=causal_mask(9).to(dtype), need_weights=False)
    out.float().sum().backward()
    assert gathered and out.dtype == dtype and torch.isfinite(out).all() and torch.isfinite(inputs.grad).all()
    assert (out.float() - expected).abs().max() <= 0.1


@pytest.mark.parametrize("name,sublayer", GRID)
def test_model_outputs_gradients_and_incremental_decoding_on_the_gathered_path(name, sublayer, gathered):
    """A whole model: its training pass equals the function path's, and incremental decoding (one
    query a call: the registered function) equals its full pass (the gathered path)."""
    assert_training_pass_equals_the_function_path(name, sublayer)
    assert gathered

    assert_incremental_decoding_equals_the_full_pass(name, sublayer)


def test_a_mask_other_than_the_future_mask_takes_the_other_paths(gathered):
    """Any other attention mask (or an additive bias) is not a band or a plain causal mask: the
    chunked path computes it, with the same result as the function."""
    fused, plain = module_pair("window", self_attention=True)
    x = torch.randn(6, 2, 16)
    mask = causal_mask(6)
    mask[4, 0] = 0.5  # a bias, not a mask
    got, expected = outputs_and_gradients(fused, x, attn_mask=mask), outputs_and_gradients(plain, x, attn_mask=mask)
    assert not gathered
    for a, b in zip(got, expected):
        assert (a - b).abs().max() <= 1e-5


def test_future_mask_detection():
    is_future = attention_masks.is_future_mask
    assert is_future(causal_mask(600), 600, 600)  # checked over several row blocks
    assert is_future(torch.ones(5, 5, dtype=torch.bool).triu(1), 5, 5)
    assert not is_future(causal_mask(5), 5, 6) and not is_future(torch.zeros(5, 5), 5, 5)
    late = causal_mask(600)
    late[599, 0] = float("-inf")
    assert not is_future(late, 600, 600)


def test_rows_of_a_permuted_tensor_are_read_in_place():
    """fairseq's heads are a permuted view of (S, B, H, d): their rows are gathered without a copy."""
    base = torch.randn(5, 2, 3, 4)  # (S, B, H, d)
    heads = base.permute(1, 2, 0, 3)  # (B, H, S, d)
    rows, first, step = gathered_attention.as_rows(heads)
    assert rows.data_ptr() == base.data_ptr()
    index = first + torch.arange(5).view(1, 1, 5, 1) * step  # (B, H, S, 1)
    assert torch.equal(rows[index.squeeze(-1)], heads)
    rows, first, step = gathered_attention.as_rows(heads[:, :, ::2])  # not dense: a copy
    assert torch.equal(rows[(first + torch.arange(3).view(1, 1, 3, 1) * step).squeeze(-1)], heads[:, :, ::2])


def test_pack_selected_keeps_every_selected_key_in_order():
    selected = torch.tensor([[True, False, True, True], [False, False, False, False], [False, True, False, False]])
    packed = gathered_attention.pack_selected(selected)
    assert packed.indices.shape == (3, 3)
    assert packed.indices[0].tolist() == [0, 2, 3] and packed.empty[0].tolist() == [False, False, False]
    assert packed.empty[1].all() and packed.indices[2, 0] == 1 and packed.empty[2].tolist() == [False, True, True]


def test_query_chunks_take_the_budget_of_the_tensors_device(monkeypatch):
    """A GPU runs larger chunks than a CPU (each chunk waits on the host): the budget is looked up by
    device type, and a device without one of its own takes the CPU's."""
    monkeypatch.setitem(gathered_attention.GATHER_CHUNK_ELEMENTS, "cpu", 64)
    monkeypatch.setitem(gathered_attention.GATHER_CHUNK_ELEMENTS, "cuda", 160)
    assert len(gathered_attention.query_chunks(10, 16, torch.device("cpu"))) == 3  # 4 queries a chunk
    assert len(gathered_attention.query_chunks(10, 16, torch.device("cuda"))) == 1
    assert len(gathered_attention.query_chunks(10, 16, torch.device("meta"))) == 3


# --- the route a GPU takes: every size fixed in advance, nothing read on the host --------------------

@pytest.fixture
def gpu_route(monkeypatch):
    monkeypatch.setattr(gathered_attention, "host_reads_values", lambda device: False)


@pytest.mark.parametrize("padding", ["none", "left", "right"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("name", GATHERED)
def test_the_gpu_route_equals_the_function_path(name, causal, padding, gathered, gpu_route):
    """Top-k with k + TIE_SLOTS slots and the banded patterns with k slots gather their keys; the
    other rules (whose widest row is not known in advance) run in query chunks instead."""
    torch.manual_seed(2)
    fused, plain = module_pair(name, self_attention=True)
    x = torch.randn(13, 3, 16)
    kwargs = dict(key_padding_mask=None if padding == "none" else padding_of(padding, 13),
                  attn_mask=causal_mask(13) if causal else None)
    got, expected = outputs_and_gradients(fused, x, **kwargs), outputs_and_gradients(plain, x, **kwargs)
    spec = fused.spec
    assert bool(gathered) == (name == "topk" or spec.selection_band is not None)
    for a, b in zip(got, expected):
        assert (a - b).abs().max() <= 1e-5


def test_the_gpu_route_keeps_ties_up_to_its_spare_slots(gathered, gpu_route):
    """Queries of zero tie every key. Up to k + TIE_SLOTS tied keys the result is the function's; a
    query with more keeps k + TIE_SLOTS of them (the documented bound of the fixed-size route)."""
    width = CASES["topk"].k + gathered_attention.TIE_SLOTS
    fused, plain = module_pair("topk", self_attention=True)
    for module in (fused, plain):
        with torch.no_grad():
            module.q_proj.weight.zero_(), module.q_proj.bias.zero_()
    x = torch.randn(width + 2, 2, 16)
    got = fused(x, x, x, attn_mask=causal_mask(width + 2), need_weights=False)[0]
    expected = plain(x, x, x, attn_mask=causal_mask(width + 2), need_weights=False)[0]
    assert gathered
    assert (got[:width] - expected[:width]).abs().max() <= 1e-5  # query i sees i + 1 tied keys
    assert (got[width:] - expected[width:]).abs().max() > 1e-3


def test_banded_patterns_read_padding_anywhere(gathered, gpu_route):
    """Real keys are numbered through a table, not from the first one: padding inside a sequence
    (which fairseq never makes, but a caller may) is skipped as the function skips it."""
    for name in ("window", "block", "dilated"):
        fused, plain = module_pair(name, self_attention=True)
        padding = torch.zeros(3, 11, dtype=torch.bool)
        padding[0, 3:5], padding[1, ::3], padding[2, -2:] = True, True, True
        x = torch.randn(11, 3, 16)
        got = outputs_and_gradients(fused, x, key_padding_mask=padding)
        expected = outputs_and_gradients(plain, x, key_padding_mask=padding)
        for a, b in zip(got, expected):
            assert (a - b).abs().max() <= 1e-5, name
    assert gathered


def test_every_banded_pattern_declares_how_many_keys_it_keeps():
    """The GPU route sizes a banded pattern's slots by its selection_width: no query may select more."""
    from fairseq_sparse.core.attention import attention_names, get_attention
    from fairseq_sparse.core.attention.registry import AttentionContext

    for name in attention_names():
        spec = get_attention(name)
        if spec.selection_band is None:
            continue
        assert spec.selection_width is not None, name
        for k in (1, 2, 3, 5, 8):
            for length in (1, 7, 20):
                ctx = AttentionContext(k=k)
                scores = torch.zeros(1, 1, length, length)
                for mask in (None, torch.ones(length, length, dtype=torch.bool).triu(1)[None, None]):
                    kept = (~spec.selection(scores, mask, ctx).expand_as(scores)).sum(-1)
                    assert int(kept.max()) <= spec.selection_width(k), (name, k, length)
