"""fairseq's attention masks as the attention paths read them: one boolean mask (True = hidden)
plus an optional additive bias, their rows for a chunk of queries, and the checks that let a
path take the kernel's causal shortcut instead of building a (T, S) mask."""

import copy
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..attention import AttentionContext


def is_causal(allowed: Tensor) -> bool:
    """True if a boolean mask of allowed keys is exactly the causal mask of a full pass,
    (1, 1, T, T) lower-triangular: the kernel then needs no mask (and no copy of one)."""
    if allowed.dtype != torch.bool or allowed.dim() != 4 or allowed.shape[:2] != (1, 1) or allowed.size(-1) != allowed.size(-2):
        return False
    return bool(torch.equal(allowed, torch.ones_like(allowed).tril_()))


def is_future_mask(attn_mask: Tensor, num_queries: int, num_keys: int, rows_at_once: int = 256) -> bool:
    """True if fairseq's (T, S) attention mask hides exactly the keys after each query (T == S) and
    adds nothing to the others; checked a few rows at a time (no (T, S) temporaries at length)."""
    if attn_mask.dim() != 2 or num_queries != num_keys or attn_mask.shape != (num_queries, num_keys):
        return False
    keys = torch.arange(num_keys, device=attn_mask.device)
    for start in range(0, num_queries, rows_at_once):
        rows = attn_mask[start:start + rows_at_once]
        future = keys > torch.arange(start, start + rows.size(0), device=attn_mask.device)[:, None]
        hidden = rows if rows.dtype == torch.bool else rows <= -1e4
        if not torch.equal(hidden, future) or (rows.dtype != torch.bool and bool(rows.masked_fill(future, 0).ne(0).any())):
            return False
    return True


def attn_mask_rows(attn_mask: Optional[Tensor], rows: slice) -> Optional[Tensor]:
    """Rows ``rows`` of fairseq's (T, S) attention mask."""
    return None if attn_mask is None else attn_mask[rows]


def query_rows(x: Optional[Tensor], rows: slice) -> Optional[Tensor]:
    """Rows ``rows`` of a mask or bias broadcastable to (B, H, T, S) (unchanged where T is broadcast)."""
    return x if x is None or x.size(-2) == 1 else x[..., rows, :]


def query_rows_of_context(ctx: AttentionContext, rows: slice) -> AttentionContext:
    """``ctx`` for queries ``rows`` only: query positions are (B|1, 1, T)."""
    if ctx.query_positions is None:
        return ctx
    rows_ctx = copy.copy(ctx)
    rows_ctx.query_positions = ctx.query_positions[..., rows]
    return rows_ctx


def as_bool(mask: Optional[Tensor]) -> Optional[Tensor]:
    if mask is None or mask.dim() == 0:
        return None
    return mask if mask.dtype == torch.bool else mask != 0


def combine_masks(
    attn_mask: Optional[Tensor], key_padding_mask: Optional[Tensor]
) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """Turn fairseq's masks into one boolean mask (True = hidden) and an optional score bias.

    attn_mask: (T, S), bool or additive float (fairseq's causal mask is -inf above
        the diagonal; the encoder layer uses -1e8). Entries <= -1e4 hide the key;
        any other non-zero float entries are kept as an additive bias.
    key_padding_mask: (B, S) bool, True at padding.
    Returns a mask broadcastable to (B, H, T, S) and a bias of shape (1, 1, T, S) or None.
    """
    mask: Optional[Tensor] = None
    bias: Optional[Tensor] = None
    if attn_mask is not None:
        hidden = attn_mask if attn_mask.dtype == torch.bool else attn_mask <= -1e4
        if attn_mask.dtype != torch.bool and bool(((attn_mask != 0) & ~hidden).any()):
            bias = attn_mask.float().masked_fill(hidden, 0.0)[None, None]  # (fairseq's masks have none: no float copy then)
        mask = hidden[None, None]
    if key_padding_mask is not None:
        padding = key_padding_mask[:, None, None, :]
        mask = padding if mask is None else mask | padding
    return mask, bias
