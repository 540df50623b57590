"""``--attn-impl flex``: the position-only patterns through FlexAttention equal their registered functions.

On the CPU torch runs FlexAttention's forward only (unfused), so outputs are compared here, in every
sublayer a pattern may sit in, with padding on either side, causal masks, queries with no key and
long sequences of several tiles; the block mask is checked against its mask_mod tile by tile.
Gradients and the compiled kernels are compared on a GPU (``bench.cuda_equality`` in the GPU report).
"""

import pytest
import torch

from attention_cases import CASES
from helpers import build_model, random_batch
from fairseq_sparse.core.attention import get_attention
from fairseq_sparse.core.modules import flex_patterns
from fairseq_sparse.core.modules.sparse_multihead_attention import SparseMultiheadAttention
from fairseq_sparse.core.errors import UsageError

FLEX = sorted(name for name in CASES if get_attention(name).flex_mask is not None)
GRID = [(name, sublayer) for name in FLEX for sublayer in ("encoder", "decoder", "cross")
        if not (sublayer == "cross" and CASES[name].self_only)]


@pytest.fixture
def flex_calls(monkeypatch):
    """Count the calls that take the FlexAttention path."""
    calls = []
    original = flex_patterns.flex_pattern_attention
    monkeypatch.setattr("fairseq_sparse.core.modules.sparse_multihead_attention.flex_pattern_attention",
                        lambda *args: calls.append(1) or original(*args))
    return calls


def flex_and_reference(name, k, **kwargs):
    torch.manual_seed(0)
    flex = SparseMultiheadAttention(16, 4, attn_fn=name, attn_k=k, impl="flex", **kwargs).eval()
    reference = SparseMultiheadAttention(16, 4, attn_fn=name, attn_k=k, impl="reference", **kwargs).eval()
    reference.load_state_dict(flex.state_dict())
    return flex, reference


def sublayer_inputs(sublayer: str, length: int, batch: int = 3):
    """(module kwargs, call kwargs) of a sublayer as fairseq calls it: left-padded sources, right-padded targets."""
    x = torch.randn(length, batch, 16)
    padding = torch.zeros(batch, length, dtype=torch.bool)
    if sublayer == "decoder":
        padding[1, -min(4, length - 1):] = True
        mask = torch.triu(torch.full((length, length), float("-inf")), 1)
        return dict(self_attention=True), dict(query=x, key=x, value=x, key_padding_mask=padding, attn_mask=mask)
    padding[1, :min(4, length - 1)], padding[2, :1] = True, True
    if sublayer == "encoder":
        return dict(self_attention=True), dict(query=x, key=x, value=x, key_padding_mask=padding)
    memory = torch.randn(length + 3, batch, 16)
    memory_padding = torch.zeros(batch, length + 3, dtype=torch.bool)
    memory_padding[1, :5] = True
    return (dict(encoder_decoder_attention=True),
            dict(query=x, key=memory, value=memory, key_padding_mask=memory_padding, static_kv=True))


@pytest.mark.parametrize("k,length", [(1, 2), (3, 13), (8, 150)])
@pytest.mark.parametrize("name,sublayer", GRID)
def test_flex_path_equals_the_registered_function(name, sublayer, k, length, flex_calls):
    """Every query, padding queries included; 150 tokens: two query tiles and two key tiles."""
    torch.manual_seed(k + length)
    module_kwargs, call = sublayer_inputs(sublayer, length)
    flex, reference = flex_and_reference(name, k, **module_kwargs)
    with torch.no_grad():
        got, _ = flex(**call, need_weights=False)
        expected, _ = reference(**call, need_weights=False)
    assert flex_calls, "the FlexAttention path was not taken"
    assert (got - expected).abs().max() <= 1e-5


@pytest.mark.parametrize("name", FLEX)
def test_a_batch_without_padding_equals_the_registered_function(name, flex_calls):
    """No padding mask (fairseq passes none when no sentence is padded): one set of positions for every sentence."""
    flex, reference = flex_and_reference(name, 3, self_attention=True)
    x = torch.randn(9, 4, 16)
    for mask in (None, torch.triu(torch.full((9, 9), float("-inf")), 1)):
        with torch.no_grad():
            got, _ = flex(x, x, x, attn_mask=mask, need_weights=False)
            expected, _ = reference(x, x, x, attn_mask=mask, need_weights=False)
        assert (got - expected).abs().max() <= 1e-5
    assert len(flex_calls) == 2


