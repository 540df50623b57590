"""The position-only patterns (block, window, dilated, global, random, BigBird) through PyTorch's FlexAttention
(``--attn-impl flex``).

FlexAttention runs softmax attention tile by tile, skipping the (128 x 128) tiles of queries and keys
that a block mask marks empty and evaluating the pattern's ``mask_mod`` only inside tiles that are
partly attended; nothing of size (T, S) is kept for the backward pass, which also skips the empty
tiles. Each pattern says its selection as a mask_mod (``AttentionSpec.flex_mask``); this module
builds its block mask (without a host synchronisation: every count stays on the device) and calls
the kernel, compiled on CUDA (``torch.compile``: the first call of a shape compiles, a second shape
makes the compiled kernel shape-generic). On the CPU torch runs FlexAttention's forward only, and
unfused: there the path serves to check the masks against the registered functions
(tests/core/modules/test_flex_patterns.py); training with it on the CPU is an error.

Attention dropout, requested weights, an attention mask other than fairseq's future mask, and
L0Drop's counted memory are not expressed here: such a call takes ``auto``'s path.
"""

import math
import warnings
from typing import Callable, Optional, Tuple

import torch
from torch import Tensor

from ..errors import UsageError
from ..attention import AttentionContext, PatternGeometry
from .attention_masks import is_future_mask, remembered
from .attention_settings import AttentionSettings

try:
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
except ImportError:  # torch < 2.5
    BlockMask = flex_attention = None

# FlexAttention's tile: queries and keys in blocks of this many (its default).
TILE = 128
# The block mask is found a few query tiles at a time: at most this many (sentence, query, key) entries at once.
MASK_CHUNK_ELEMENTS = 2**22

# Compiled FlexAttention graphs kept at once: one per pattern, k, causal or not, and static or
# shape-generic (a second shape recompiles once); torch's default of 8 would send a model or a benchmark
# with several patterns back to the unfused kernel, which holds (T, S) scores.
RECOMPILE_LIMIT = 64

_compiled_flex_attention: Optional[Callable] = None


def flex_available() -> bool:
    return flex_attention is not None


def takes_flex(attention: AttentionSettings, num_queries: int, num_keys: int, ctx: AttentionContext,
               attn_mask: Optional[Tensor]) -> bool:
    """True where ``--attn-impl flex`` computes this call with FlexAttention (see the module's docstring)."""
    if attention.impl != "flex" or attention.spec.flex_mask is None:
        return False
    if not flex_available():
        raise UsageError("--attn-impl flex needs torch >= 2.5 (torch.nn.attention.flex_attention)")
    return (num_queries > 1 and not ctx.need_weights and ctx.key_counts is None and ctx.dropout_p == 0.0
            and (attn_mask is None or is_future_mask(attn_mask, num_queries, num_keys)))


def flex_pattern_attention(attention: AttentionSettings, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext,
                           attn_mask: Optional[Tensor], key_padding_mask: Optional[Tensor]) -> Tensor:
    """q: (B, H, T, d_h), not yet scaled; k, v: (B, H, S, d_h). Returns (B, H, T, d_h) in q's dtype."""
    if q.device.type == "cpu" and torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        raise UsageError("--attn-impl flex trains on CUDA only: FlexAttention has no backward pass on the CPU "
                         "(use --attn-impl auto there)")
    causal = attn_mask is not None

    def build(_mask: Optional[Tensor] = None) -> "BlockMask":
        # a copy of the padding: a block mask remembered per padding tensor must not keep that tensor alive
        padding = None if key_padding_mask is None else key_padding_mask.clone()
        geometry = PatternGeometry(ctx.query_positions[:, 0], ctx.key_positions[:, 0], padding,
                                   causal=causal, batch=q.size(0))
        mask_mod = attention.spec.flex_mask(geometry, ctx)
        return block_mask_of(mask_mod, geometry.batch_size, q.size(2), k.size(2), q.device)

    # Every layer of a step hands the same padding (or future) mask tensor, so one block mask serves them all:
    # built by the first layer, remembered while that tensor lives.
    anchor = key_padding_mask if key_padding_mask is not None else attn_mask
    if anchor is None:
        block_mask = build()
    else:
        question = (f"flex block mask: {attention.spec.name}, k {ctx.k}, seed {ctx.seed}, causal {causal}, "
                    f"self {ctx.self_attention}, {tuple(q.shape[:3])} x {k.size(2)} keys on {q.device}")
        block_mask = remembered(question, anchor, build)
    return _flex(q.device)(q, k, v, block_mask=block_mask, scale=attention.scaling)


