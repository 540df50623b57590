"""The fused paths of ``SparseMultiheadAttention``: softmax over the keys a registered selection
leaves (softmax, top-k, the structured patterns), without (B, H, T, S) float matrices.

* softmax, and a pattern up to a 512-token block: ``scaled_dot_product_attention`` with the
  hidden keys as a boolean mask (log key counts as an additive one);
* selections that read scores (top-k) below SCORED_GATHER_FROM_KEYS keys, and patterns past
  PATTERN_MASK_ELEMENTS under masks the gathered path does not take: query chunks keeping bit
  masks for the backward pass (``selected_softmax.SelectedSoftmaxInChunks``);
* at length, under no mask or fairseq's causal one: the selected keys gathered
  (``gathered_attention.GatheredSoftmax``).
"""

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..attention import AttentionContext
from ..attention.functions import visible_keys
from .attention_masks import attn_mask_rows, combine_masks, is_future_mask, query_rows, query_rows_of_context
from .attention_settings import AttentionSettings
from .gathered_attention import GatheredSoftmax, plan_gathered
from .selected_softmax import ChunkPlan, SelectedSoftmaxInChunks

# Query chunks of the chunked path hold at most this many (query, key) entries per chunk
# (float32 scores, or the int64 ranks of a pattern): 2**20 = 4 MiB of float32, so that a
# sentence-level batch (64 x 4 heads x 30 keys a query) is one chunk, whose weights are kept,
# not recomputed (top-k, one self-attention sublayer, forward + backward, 64 x 30 tokens: 147.6
# ms with 2**16-entry chunks, 143.1 with one chunk, softmax 132.3; at 8 x 120 tokens 97.4 / 80.3 /
# 75.5). Longer inputs gather their keys (gathered_attention) and do not come here.
SELECTION_CHUNK_ELEMENTS = 2**20
# A score-free selection (a structured pattern) goes to the fused kernel as a boolean mask up
# to this many (B x T x S) entries, a 512-token block; beyond, its selected keys are gathered
# (gathered_attention). Measured on CPU, one thread, causal self-attention, 512-d, 4 heads,
# forward + backward: window k=8 gathered 0.83x the masked kernel at 4 x 256 tokens, 1.45x at 2 x 512.
PATTERN_MASK_ELEMENTS = 2**18
# A selection that reads the scores (top-k, Top-k OOW) gathers its keys from this many keys on,
# and runs softmax over all keys in chunks below (same setting: top-k 0.94x at 64 keys, 1.04x
# at 128, 1.25x at 256, 1.54x at 512).
SCORED_GATHER_FROM_KEYS = 128


