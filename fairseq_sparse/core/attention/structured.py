"""Predefined (structured) sparse attention patterns and Top-k (OOW), all parametrised by k.

These are the baselines of the Extremely Sparse Transformer paper (section 4.3): each
query attends to k positions chosen by a fixed rule (block, window, dilated, global,
random, BigBird) or, for ``topk_oow``, k/2 by a window and k/2 by its scores.

Every rule is written over *positions* (``ctx.query_positions``/``ctx.key_positions``:
real-token positions, padding not counted), never tensor indices, and over the keys the
query may see (the mask: causal future and padding). So a left-padded sentence, the same
sentence alone, and incremental decoding (where the cache holds exactly the causally
visible keys) select the same keys. "Nearest" rules pick among *visible* keys, which is
what makes the causal window the query and its k-1 predecessors without the function
having to know whether it runs causally.

Neighbour order (``window``, ``dilated``, the window part of ``bigbird``/``topk_oow``):
keys are ranked by distance |j - i| to the query position i; at equal distance the
earlier key (j < i) comes first. The query itself (distance 0) is always first.

Softmax runs over the selected, unmasked keys; a query left with no key gets weights 0
and output 0. Each method is registered as its *selection* (``register_selection``):
a function returning the keys it hides, from which the registry builds the attention
function and the module its fused path.

The patterns that read no scores also say the same selection as a FlexAttention mask_mod
(``flex_mask``, for ``--attn-impl flex``): a rule per (query, key) that reads a few numbers per
query (where its window starts, its random keys) computed once per call, so that no (T, S)
tensor is needed. The k nearest visible keys in neighbour order always form one run of
positions: the query's own run, shifted inwards where it would leave the visible ones
(``window_start``). tests/core/attention/test_pattern_flex_masks.py checks every mask_mod
against its selection.
"""

from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from .functions import register_selection, topk_mask
from .registry import AttentionContext, PatternGeometry

# Distance between attended neighbours of `dilated`: every other position, so a query
# never sees its odd-distance neighbours (the "holes" of a dilated convolution).
DILATION = 2
# Module constants reach the functions as default arguments: TorchScript reads no global numbers.
# Ranks are int64; this one sorts after every real rank.
_NEVER = torch.iinfo(torch.int64).max
_POSITION_BITS = 21  # random ranks append the key position (< 2M tokens) to break hash ties
_HASH_MASK = 0xFFFFFFFF


# seed of random/bigbird attention when none is given (--attn-pattern-seed): one default for model and module
DEFAULT_PATTERN_SEED = 1

def _positions(scores: Tensor, ctx: AttentionContext) -> Tuple[Tensor, Tensor]:
    """Query positions (B|1, 1, T, 1) and key positions (B|1, 1, 1, S) as long tensors.

    ``ctx.key_positions`` may also be (B|1, 1, T, n): a separate set of keys per query.
    Without positions in ctx (a bare call, no module), keys are 0..S-1 and
    self-attention queries are the last T keys, cross-attention queries 0..T-1.
    """
    num_queries, num_keys = scores.size(-2), scores.size(-1)
    queries, keys = ctx.query_positions, ctx.key_positions
    if queries is not None and keys is not None:
        # (B|1, 1, T, n): each query's own candidate keys (the gathered path), already per query
        return queries.unsqueeze(-1), (keys if keys.dim() == 4 else keys.unsqueeze(-2))
    keys = torch.arange(num_keys, device=scores.device)
    queries = keys[-num_queries:] if ctx.self_attention and num_queries <= num_keys else torch.arange(num_queries, device=scores.device)
    return queries.view(1, 1, -1, 1), keys.view(1, 1, 1, -1)


def _visible(scores: Tensor, mask: Optional[Tensor]) -> Tensor:
    """Boolean, broadcastable to scores: True where the query may see the key."""
    if mask is None:
        return torch.ones(1, 1, 1, 1, dtype=torch.bool, device=scores.device)
    return ~mask