def _flex(device: torch.device) -> Callable:
    """FlexAttention compiled where it has kernels (CUDA); on the CPU its unfused forward, quietly."""
    global _compiled_flex_attention
    if device.type == "cuda":
        if _compiled_flex_attention is None:
            import torch._dynamo.config as dynamo_config
            for limit in ("recompile_limit", "cache_size_limit"):  # the name changed across torch versions
                if hasattr(dynamo_config, limit):
                    setattr(dynamo_config, limit, max(getattr(dynamo_config, limit), RECOMPILE_LIMIT))
                    break
            _compiled_flex_attention = torch.compile(flex_attention)
        return _compiled_flex_attention

    def unfused(*args, **kwargs) -> Tensor:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
            return flex_attention(*args, **kwargs)

    return unfused


def block_mask_of(mask_mod: Callable[..., Tensor], batch: int, num_queries: int, num_keys: int,
                  device: Optional[torch.device] = None) -> "BlockMask":
    """The block mask of ``mask_mod`` (one for every head): which key tiles each query tile attends to at all,
    and which it attends to in full (no mask_mod evaluated there).

    The mask_mod is evaluated by broadcasting over a few query tiles at a time, so no (B, T, S) tensor
    exists at length; a tile that runs past the sequence's end is never full, as in ``create_block_mask``.
    """
    query_tiles, key_tiles = math.ceil(num_queries / TILE), math.ceil(num_keys / TILE)
    tiles_at_once = max(1, MASK_CHUNK_ELEMENTS // max(1, batch * TILE * key_tiles * TILE))
    b = torch.arange(batch, device=device).view(-1, 1, 1)
    head = torch.zeros((), dtype=torch.long, device=device)
    kv_idx = torch.arange(num_keys, device=device).view(1, 1, -1)
    partial_parts, full_parts = [], []
    with torch.no_grad():
        for first_tile in range(0, query_tiles, tiles_at_once):
            rows = range(first_tile * TILE, min((first_tile + tiles_at_once) * TILE, num_queries))
            q_idx = torch.arange(rows.start, rows.stop, device=device).view(1, -1, 1)
            attended = mask_mod(b, head, q_idx, kv_idx).expand(batch, len(rows), num_keys)
            tiles = math.ceil(len(rows) / TILE)
            attended = torch.nn.functional.pad(attended, (0, key_tiles * TILE - num_keys, 0, tiles * TILE - len(rows)))
            attended = attended.view(batch, tiles, TILE, key_tiles, TILE)
            any_attended, all_attended = attended.any(dim=4).any(dim=2), attended.all(dim=4).all(dim=2)
            partial_parts.append(any_attended & ~all_attended)
            full_parts.append(all_attended)
    partial, full = torch.cat(partial_parts, dim=1), torch.cat(full_parts, dim=1)
    counts, indices = _tile_lists(partial)
    full_counts, full_indices = _tile_lists(full)
    return BlockMask.from_kv_blocks(counts, indices, full_counts, full_indices, BLOCK_SIZE=TILE, mask_mod=mask_mod,
                                    seq_lengths=(num_queries, num_keys))


def _tile_lists(tiles: Tensor) -> Tuple[Tensor, Tensor]:
    """(B, Tq, Tk) bool -> per query tile the number of marked key tiles and their indices first,
    (B, 1, Tq) and (B, 1, Tq, Tk) int32, as FlexAttention's block masks hold them (one head for all)."""
    counts = tiles.sum(dim=-1, dtype=torch.int32)
    indices = torch.argsort(~tiles, dim=-1, stable=True).to(torch.int32)
    return counts[:, None], indices[:, None]