@pytest.mark.parametrize("name", FLEX)
def test_a_query_with_no_key_gets_zero_output(name, flex_calls):
    """Left padding under a causal mask: the padding queries see no key at all."""
    flex, reference = flex_and_reference(name, 3, self_attention=True)
    x = torch.randn(7, 2, 16)
    padding = torch.zeros(2, 7, dtype=torch.bool)
    padding[1, :4] = True
    call = dict(query=x, key=x, value=x, key_padding_mask=padding, attn_mask=torch.triu(torch.full((7, 7), float("-inf")), 1))
    with torch.no_grad():
        got, _ = flex(**call, need_weights=False)
        expected, _ = reference(**call, need_weights=False)
    assert flex_calls
    assert torch.allclose(got[:4, 1], flex.out_proj.bias.expand(4, 16))  # output 0 before out_proj
    assert (got - expected).abs().max() <= 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_flex_path_is_close_to_float32(dtype, flex_calls):
    module_kwargs, call = sublayer_inputs("encoder", 40)
    flex, reference = flex_and_reference("window", 4, **module_kwargs)
    with torch.no_grad():
        expected, _ = reference(**call, need_weights=False)
        flex.to(dtype)
        got, _ = flex(**{key: value.to(dtype) if torch.is_floating_point(value) else value for key, value in call.items()},
                      need_weights=False)
    assert flex_calls and got.dtype == dtype
    assert (got.float() - expected).abs().max() <= 5e-2


@pytest.mark.parametrize("name", FLEX)
def test_block_mask_marks_exactly_the_tiles_its_mask_mod_attends(name, monkeypatch):
    """Tiles of 16 over 70 x 70: a tile is listed iff some entry is attended, and full iff every entry is,
    whether the mask is found in one chunk of query tiles or one tile at a time."""
    from fairseq_sparse.core.attention import AttentionContext, PatternGeometry
    monkeypatch.setattr(flex_patterns, "TILE", 16)
    padding = torch.zeros(2, 70, dtype=torch.bool)
    padding[1, :9] = True
    key_positions = (~padding).long().cumsum(dim=-1) - 1
    geometry = PatternGeometry(key_positions, key_positions, padding, causal=False, batch=2)
    mask_mod = get_attention(name).flex_mask(geometry, AttentionContext(k=8, seed=2))
    attended = mask_mod(torch.arange(2).view(-1, 1, 1), torch.zeros((), dtype=torch.long),
                        torch.arange(70).view(1, -1, 1), torch.arange(70).view(1, 1, -1)).expand(2, 70, 70)
    padded = torch.nn.functional.pad(attended, (0, 10, 0, 10)).view(2, 5, 16, 5, 16)
    any_tile, all_tile = padded.any(dim=4).any(dim=2), padded.all(dim=4).all(dim=2)
    for chunk_elements in (2**22, 1):
        monkeypatch.setattr(flex_patterns, "MASK_CHUNK_ELEMENTS", chunk_elements)
        block_mask = flex_patterns.block_mask_of(mask_mod, 2, 70, 70)
        assert torch.equal(block_mask.to_dense()[:, 0].bool(), any_tile)
        full = torch.zeros_like(all_tile)
        for b in range(2):
            for tile in range(5):
                count = int(block_mask.full_kv_num_blocks[b, 0, tile])
                full[b, tile, block_mask.full_kv_indices[b, 0, tile, :count].long()] = True
        assert torch.equal(full, all_tile)


def test_training_with_flex_on_the_cpu_is_one_clear_error():
    flex, _ = flex_and_reference("window", 3, self_attention=True)
    x = torch.randn(5, 2, 16, requires_grad=True)
    with pytest.raises(UsageError, match="--attn-impl flex trains on CUDA only"):
        flex.train()(x, x, x, need_weights=False)


