"""The structured patterns and Top-k (OOW) against references written with plain loops over positions.

Each reference below restates a pattern's definition (README, "Structured patterns")
over real-token positions; none of them calls the implementation. Sequences are
left-padded as fairseq's sources are, so tensor index = padding + position, and in the
reference comparison also right-padded as its targets are. The row "topk_oow:window" is
Top-k (OOW) with its window set (--topk-oow-window): every size from 1 to k there.
"""

import functools
import math
from typing import Callable, Dict, List, Optional, Sequence

import pytest
import torch

from fairseq_sparse.core.attention import AttentionContext, get_attention
from fairseq_sparse.core.attention.structured import bigbird_split
from fairseq_sparse.core.modules.sparse_multihead_attention import SparseMultiheadAttention
from attention_cases import function_of
from helpers import build_model

STRUCTURED = ["block", "window", "dilated", "global", "random", "bigbird", "topk_oow"]
SELF_ONLY = [name for name in STRUCTURED if name != "random"]
ROWS = STRUCTURED + ["topk_oow:window"]
HEADS = 2
SEED = 1
LENGTHS = range(1, 13)
KS = range(1, 9)
PADDINGS = ((0, 0), (3, 0), (0, 2))  # (left, right): fairseq's sources are left-padded, its targets right-padded

# --------------------------------------------------------------- references


def neighbours(query: int, candidates: Sequence[int]) -> List[int]:
    """Candidates nearest first; at equal distance the earlier position first."""
    return sorted(candidates, key=lambda key: (abs(key - query), key > query))


def reference_hash(seed: int, query: int, key: int) -> int:
    """The documented 32-bit hash, with Python integers."""

    def mix(x: int) -> int:
        x &= 0xFFFFFFFF
        x = ((x ^ (x >> 16)) * 0x7FEB352D) & 0xFFFFFFFF
        x = ((x ^ (x >> 15)) * 0x2C1B3C6D) & 0xFFFFFFFF
        return x ^ (x >> 16)

    return mix(mix(mix(seed) ^ query) ^ key)


def random_order(seed: int, query: int, candidates: Sequence[int]) -> List[int]:
    return sorted(candidates, key=lambda key: (reference_hash(seed, query, key), key))


