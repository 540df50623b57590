"""Softmax and top-k attention, and the helpers every attention function shares. Shapes and the
calling convention are in ``registry``; the other methods are in ``entmax_family``,
``hard_retrieval``, ``rela`` and ``structured``.

Every function receives float32 scores (the module upcasts half precision) and
returns weights in float32; the value product runs in the dtype of ``values``.
"""

from functools import partial
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ..kernels import topk_attention as topk_kernel
from ..kernels.decoding_step import decoding_step
from .registry import AttentionContext, AttentionOutput, register_attention


def attention_dropout(weights: Tensor, ctx: AttentionContext) -> Tensor:
    """Attention dropout at rate ``ctx.dropout_p`` (0 outside training unless fairseq retains it)."""
    return F.dropout(weights, ctx.dropout_p, True) if ctx.dropout_p > 0 else weights


def attend(weights: Tensor, values: Tensor, ctx: AttentionContext) -> Tensor:
    """(*, H, T, S) weights x (*, H, S, D) values -> (*, H, T, D), with attention dropout."""
    return torch.matmul(attention_dropout(weights, ctx).to(values.dtype), values)


def fill_masked(x: Tensor, mask: Optional[Tensor], value: float) -> Tensor:
    return x if mask is None else x.masked_fill(mask, value)


def masked_softmax(scores: Tensor, mask: Optional[Tensor]) -> Tensor:
    """Softmax over unmasked keys; a query with every key masked gets all-zero weights.

    Softmax of an all -inf row is NaN everywhere; every entry of such a row is
    masked, so the second fill replaces exactly those NaNs (and its backward
    zeroes their gradient).
    """
    return softmax_of_filled(fill_masked(scores, mask, float("-inf")), mask)


def softmax_of_filled(filled: Tensor, mask: Optional[Tensor]) -> Tensor:
    """``masked_softmax`` for scores that are already -inf at the masked keys."""
    weights = torch.softmax(filled, dim=-1)
    if mask is None:
        return weights
    if torch.is_grad_enabled() and weights.requires_grad:
        return weights.masked_fill(mask, 0.0)
    return weights.masked_fill_(mask, 0.0)  # inference: in place, no extra allocation


def with_key_counts(scores: Tensor, ctx: AttentionContext) -> Tensor:
    """Scores of c identical keys, for softmax: exp(s + log c) = c * exp(s)."""
    key_counts = ctx.key_counts
    return scores if key_counts is None else scores + key_counts.log()


# Rows at least this long find their k-th largest score with topk (unsorted, then its minimum),
# shorter ones with kthvalue: the faster of the exact ops on CPU (1,024 rows, k = 8, one thread:
# kthvalue 42 us at 16 keys where topk takes 129; at 24 keys both 244 us; at 64 keys 617 against
# 577). On CUDA topk is used at every length (kthvalue sorts there).
TOPK_FROM_KEYS = 24


def kth_largest(masked: Tensor, k: int, key_counts: Optional[Tensor] = None, topk_from_keys: int = TOPK_FROM_KEYS) -> Tensor:
    """(*, T, 1) the k-th largest of each row of ``masked`` (-inf at masked keys).

    With key counts the k-th largest is taken over the multiset (a key of count c fills
    c places). When a row has fewer than k keys the result is its smallest (possibly -inf).
    """
    num_keys = masked.size(-1)
    if key_counts is None:
        k = min(k, num_keys)
        if num_keys >= topk_from_keys or masked.is_cuda:  # a partial sort of k: about 4x faster than kthvalue at 512 keys (CPU)
            return masked.topk(k, dim=-1, sorted=False).values.amin(dim=-1, keepdim=True)
        # the k-th largest is the (S - k + 1)-th smallest: one kthvalue (faster for short rows)
        return masked.kthvalue(num_keys - k + 1, dim=-1, keepdim=True).values
    ranked, order = masked.sort(dim=-1, descending=True)
    filled = key_counts.expand_as(masked).gather(-1, order).cumsum(dim=-1)
    return ranked.gather(-1, (filled < k).sum(dim=-1, keepdim=True).clamp(max=num_keys - 1))


def topk_mask(scores: Tensor, mask: Optional[Tensor], k: int, key_counts: Optional[Tensor] = None) -> Optional[Tensor]:
    """Extend ``mask`` to every key below the k-th largest unmasked score of its query.

    Selection happens after the causal/padding masks, as in the Explicit Sparse
    Transformer code. k is clipped to the number of keys. Keys tied with the k-th
    score are all kept (so a row may keep more than k); when fewer than k keys are
    unmasked the threshold is -inf and every unmasked key is kept.
    """
    if key_counts is None and k >= scores.size(-1):
        return mask
    masked = fill_masked(scores, mask, float("-inf"))
    below = masked < kth_largest(masked, k, key_counts)
    return below if mask is None else below | mask


def register_selection(name: str, reads_scores: bool = False, **options):
    """Register softmax over the keys a selection leaves, from the selection alone.

    The decorated ``select(scores, mask, ctx) -> hidden`` becomes the selection of the
    registered method, and its attention function is the masked softmax over ``~hidden``.
    """

    def wrap(select):
        def attention(scores: Tensor, values: Tensor, mask: Optional[Tensor], ctx: AttentionContext) -> AttentionOutput:
            weights = masked_softmax(scores, select(scores, mask, ctx))
            return attend(weights, values, ctx), weights

        attention.__doc__ = select.__doc__
        register_attention(name, selection=select, selection_reads_scores=reads_scores, **options)(attention)
        return select

    return wrap


def visible_keys(scores: Tensor, mask: Optional[Tensor], ctx: AttentionContext) -> Optional[Tensor]:
    """Softmax's selection: every key the mask leaves."""
    return mask


def topk_selection(scores: Tensor, mask: Optional[Tensor], ctx: AttentionContext) -> Optional[Tensor]:
    """Top-k's selection: the k largest scores of each query among the visible keys."""
    return topk_mask(scores, mask, ctx.k, ctx.key_counts)


@register_attention("softmax", supports_key_counts=True, selection=visible_keys)
def softmax_attention(scores: Tensor, values: Tensor, mask: Optional[Tensor], ctx: AttentionContext) -> AttentionOutput:
    """Scaled dot-product attention (Vaswani et al., 2017)."""
    weights = masked_softmax(with_key_counts(scores, ctx), mask)
    return attend(weights, values, ctx), weights


@register_attention("topk", uses_k=True, supports_key_counts=True, selection=topk_selection, selection_reads_scores=True,
                    selection_is_top_k=True, decoding_kernel=partial(decoding_step, mode="topk"),
                    sequence_kernel=topk_kernel.topk_attention, sequence_kernel_takes=topk_kernel.takes_kernel)
def topk_attention(scores: Tensor, values: Tensor, mask: Optional[Tensor], ctx: AttentionContext) -> AttentionOutput:
    """Explicit sparse attention: softmax over the k largest scores of each query (Zhao et al., 2019)."""
    key_counts = ctx.key_counts
    if key_counts is None and ctx.k >= scores.size(-1):
        weights = masked_softmax(scores, mask)
        return attend(weights, values, ctx), weights
    # the same selection as topk_mask, with fewer passes over the scores (this runs every decoding step)
    masked = fill_masked(scores, mask, float("-inf"))
    selected = masked.masked_fill(masked < kth_largest(masked, ctx.k, key_counts), float("-inf"))
    weights = softmax_of_filled(with_key_counts(selected, ctx), mask)
    return attend(weights, values, ctx), weights