@pytest.mark.parametrize("why", ["weights", "dropout", "one query", "scored selection", "scored selection, window set"])
def test_calls_flex_does_not_express_take_autos_path(why, flex_calls):
    name = "topk_oow" if why.startswith("scored selection") else "window"
    window = {"oow_window": 1} if why.endswith("window set") else {}  # 1 + 2 picks, where the default is 2 + 1
    torch.manual_seed(0)
    flex = SparseMultiheadAttention(16, 4, attn_fn=name, attn_k=3, impl="flex", self_attention=True,
                                    dropout=0.5 if why == "dropout" else 0.0, **window)
    flex.eval()
    if why == "dropout":
        flex.dropout_module.apply_during_inference = True
    length = 1 if why == "one query" else 6
    x = torch.randn(length, 2, 16)
    with torch.no_grad():
        out, weights = flex(x, x, x, need_weights=why == "weights")
    assert not flex_calls and out.shape == (length, 2, 16)
    assert (weights is not None) == (why == "weights")
    if window:  # auto's path, with the window
        reference = SparseMultiheadAttention(16, 4, attn_fn=name, attn_k=3, impl="reference", self_attention=True,
                                             **window).eval()
        reference.load_state_dict(flex.state_dict())
        with torch.no_grad():
            assert (reference(x, x, x, need_weights=False)[0] - out).abs().max() <= 1e-5


@pytest.mark.parametrize("name", ["window", "bigbird"])
def test_a_model_with_flex_scores_its_batch_as_the_reference_model(name, flex_calls, monkeypatch):
    """Encoder and decoder self-attention of a whole model (left-padded sources, right-padded targets), one block
    mask built for the encoder's layers and one for the decoder's."""
    builds = []
    original = flex_patterns.block_mask_of
    monkeypatch.setattr(flex_patterns, "block_mask_of", lambda *args: builds.append(1) or original(*args))
    batch = random_batch([7, 4, 9], [5, 8, 3])
    flex = build_model(encoder_attn_fn=name, decoder_attn_fn=name, attn_k=4, attn_impl="flex").eval()
    reference = build_model(encoder_attn_fn=name, decoder_attn_fn=name, attn_k=4, attn_impl="reference").eval()
    reference.load_state_dict(flex.state_dict())
    with torch.no_grad():
        got, expected = flex(**batch)[0], reference(**batch)[0]
    assert len(flex_calls) == 4  # two encoder layers, two decoder layers
    assert len(builds) == 2
    assert (got - expected).abs().max() <= 1e-4


@pytest.mark.parametrize("name", FLEX)
def test_building_the_block_mask_never_synchronises_the_host(name, monkeypatch):
    """Geometry, random picks and block mask stay on the device (the kernel itself is left out: the CPU's
    counter cannot enter FlexAttention's operator)."""
    from fairseq_sparse.bench.dispatch_counts import count
    monkeypatch.setattr(flex_patterns, "_flex", lambda device: lambda q, k, v, block_mask, scale: torch.zeros_like(q))
    flex, _ = flex_and_reference(name, 8, self_attention=True)
    for sublayer in ("encoder", "decoder"):
        _, call = sublayer_inputs(sublayer, 300)
        with torch.no_grad():
            flex(**call, need_weights=False)  # the first call asks once whether the mask is fairseq's future mask
            # a new padding tensor: its block mask is built again, not found among those of earlier calls
            counter = count(lambda: flex(**{**call, "key_padding_mask": call["key_padding_mask"].clone()},
                                         need_weights=False))
        assert counter.synchronisations == [] and counter.operations > 50, sublayer


def test_a_remembered_block_mask_goes_with_its_padding_mask():
    """The block mask is kept while the padding tensor lives, and does not keep it alive."""
    import gc
    import weakref
    from fairseq_sparse.core.modules import attention_masks
    flex, _ = flex_and_reference("window", 3, self_attention=True)
    _, call = sublayer_inputs("encoder", 9)
    padding = call.pop("key_padding_mask").clone()
    before = len(attention_masks._ANSWERS)
    with torch.no_grad():
        flex(**call, key_padding_mask=padding, need_weights=False)
    assert len(attention_masks._ANSWERS) == before + 1
    alive = weakref.ref(padding)
    del padding
    gc.collect()
    assert alive() is None and len(attention_masks._ANSWERS) == before