def ref_block(query, visible, k, seed, score):
    return {key for key in visible if key // k == query // k}


def ref_window(query, visible, k, seed, score):
    return set(neighbours(query, visible)[:k])


def ref_dilated(query, visible, k, seed, score):
    return set(neighbours(query, [key for key in visible if (key - query) % 2 == 0])[:k])


def ref_global(query, visible, k, seed, score):
    if query < k:
        return set(visible)
    return {key for key in visible if key < k}


def ref_random(query, visible, k, seed, score):
    return set(random_order(seed, query, visible)[:k])


def ref_bigbird(query, visible, k, seed, score):
    num_global, num_random = k // 4, k // 4
    num_window = k - num_global - num_random
    if query < num_global:
        return set(visible)
    chosen = {key for key in visible if key < num_global}
    chosen |= set(neighbours(query, [key for key in visible if key not in chosen])[:num_window])
    chosen |= set(random_order(seed, query, [key for key in visible if key not in chosen])[:num_random])
    return chosen


def ref_topk_oow(query, visible, k, seed, score, window_size=None):
    """The window_size (default ceil(k/2)) nearest visible keys, and the k - window_size best scores outside them."""
    window_size = math.ceil(k / 2) if window_size is None else window_size
    window = set(neighbours(query, visible)[:window_size])
    outside = sorted((key for key in visible if key not in window), key=lambda key: -score(key))
    return window | set(outside[: k - window_size])


REFERENCES: Dict[str, Callable] = {
    "block": ref_block, "window": ref_window, "dilated": ref_dilated, "global": ref_global,
    "random": ref_random, "bigbird": ref_bigbird, "topk_oow": ref_topk_oow,
}

# ----------------------------------------------------------------- helpers


def left_padded_positions(length: int, padding: int, right: int = 0) -> torch.Tensor:
    """(1, 1, padding + length + right): -1 at left padding, then 0..length-1, then length-1 again at right
    padding, as the module computes them."""
    return torch.tensor([-1] * padding + list(range(length)) + [length - 1] * right)[None, None, :]


def self_attention_mask(length: int, padding: int, causal: bool, right: int = 0) -> torch.Tensor:
    """(1, 1, S, S) True = hidden: padded keys, and future keys when causal."""
    size = padding + length + right
    mask = torch.zeros(size, size, dtype=torch.bool)
    mask[:, :padding] = True
    mask[:, padding + length:] = True
    if causal:
        mask |= torch.ones(size, size, dtype=torch.bool).triu(1)
    return mask[None, None]


def attend(name, scores, values, mask, k, query_positions, key_positions, seed=SEED, self_attention=True,
           oow_window=None):
    ctx = AttentionContext(k=k, query_positions=query_positions, key_positions=key_positions, seed=seed,
                           self_attention=self_attention, oow_window=oow_window)
    return get_attention(function_of(name)).fn(scores, values, mask, ctx)


def windows(row: str, k: int, every: bool = False) -> List[Optional[int]]:
    """Top-k (OOW)'s window sizes a test takes for k: None (the function's own split) but in the window row, there
    every size 1..k (``every``) or k - 1 (one pick; k = 1: a window of 1)."""
    if row != "topk_oow:window":
        return [None]
    return list(range(1, k + 1)) if every else [max(1, k - 1)]


def random_inputs(num_queries: int, num_keys: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(1, HEADS, num_queries, num_keys, generator=gen, dtype=torch.float64)
    values = torch.randn(1, HEADS, num_keys, 3, generator=gen, dtype=torch.float64)
    return scores, values


def self_attention_case(name: str, length: int, k: int, causal: bool, padding: int, right: int = 0, oow_window=None):
    """Weights of a padded self-attention full pass, and its scores."""
    size = padding + length + right
    scores, values = random_inputs(size, size, seed=length * 100 + k)
    positions = left_padded_positions(length, padding, right)
    out, weights = attend(name, scores, values, self_attention_mask(length, padding, causal, right), k, positions,
                          positions, oow_window=oow_window)
    return scores, out, weights


def attended_positions(weights: torch.Tensor, head: int, query_index: int, padding: int) -> set:
    return {index - padding for index in torch.nonzero(weights[0, head, query_index] > 0).flatten().tolist()}


# ------------------------------------------------------------------- tests


@pytest.mark.parametrize("name", ROWS)
def test_attended_positions_equal_the_reference(name):
    for length in LENGTHS:
        for k in KS:
            for window, causal, (padding, right) in [(w, c, p) for w in windows(name, k, every=True)
                                                     for c in (False, True) for p in PADDINGS]:
                reference = REFERENCES[function_of(name)]
                if window is not None:
                    reference = functools.partial(reference, window_size=window)
                scores, _, weights = self_attention_case(name, length, k, causal, padding, right, window)
                scores, attended = scores[0].tolist(), (weights[0] > 0).tolist()  # plain lists: fast loops
                for query in range(length):
                    visible = list(range(query + 1 if causal else length))
                    for head in range(HEADS):
                        row = scores[head][padding + query]
                        expected = reference(query, visible, k, SEED, lambda key: row[padding + key])
                        got = {i - padding for i, kept in enumerate(attended[head][padding + query]) if kept}
                        assert got == expected, (name, length, k, window, causal, padding, right, query, head)


def expected_count(name: str, query: int, visible: List[int], k: int) -> Optional[int]:
    """How many keys a query attends to where the definition fixes the number."""
    if name in ("window", "random", "topk_oow", "topk_oow:window"):
        return min(k, len(visible))
    if name == "dilated":
        return min(k, sum(1 for key in visible if (key - query) % 2 == 0))
    if name == "global":
        return len(visible) if query < k else min(k, len(visible))
    if name == "bigbird":
        return len(visible) if query < k // 4 else min(k, len(visible))
    if name == "block":
        return sum(1 for key in visible if key // k == query // k)
    raise AssertionError(name)


@pytest.mark.parametrize("name", ROWS)
def test_each_query_attends_to_exactly_the_defined_number_of_keys(name):
    for length in (1, 3, 8, 12):
        for k in KS:
            for causal, window in [(c, w) for c in (False, True) for w in windows(name, k, every=True)]:
                _, _, weights = self_attention_case(name, length, k, causal, padding=2, oow_window=window)
                for query in range(length):
                    visible = list(range(query + 1 if causal else length))
                    counts = (weights[0, :, 2 + query] > 0).sum(dim=-1).tolist()
                    assert counts == [expected_count(name, query, visible, k)] * HEADS, (name, length, k, window, causal, query)


def test_bigbird_splits_k_as_the_paper():
    for k in (4, 8, 16, 32):
        assert bigbird_split(k) == (k // 4, k // 2, k // 4)
    for k in range(1, 40):
        assert sum(bigbird_split(k)) == k


@pytest.mark.parametrize("name", ROWS)
@pytest.mark.parametrize("k", [1, 3, 4, 8])
def test_incremental_decoding_equals_the_causal_full_pass(name, k):
    length = 11
    scores, values = random_inputs(length, length, seed=k)
    positions = left_padded_positions(length, 0)
    window, = windows(name, k)
    full_out, full_weights = attend(name, scores, values, self_attention_mask(length, 0, causal=True), k, positions,
                                    positions, oow_window=window)
    for step in range(length):
        out, weights = attend(
            name, scores[:, :, step : step + 1, : step + 1], values[:, :, : step + 1], None, k,
            torch.tensor([[[step]]]), positions[..., : step + 1], oow_window=window,
        )
        torch.testing.assert_close(out[:, :, 0], full_out[:, :, step], rtol=0, atol=1e-12)
        assert torch.equal(weights[:, :, 0], full_weights[:, :, step, : step + 1])


@pytest.mark.parametrize("name", ROWS)
def test_padding_does_not_change_outputs(name):
    length, padding, k = 9, 4, 3
    window, = windows(name, k)
    for causal, left, right in ((False, padding, 0), (True, padding, 0), (False, 0, padding), (True, 0, padding)):
        scores, values = random_inputs(length, length, seed=5)
        alone, _ = attend(name, scores, values, self_attention_mask(length, 0, causal), k,
                          left_padded_positions(length, 0), left_padded_positions(length, 0), oow_window=window)
        padded_scores = torch.nn.functional.pad(scores, (left, right, left, right), value=7.0)
        padded_values = torch.nn.functional.pad(values, (0, 0, left, right), value=7.0)
        positions = left_padded_positions(length, left, right)
        padded, _ = attend(name, padded_scores, padded_values, self_attention_mask(length, left, causal, right), k,
                           positions, positions, oow_window=window)
        torch.testing.assert_close(padded[:, :, left:left + length], alone, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ROWS)
def test_no_nan_for_short_sequences_and_fully_padded_rows(name):
    """Length < k keeps every key the rule allows; a row with no visible key reads zeros, also in backward."""
    size = 4
    scores, values = random_inputs(size, size)
    scores.requires_grad_(True)
    values.requires_grad_(True)
    batch_scores, batch_values = scores.expand(2, -1, -1, -1), values.expand(2, -1, -1, -1)
    mask = torch.zeros(2, 1, size, size, dtype=torch.bool)
    mask[1] = True  # sentence 1 is all padding
    positions = torch.tensor([[[0, 1, 2, 3]], [[-1, -1, -1, -1]]])
    out, weights = attend(name, batch_scores, batch_values, mask, 8, positions, positions, oow_window=windows(name, 8)[0])
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    assert (out[1] == 0).all() and (weights[1] == 0).all()
    counts = (weights[0] > 0).sum(-1)
    assert counts.tolist() == [[expected_count(name, q, list(range(size)), 8) for q in range(size)]] * HEADS
    torch.testing.assert_close(weights[0].sum(-1), torch.ones(HEADS, size, dtype=torch.float64))
    (out * torch.randn_like(out)).sum().backward()
    assert torch.isfinite(scores.grad).all() and torch.isfinite(values.grad).all()


def test_random_is_reproducible_and_changes_with_the_seed():
    scores, values = random_inputs(12, 12)
    positions = left_padded_positions(12, 0)

    def pattern(seed):
        return attend("random", scores, values, None, 3, positions, positions, seed=seed)[1] > 0

    assert torch.equal(pattern(1), pattern(1))
    assert not torch.equal(pattern(1), pattern(2))
    assert torch.equal(pattern(1)[0, 0], pattern(1)[0, 1]), "every head attends to the same keys"


def test_random_choice_spreads_over_all_keys():
    """Over 200 queries choosing 20 of 200 keys, each key is chosen about 20 times (chi-square)."""
    length, k = 200, 20
    scores, values = random_inputs(length, length)
    positions = left_padded_positions(length, 0)
    _, weights = attend("random", scores, values, None, k, positions, positions)
    times_chosen = (weights[0, 0] > 0).sum(dim=0).double()
    chi_square = ((times_chosen - k) ** 2 / k).sum().item()
    assert chi_square < 300, chi_square  # about 200 +- 20 for a uniform choice
    offsets = torch.nonzero(weights[0, 0] > 0)
    assert (offsets[:, 1] - offsets[:, 0]).abs().float().mean() > 40, "not a local pattern"


def test_random_in_cross_attention_matches_the_reference_and_decodes_incrementally():
    source_length, padding, target_length, k = 7, 2, 5, 3
    scores, values = random_inputs(target_length, padding + source_length)
    mask = torch.zeros(1, 1, 1, padding + source_length, dtype=torch.bool)
    mask[..., :padding] = True
    key_positions = left_padded_positions(source_length, padding)
    query_positions = torch.arange(target_length)[None, None, :]
    out, weights = attend("random", scores, values, mask, k, query_positions, key_positions, self_attention=False)
    for step in range(target_length):
        expected = ref_random(step, list(range(source_length)), k, SEED, None)
        assert attended_positions(weights, 0, step, padding) == expected
        step_out, _ = attend("random", scores[:, :, step : step + 1], values, mask, k, torch.tensor([[[step]]]),
                             key_positions, self_attention=False)
        torch.testing.assert_close(step_out[:, :, 0], out[:, :, step], rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", SELF_ONLY)
def test_self_attention_only_patterns_are_refused_in_cross_attention(name):
    SparseMultiheadAttention(16, 4, attn_fn=name, self_attention=True)
    with pytest.raises(ValueError, match="self-attention only"):
        SparseMultiheadAttention(16, 4, attn_fn=name, encoder_decoder_attention=True)


def test_pattern_seed_option_reaches_every_attention_module():
    model = build_model(encoder_attn_fn="random", decoder_attn_fn="bigbird", cross_attn_fn="random", attn_pattern_seed=7)
    seeds = {m.pattern_seed for m in model.modules() if isinstance(m, SparseMultiheadAttention)}
    assert seeds == {7}
    default = build_model(encoder_attn_fn="random")
    assert {m.pattern_seed for m in default.modules() if isinstance(m, SparseMultiheadAttention)} == {1}


def test_oow_window_option_reaches_every_topk_oow_module_and_its_printout():
    """--topk-oow-window 8 with k = 12 (a window of 8 and 4 picks): every topk_oow module attends to its query's 8
    nearest keys and 12 in all, and prints the window; other functions and the default split have none."""
    model = build_model(encoder_attn_fn="topk_oow", decoder_attn_fn="topk_oow", cross_attn_fn="topk", attn_k=12,
                        topk_oow_window=8)
    modules = [m for m in model.modules() if isinstance(m, SparseMultiheadAttention)]
    assert {(m.attn_fn, m.oow_window) for m in modules} == {("topk_oow", 8), ("topk", None)}
    assert "attn_fn=topk_oow, k=12, window=8, heads=4" in str(model) and "attn_fn=topk, k=12, heads=4" in str(model)
    default = build_model(encoder_attn_fn="topk_oow", decoder_attn_fn="topk_oow", attn_k=12, seed=0)
    assert "window=" not in str(default)
    x = torch.randn(20, 1, 16, generator=torch.Generator().manual_seed(0))
    nearest = torch.tensor([sorted(neighbours(q, range(20))[:8]) for q in range(20)])  # (T, 8)
    for module, window in ((model.encoder.layers[0].self_attn, 8), (default.encoder.layers[0].self_attn, 6)):
        with torch.no_grad():
            _, weights = module(x, x, x, need_head_weights=True)  # (H, B, T, S)
        attended = weights[:, 0] > 0
        assert (attended.sum(-1) == 12).all()
        in_window = attended.gather(-1, nearest.expand(attended.size(0), -1, -1)).all(-1)
        assert in_window.all() == (window == 8), window  # ceil(12/2) = 6: some query leaves one of its 8 nearest out
