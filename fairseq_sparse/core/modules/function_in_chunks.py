"""The registered function a chunk of queries at a time, for methods without a selection (ReLA and
its ablations, hard retrieval, sparsemax, 1.5-entmax, alpha-entmax), so that no (B, H, T, S)
tensor is kept for the backward pass.

Each chunk's output is computed from q, k and v by the function itself, under activation
checkpointing (``torch.utils.checkpoint``, non-reentrant): the forward pass keeps only q, k and v
(and the function's parameters: alpha-entmax's alphas), and the backward pass recomputes one
chunk's scores and weights at a time. The random state is restored for the recomputation, so
attention dropout and hard retrieval's sampled keys are drawn again exactly as in the forward
pass. Peak working memory is O(chunk x S) floats instead of O(T x S); the price is a second
forward pass of the function in the backward pass, which is why sequences that fit in one chunk
(sentence level) keep the plain call.

Outputs and gradients (of q, k, v and the function's parameters) are the plain call's to float
rounding (tests/core/modules/test_function_in_chunks.py): the function is the same code on the
same scores, cut by rows.
"""

from typing import List, Optional, Tuple

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from ..attention import AttentionContext
from .attention_masks import adds_to_visible_keys, attn_mask_rows, combine_masks, query_rows_of_context
from .attention_settings import AttentionSettings

# A chunk holds at most this many (batch x head x query x key) entries, per device type. CPU: 2**19
# float32 scores are 2 MiB, and a function keeps several such tensors per chunk (1.5-entmax's sort:
# values, int64 indices, two running sums): one self-attention sublayer at 4,096 tokens (8 heads,
# 512-d, forward + backward) peaks at 118.7 MiB for 1.5-entmax with 2**20 entries, 1.60x stock
# fairseq's 74.1. A sentence-level batch (64 x 8 heads x 30 x 30 = 460,800) is one chunk: no
# recomputation. CUDA: each chunk is some 30 kernels, so fewer, larger chunks (not yet measured).
FUNCTION_CHUNK_ELEMENTS = {"cpu": 2**19, "cuda": 2**21}


def function_chunks(q: Tensor, k: Tensor) -> Optional[List[slice]]:
    """Query slices of at most FUNCTION_CHUNK_ELEMENTS entries each, or None when one chunk holds them all."""
    bsz, heads, tgt_len, _ = q.shape
    budget = FUNCTION_CHUNK_ELEMENTS.get(q.device.type, FUNCTION_CHUNK_ELEMENTS["cpu"])
    per_query = max(1, bsz * heads * k.size(2))
    if per_query * tgt_len <= budget:
        return None
    step = max(1, budget // per_query)
    return [slice(start, min(start + step, tgt_len)) for start in range(0, tgt_len, step)]


def function_in_chunks(attention: AttentionSettings, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext,
                       masks: Tuple[Optional[Tensor], Optional[Tensor]]) -> Tensor:
    """The registered function's output, (B, H, T, d_v), computed a chunk of queries (``function_chunks``) at a time.

    q: (B, H, T, d_h), not yet scaled; k, v: (B, H, S, d_h); ``masks``: fairseq's (attn_mask,
    key_padding_mask), cut to each chunk's rows (no (T, S) mask of ours is kept alive either).
    """
    attn_mask, key_padding_mask = masks
    fn, scale = attention.spec.fn, attention.scaling
    adds_bias = attn_mask is not None and attn_mask.dtype != torch.bool and adds_to_visible_keys(attn_mask)

    def chunk_output(queries: Tensor, keys: Tensor, values: Tensor, rows: slice) -> Tensor:
        mask, bias = combine_masks(attn_mask_rows(attn_mask, rows), key_padding_mask, adds_bias)
        scores = torch.matmul(queries * scale, keys.transpose(-1, -2)).float()
        if bias is not None:
            scores = scores + bias
        return fn(scores, values, mask, query_rows_of_context(ctx, rows))[0]

    recompute = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad
                                            or (ctx.head_params is not None and ctx.head_params.requires_grad))
    outputs = []
    for rows in function_chunks(q, k) or [slice(0, q.size(2))]:
        if recompute:
            outputs.append(checkpoint(chunk_output, q[:, :, rows], k, v, rows, use_reentrant=False, preserve_rng_state=True))
        else:
            outputs.append(chunk_output(q[:, :, rows], k, v, rows))
    return torch.cat(outputs, dim=2)