def smallest_ranks(rank: Tensor, allowed: Tensor, n: int, never: int = _NEVER) -> Tensor:
    """The ``n`` allowed keys of smallest rank for each query (every allowed key when fewer).

    rank: (..., T, S) int64, distinct within a query row; allowed: bool, broadcastable.
    Returns a bool tensor of the broadcast shape. Distinct ranks make the count exact.
    """
    broadcast = torch.broadcast_tensors(rank, allowed)
    rank, allowed = broadcast[0], broadcast[1]
    if n <= 0:
        return torch.zeros_like(allowed)
    if n >= rank.size(-1):
        return allowed
    ranked = rank.masked_fill(~allowed, never)
    threshold = ranked.topk(n, dim=-1, largest=False, sorted=False).values.amax(dim=-1, keepdim=True)
    return allowed & (ranked <= threshold)


def neighbour_rank(query_pos: Tensor, key_pos: Tensor) -> Tensor:
    """Rank of each key in the neighbour order of its query: 0 itself, 1 the key before,
    2 the key after, 3 two before, ... (distinct per query)."""
    offset = key_pos - query_pos
    return 2 * offset.abs() - (offset < 0).long()


def _mix32(x: Tensor, bits: int = _HASH_MASK) -> Tensor:
    """A 32-bit integer hash (xor-shift-multiply rounds) on int64 tensors holding values < 2**32.

    The multipliers are below 2**31, so every product fits in int64 without overflow.
    """
    x = x & bits
    x = ((x ^ (x >> 16)) * 0x7FEB352D) & bits
    x = ((x ^ (x >> 15)) * 0x2C1B3C6D) & bits
    return x ^ (x >> 16)


def random_rank(query_pos: Tensor, key_pos: Tensor, seed: int, position_bits: int = _POSITION_BITS) -> Tensor:
    """A pseudo-random rank per (seed, query position, key position), distinct per query.

    hash = mix(mix(mix(seed) ^ query) ^ key); the key position in the low bits breaks
    ties between equal hashes. Nothing else enters, so the choice is the same in full
    and incremental passes and with any padding.
    """
    seeded = _mix32(torch.tensor(seed, dtype=torch.long, device=query_pos.device))
    hashed = _mix32(_mix32(seeded ^ query_pos) ^ key_pos)
    return (hashed << position_bits) | (key_pos.clamp(min=0) & ((1 << position_bits) - 1))


def pattern_selection(
    query_pos: Tensor, key_pos: Tensor, visible: Tensor, num_global: int, num_window: int, num_random: int, seed: int
) -> Tensor:
    """Keys selected by a global + window + random pattern, each part among keys not yet taken.

    The first ``num_global`` positions are global: a global query sees every visible key,
    every other query sees the visible global keys, then its ``num_window`` nearest
    visible non-global keys, then ``num_random`` random ones among the rest. A
    non-global query therefore attends to exactly min(total, visible) keys.
    """
    global_keys = visible & (key_pos < num_global)
    rest = visible & ~global_keys
    window = smallest_ranks(neighbour_rank(query_pos, key_pos), rest, num_window)
    rest = rest & ~window
    chosen = global_keys | window | smallest_ranks(random_rank(query_pos, key_pos, seed), rest, num_random)
    return chosen | (visible & (query_pos < num_global))


def bigbird_split(k: int) -> Tuple[int, int, int]:
    """(global, window, random) sizes of BigBird: k/4 global, k/4 random, the rest (k/2) window."""
    quarter = k // 4
    return quarter, k - 2 * quarter, quarter


def topk_oow_split(k: int, window: Optional[int] = None) -> Tuple[int, int]:
    """(window, top-k) sizes of Top-k (OOW): ``window`` (--topk-oow-window; default ceil(k/2)) and the rest of k."""
    if window is None:
        return k - k // 2, k // 2
    return window, k - window


# How far (in real-token positions) from its query a banded pattern's keys can lie. One more
# than the pattern's reach: a left-padding query has position -1 and takes keys 0..k-1.
def _within_k(k: int) -> int:
    return k


def _within_dilated_k(k: int) -> int:
    return DILATION * k


def _k_keys(k: int) -> int:
    return k


def _on_lattice(offset: Tensor, dilation: int = DILATION) -> Tensor:
    """True at the key offsets a dilated pattern may attend (multiples of the dilation)."""
    return offset.remainder(dilation) == 0