def selected_softmax(attention: AttentionSettings, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext,
                     masks: Tuple[Optional[Tensor], Optional[Tensor]]) -> Tensor:
    """Softmax over the keys ``spec.selection`` leaves, without (B, H, T, S) float matrices.

    q: (B, H, T, d_h), not yet scaled; k, v: (B, H, S, d_h). Returns (B, H, T, d_h).
    ``masks``: fairseq's (attn_mask, key_padding_mask), of which ``mask`` and ``bias`` are made.
    Selections that read scores, and patterns whose mask would exceed
    PATTERN_MASK_ELEMENTS (long sequences), run chunk by chunk
    (``SelectedSoftmaxInChunks``); the others become a boolean mask of
    ``scaled_dot_product_attention`` (softmax: just the padding and causal mask).
    """
    is_pattern = attention.spec.selection is not visible_keys
    pattern_mask_entries = q.size(0) * q.size(2) * k.size(2)  # a score-free selection's (B, 1, T, S) mask
    if attention.spec.selection_reads_scores:
        at_length = k.size(2) >= SCORED_GATHER_FROM_KEYS
    else:
        at_length = is_pattern and pattern_mask_entries > PATTERN_MASK_ELEMENTS
    if at_length and ctx.key_counts is None:
        gathered = gathered_softmax(attention, q, k, v, ctx, masks)
        if gathered is not None:
            return gathered
    attn_mask, key_padding_mask = masks
    if (not is_pattern and key_padding_mask is None and attn_mask is not None and ctx.key_counts is None
            and is_future_mask(attn_mask, q.size(2), k.size(2))):
        # softmax under fairseq's future mask alone: the kernel's is_causal, no (T, S) mask built
        return F.scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=True, dropout_p=attention.attention_dropout_p(),
                                              scale=attention.scaling)
    mask, bias = combine_masks(attn_mask, key_padding_mask)
    if attention.spec.selection_reads_scores or (is_pattern and pattern_mask_entries > PATTERN_MASK_ELEMENTS):
        rows = query_chunks(q, k)
        plan = ChunkPlan(
            select=attention.spec.selection, rows=rows,
            # the chunks' masks are cut from fairseq's own masks, so that the backward pass keeps
            # no (T, S) mask of its own alive
            mask_rows=lambda r: combine_masks(attn_mask_rows(masks[0], r), masks[1], adds_bias=False)[0],
            bias_rows=lambda r: query_rows(bias, r),
            context_rows=lambda r: ctx if len(rows) == 1 else query_rows_of_context(ctx, r),
            scale=attention.scaling, dropout=attention.dropout_module, dropout_p=attention.attention_dropout_p(),
        )
        return SelectedSoftmaxInChunks.apply(q, k, v, plan)
    with torch.no_grad():  # shape and device only: the selection never reads the placeholder
        placeholder = q.new_zeros(()).expand(q.size(0), 1, q.size(2), k.size(2))
        hidden = attention.spec.selection(placeholder, mask, ctx)
    empty_rows = None
    if hidden is not None:
        # A query with no key left gets output 0 (the registry's contract): inside the kernel it
        # attends to every key (no softmax of -inf only, so no NaN in either pass), and it is
        # zeroed afterwards, which also zeroes its gradient. Done for every mask, not only when
        # some row is empty: asking would stall a GPU's host each call.
        empty_rows = hidden.all(dim=-1, keepdim=True)
        hidden = hidden & ~empty_rows
    additive = bias
    if ctx.key_counts is not None:  # c identical keys: exp(s + log c) = c exp(s)
        log_counts = ctx.key_counts.clamp(min=1).log()  # count-0 slots are hidden anyway
        additive = log_counts if additive is None else additive + log_counts
    if additive is not None:
        attn_mask = additive.to(q.dtype)
        if hidden is not None:
            attn_mask = attn_mask.masked_fill(hidden, float("-inf"))
    else:
        attn_mask = None if hidden is None else ~hidden
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=attention.attention_dropout_p(),
                                         scale=attention.scaling)
    return out if empty_rows is None else out.masked_fill(empty_rows, 0.0)

def gathered_softmax(attention: AttentionSettings, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext,
                     masks: Tuple[Optional[Tensor], Optional[Tensor]]) -> Optional[Tensor]:
    """The selection's keys gathered (``gathered_attention``), where the masks allow it:
    none or fairseq's causal mask, beside padding. None: take the other paths."""
    attn_mask, key_padding_mask = masks
    causal = attn_mask is not None
    if causal and not is_future_mask(attn_mask, q.size(2), k.size(2)):
        return None
    plan = plan_gathered(
        attention.spec, q, k, ctx, causal,
        mask_rows=lambda r: combine_masks(attn_mask_rows(attn_mask, r), key_padding_mask, adds_bias=False)[0],
        context_rows=lambda r: query_rows_of_context(ctx, r),
        key_padding_mask=key_padding_mask, scale=attention.scaling, dropout_p=attention.attention_dropout_p(),
    )
    return None if plan is None else GatheredSoftmax.apply(q, k, v, plan)

def query_chunks(q: Tensor, k: Tensor) -> List[slice]:
    """Slices of the queries with at most SELECTION_CHUNK_ELEMENTS (B x H x S per query) entries each."""
    bsz, heads, tgt_len, _ = q.shape
    per_query = bsz * heads * k.size(2)
    chunk = max(1, SELECTION_CHUNK_ELEMENTS // max(1, per_query))
    return [slice(start, min(start + chunk, tgt_len)) for start in range(0, tgt_len, chunk)]
