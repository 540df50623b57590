"""Every pattern's FlexAttention mask_mod (``AttentionSpec.flex_mask``) attends to exactly the keys its selection leaves.

The mask_mod is evaluated densely, by broadcasting, over every (sentence, query, key) of a call
and compared with the registered selection, for every k and length around the patterns' edges:
padding on either side, causal and bidirectional, queries with no key, cross-attention (random).
"""

import pytest
import torch

from attention_cases import CASES
from fairseq_sparse.core.attention import AttentionContext, PatternGeometry, get_attention

FLEX = [name for name in CASES if get_attention(name).flex_mask is not None]


def test_every_pattern_that_reads_no_scores_has_a_mask_mod():
    patterns = [name for name in CASES if get_attention(name).selection is not None and get_attention(name).uses_positions
                and not get_attention(name).selection_reads_scores]
    assert sorted(FLEX) == sorted(patterns) == ["bigbird", "block", "dilated", "global", "random", "window"]


def dense(mask_mod, batch: int, num_queries: int, num_keys: int) -> torch.Tensor:
    """mask_mod over every (b, q, kv), (B, T, S) bool."""
    b = torch.arange(batch).view(-1, 1, 1)
    q = torch.arange(num_queries).view(1, -1, 1)
    kv = torch.arange(num_keys).view(1, 1, -1)
    return mask_mod(b, torch.zeros((), dtype=torch.long), q, kv).expand(batch, num_queries, num_keys)


def padding_of(kind: str, length: int) -> torch.Tensor:
    padding = torch.zeros(3, length, dtype=torch.bool)
    if kind == "left":  # fairseq's sources
        padding[1, :min(4, length - 1)], padding[2, :1] = True, length > 1
    elif kind == "right":  # fairseq's targets
        padding[1, -min(4, length - 1):], padding[2, -1:] = length > 1, length > 1
    return padding


def selected_keys(name, k, padding, causal, num_queries, seed=3, self_attention=True):
    """(selection's attended keys, mask_mod's), both (B, T, S) bool, as the module calls them."""
    spec = get_attention(name)
    num_keys = padding.size(1)
    key_positions = ((~padding).long().cumsum(dim=-1) - 1)[:, None, :]
    query_positions = key_positions[..., -num_queries:] if self_attention else torch.arange(num_queries)[None, None, :]
    ctx = AttentionContext(k=k, self_attention=self_attention, seed=seed, query_positions=query_positions,
                           key_positions=key_positions)
    mask = padding[:, None, None, :]
    if causal:
        future = torch.ones(num_queries, num_keys, dtype=torch.bool).triu(1 + num_keys - num_queries)
        mask = mask | future[None, None]
    scores = torch.zeros(padding.size(0), 1, num_queries, num_keys)
    hidden = spec.selection(scores, mask, ctx)
    expected = ~hidden.expand_as(scores)[:, 0]
    geometry = PatternGeometry(query_positions[:, 0], key_positions[:, 0], padding, causal, padding.size(0))
    got = dense(spec.flex_mask(geometry, ctx), padding.size(0), num_queries, num_keys)
    return expected, got


@pytest.mark.parametrize("padding", ["none", "left", "right"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("length", [1, 2, 6, 13, 37])
@pytest.mark.parametrize("name", FLEX)
def test_mask_mod_equals_the_selection(name, length, causal, padding):
    for k in (1, 2, 3, 4, 5, 8):
        expected, got = selected_keys(name, k, padding_of(padding, length), causal, length)
        assert torch.equal(got, expected), f"k={k}: {(got != expected).nonzero()[:5].tolist()}"


@pytest.mark.parametrize("name", FLEX)
def test_mask_mod_equals_the_selection_for_the_last_queries_of_a_longer_key_set(name):
    """Self-attention queries are the last T keys (a cache plus a few new queries)."""
    for causal in (False, True):
        expected, got = selected_keys(name, 4, padding_of("left", 21), causal, num_queries=5)
        assert torch.equal(got, expected)


@pytest.mark.parametrize("seed", [1, 2, 7])
def test_random_cross_attention_mask_mod_equals_the_selection(seed):
    """Random attention in cross-attention: target steps attend to source positions."""
    for k in (1, 3, 8):
        expected, got = selected_keys("random", k, padding_of("left", 19), False, num_queries=11, seed=seed,
                                      self_attention=False)
        assert torch.equal(got, expected)


def test_a_long_sequence_takes_several_chunks_of_random_picks(monkeypatch):
    """Random keys are picked a chunk of queries at a time: the chunks agree with the whole."""
    from fairseq_sparse.core.attention import structured
    chunks = []
    original = structured.random_rank
    monkeypatch.setattr(structured, "random_rank", lambda *args: chunks.append(1) or original(*args))
    expected, got = selected_keys("bigbird", 8, padding_of("left", 600), False, 600)
    assert torch.equal(got, expected)
    assert len(chunks) >= 1 + 3, "the selection's one call and the mask_mod's three chunks"