def window_start(query_pos: Tensor, last: Tensor, lowest: Union[int, Tensor], width: int) -> Tensor:
    """First position of the ``width`` nearest positions to each query among lowest..last, in neighbour order.

    query_pos, last (and lowest, when a tensor): (B, T) long. Centred on the query with one more before
    than after when width is even (ceil((width - 1) / 2) before), shifted inwards at either end; every
    position of lowest..last when there are fewer.
    """
    before = width // 2  # ceil((width - 1) / 2)
    highest_start = (last - width + 1).clamp(min=lowest)
    return torch.minimum((query_pos - before).clamp(min=lowest), highest_start)


def random_picks(geometry: PatternGeometry, candidates, count: int, seed: int, rows_at_once: int = 256) -> Tensor:
    """Positions of the ``count`` candidate keys of smallest ``random_rank`` per query, (B, T, count) long, -2
    in a slot left empty (fewer candidates). ``candidates(b, q_idx, kv_idx)`` -> bool, broadcasting.

    Evaluated a chunk of queries at a time, with no gradient: a few (B, rows, S) integers at once.
    """
    batch, num_queries = geometry.query_positions.shape
    device = geometry.key_positions.device
    b = torch.arange(batch, device=device).view(-1, 1, 1)
    kv_idx = torch.arange(geometry.key_positions.size(1), device=device).view(1, 1, -1)
    key_pos = geometry.key_positions[:, None, :]
    picks = []
    with torch.no_grad():
        for start in range(0, num_queries, rows_at_once):
            q_idx = torch.arange(start, min(start + rows_at_once, num_queries), device=device).view(1, -1, 1)
            rank = random_rank(geometry.query_positions[:, q_idx.view(-1), None], key_pos, seed)
            rank = rank.masked_fill(~candidates(b, q_idx, kv_idx), _NEVER)
            smallest, keys = rank.topk(min(count, rank.size(-1)), dim=-1, largest=False)
            chosen = key_pos.expand_as(rank).gather(-1, keys).masked_fill(smallest == _NEVER, -2)
            if chosen.size(-1) < count:
                chosen = torch.nn.functional.pad(chosen, (0, count - chosen.size(-1)), value=-2)
            picks.append(chosen)
    return torch.cat(picks, dim=1)


def pattern_flex_mask(geometry: PatternGeometry, num_global: int, num_window: int, num_random: int, seed: int,
                      global_queries: bool = True):
    """``pattern_selection`` as a mask_mod: global keys, then a window, then random keys, each among the rest.

    global_queries=False: no query sees every key (``random``, whose rule is not pattern_selection's: there a
    left-padding query, at position -1, is below any number of global positions).
    """
    query_pos, key_pos = geometry.query_positions, geometry.key_positions
    window_first = window_start(query_pos, geometry.last_visible, num_global, num_window)

    def chosen_before_random(b, q_idx, kv_idx):
        pos, query = key_pos[b, kv_idx], query_pos[b, q_idx]
        seen = geometry.visible(b, q_idx, kv_idx)
        first = window_first[b, q_idx]
        in_window = (pos >= num_global) & (pos >= first) & (pos < first + num_window)
        chosen = (pos < num_global) | in_window
        return seen & ((chosen | (query < num_global)) if global_queries else chosen)

    picks = None
    if num_random > 0:
        picks = random_picks(geometry, lambda b, q, kv: geometry.visible(b, q, kv) & ~chosen_before_random(b, q, kv),
                             num_random, seed)

    def mask_mod(b, h, q_idx, kv_idx):
        chosen = chosen_before_random(b, q_idx, kv_idx)
        if picks is None:
            return chosen
        pos = key_pos[b, kv_idx]
        picked = pos == picks[b, q_idx, 0]
        for slot in range(1, num_random):  # unrolled: a mask_mod compiles to elementwise code
            picked = picked | (pos == picks[b, q_idx, slot])
        # a right-padding key repeats the last real position: only a visible key is the pick
        return chosen | (geometry.visible(b, q_idx, kv_idx) & picked)

    return mask_mod


def block_flex_mask(geometry: PatternGeometry, ctx: AttentionContext):
    query_pos, key_pos, k = geometry.query_positions, geometry.key_positions, ctx.k

    def mask_mod(b, h, q_idx, kv_idx):
        return geometry.visible(b, q_idx, kv_idx) & (key_pos[b, kv_idx] // k == query_pos[b, q_idx] // k)

    return mask_mod


def window_flex_mask(geometry: PatternGeometry, ctx: AttentionContext):
    key_pos, k = geometry.key_positions, ctx.k
    first = window_start(geometry.query_positions, geometry.last_visible, 0, k)

    def mask_mod(b, h, q_idx, kv_idx):
        pos, start = key_pos[b, kv_idx], first[b, q_idx]
        return geometry.visible(b, q_idx, kv_idx) & (pos >= start) & (pos < start + k)

    return mask_mod


def dilated_flex_mask(geometry: PatternGeometry, ctx: AttentionContext):
    """The window rule over lattice steps m (the key at query + DILATION * m), among the visible steps."""
    query_pos, key_pos, k = geometry.query_positions, geometry.key_positions, ctx.k
    lowest_step = -torch.div(query_pos, DILATION, rounding_mode="floor")  # first m with a position >= 0
    highest_step = torch.div(geometry.last_visible - query_pos, DILATION, rounding_mode="floor")
    first = window_start(torch.zeros_like(query_pos), highest_step, lowest_step, k)

    def mask_mod(b, h, q_idx, kv_idx):
        offset = key_pos[b, kv_idx] - query_pos[b, q_idx]
        step, start = torch.div(offset, DILATION, rounding_mode="floor"), first[b, q_idx]
        return geometry.visible(b, q_idx, kv_idx) & _on_lattice(offset) & (step >= start) & (step < start + k)

    return mask_mod


def global_flex_mask(geometry: PatternGeometry, ctx: AttentionContext):
    return pattern_flex_mask(geometry, ctx.k, 0, 0, ctx.seed)


def random_flex_mask(geometry: PatternGeometry, ctx: AttentionContext):
    return pattern_flex_mask(geometry, 0, 0, ctx.k, ctx.seed, global_queries=False)


def bigbird_flex_mask(geometry: PatternGeometry, ctx: AttentionContext):
    return pattern_flex_mask(geometry, *bigbird_split(ctx.k), ctx.seed)


@register_selection("block", uses_k=True, uses_positions=True, self_attention_only=True, selection_band=_within_k,
                    selection_width=_k_keys, flex_mask=block_flex_mask)
def block_selection(scores: Tensor, mask: Optional[Tensor], ctx: AttentionContext) -> Tensor:
    """Block attention: positions are cut into blocks of k; a query attends within its block.

    scores (*, H, T, S) -> hidden keys, bool, broadcastable to the scores.
    Block of position p is p // k; causally, a query sees its block up to itself.
    """
    query_pos, key_pos = _positions(scores, ctx)
    selected = _visible(scores, mask) & (key_pos // ctx.k == query_pos // ctx.k)
    return ~selected


@register_selection("window", uses_k=True, uses_positions=True, self_attention_only=True, selection_band=_within_k,
                    selection_width=_k_keys, flex_mask=window_flex_mask)
def window_selection(scores: Tensor, mask: Optional[Tensor], ctx: AttentionContext) -> Tensor:
    """Window attention: each query attends to its k nearest visible positions.

    scores (*, H, T, S) -> hidden keys, bool, broadcastable to the scores.
    Neighbour order: itself, then by distance, the earlier key first on a tie. Causal:
    the query and its k-1 predecessors. Bidirectional: i-ceil((k-1)/2)..i+floor((k-1)/2)
    (one more before than after when k is even), shifted inwards at the sequence ends.
    """
    query_pos, key_pos = _positions(scores, ctx)
    selected = smallest_ranks(neighbour_rank(query_pos, key_pos), _visible(scores, mask), ctx.k)
    return ~selected


@register_selection("dilated", uses_k=True, uses_positions=True, self_attention_only=True,
                    selection_band=_within_dilated_k, selection_width=_k_keys, flex_mask=dilated_flex_mask)
def dilated_selection(scores: Tensor, mask: Optional[Tensor], ctx: AttentionContext) -> Tensor:
    """Dilated attention: the k nearest visible positions at even distance (dilation 2).

    scores (*, H, T, S) -> hidden keys, bool, broadcastable to the scores.
    Causal: i, i-2, ..., i-2(k-1). Bidirectional: i, i-2, i+2, i-4, ... Odd-distance
    neighbours are never attended.
    """
    query_pos, key_pos = _positions(scores, ctx)
    on_lattice = _on_lattice(key_pos - query_pos)
    selected = smallest_ranks(neighbour_rank(query_pos, key_pos), _visible(scores, mask) & on_lattice, ctx.k)
    return ~selected


@register_selection("global", uses_k=True, uses_positions=True, self_attention_only=True, flex_mask=global_flex_mask)
def global_selection(scores: Tensor, mask: Optional[Tensor], ctx: AttentionContext) -> Tensor:
    """Global attention: positions 0..k-1 attend to all and are attended by all; nothing local.

    scores (*, H, T, S) -> hidden keys, bool, broadcastable to the scores.
    All k go to global positions (the paper: most tokens only see the first part of the
    sequence), so a query at position >= k does not attend to itself.
    """
    query_pos, key_pos = _positions(scores, ctx)
    selected = pattern_selection(query_pos, key_pos, _visible(scores, mask), ctx.k, 0, 0, ctx.seed)
    return ~selected


@register_selection("random", uses_k=True, uses_pattern_seed=True, uses_positions=True, flex_mask=random_flex_mask)
def random_selection(scores: Tensor, mask: Optional[Tensor], ctx: AttentionContext) -> Tensor:
    """Random attention: k visible keys per query, chosen by a hash of (seed, query position, key position).

    scores (*, H, T, S) -> hidden keys, bool, broadcastable to the scores.
    Works in cross-attention (query position = target step). Same keys for every head.
    """
    query_pos, key_pos = _positions(scores, ctx)
    selected = smallest_ranks(random_rank(query_pos, key_pos, ctx.seed), _visible(scores, mask), ctx.k)
    return ~selected


@register_selection("bigbird", uses_k=True, uses_pattern_seed=True, uses_positions=True, self_attention_only=True,
                    flex_mask=bigbird_flex_mask)
def bigbird_selection(scores: Tensor, mask: Optional[Tensor], ctx: AttentionContext) -> Tensor:
    """BigBird: k/4 global positions, then a window of k/2, then k/4 random keys (disjoint parts).

    scores (*, H, T, S) -> hidden keys, bool, broadcastable to the scores.
    Split by ``bigbird_split``: global = random = k // 4, window = k - 2 * (k // 4).
    """
    query_pos, key_pos = _positions(scores, ctx)
    num_global, num_window, num_random = bigbird_split(ctx.k)
    selected = pattern_selection(query_pos, key_pos, _visible(scores, mask), num_global, num_window, num_random, ctx.seed)
    return ~selected


@register_selection("topk_oow", reads_scores=True, uses_k=True, uses_positions=True, self_attention_only=True,
                    uses_oow_window=True)
def topk_oow_selection(scores: Tensor, mask: Optional[Tensor], ctx: AttentionContext) -> Tensor:
    """Top-k (OOW): a window of ceil(k/2) nearest keys plus the top-floor(k/2) scores outside it.

    scores (*, H, T, S) -> hidden keys, bool, broadcastable to the scores.
    The window follows ``window``'s neighbour order; the top-k part is ``topk`` over the
    visible keys outside the window (ties at the threshold are all kept). ctx.oow_window: the window's size.
    """
    query_pos, key_pos = _positions(scores, ctx)
    num_window, num_top = topk_oow_split(ctx.k, ctx.oow_window)
    visible = _visible(scores, mask)
    window = smallest_ranks(neighbour_rank(query_pos, key_pos), visible, num_window)
    selected = window
    if num_top > 0:
        hidden_outside = ~(visible & ~window)
        hidden_top = topk_mask(scores, hidden_outside.expand_as(scores), num_top)
        if hidden_top is not None:  # (always: a mask in, a mask out)
            selected = window | ~hidden_top
    return ~selected
