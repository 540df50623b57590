"""Softmax over a selection of keys, one chunk of queries at a time (top-k and the patterns at length).

Gupta et al. (2021), "Memory-efficient Transformers via Top-k Attention": the (B, H, T, S)
score and weight matrices never exist in full. With several chunks the forward pass keeps
nothing per chunk but, when attention dropout is on, the dropout mask packed to bits; the
backward pass recomputes the chunk's scores, selection and weights from q and k (the same
operations on the same inputs, so the same keys). Peak working memory is O(chunk x S)
floats (plus B x H x T x S bits with dropout). With a single chunk
(sentence-level lengths) it keeps the float32 weights instead, as autograd would, and
recomputes nothing. Outputs and gradients are those of the registered function (to float
rounding; tests/core/modules/test_fused_attention.py).
"""

from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import torch
from torch import Tensor

from ..attention import AttentionContext
from ..attention.functions import masked_softmax, with_key_counts

_BIT_VALUES = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)


def pack_bits(mask: Tensor) -> Tensor:
    """bool (..., S) -> uint8 (..., ceil(S / 8)), eight keys a byte."""
    width = mask.size(-1)
    padded = torch.nn.functional.pad(mask, (0, -width % 8)) if width % 8 else mask
    groups = padded.reshape(*padded.shape[:-1], -1, 8).to(torch.uint8)
    return (groups * _BIT_VALUES.to(mask.device)).sum(dim=-1, dtype=torch.uint8)


def unpack_bits(packed: Tensor, width: int) -> Tensor:
    """The inverse of ``pack_bits`` for masks of ``width`` keys."""
    bits = (packed.unsqueeze(-1) & _BIT_VALUES.to(packed.device)) != 0
    return bits.reshape(*packed.shape[:-1], -1)[..., :width]


def float32_gradients(q: Tensor, k: Tensor, v: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """Buffers for the gradients of q (each entry written once), k and v (summed into), in float32
    whatever the inputs' dtype, with the inputs' layouts (fairseq's heads are permuted views)."""
    grad_q = torch.empty_like(q, dtype=torch.float32, memory_format=torch.preserve_format)
    grad_k = torch.zeros_like(k, dtype=torch.float32, memory_format=torch.preserve_format)
    grad_v = torch.zeros_like(v, dtype=torch.float32, memory_format=torch.preserve_format)
    return grad_q, grad_k, grad_v


@dataclass
class ChunkPlan:
    """What the chunked computation needs besides q, k, v.

    select(scores, mask, ctx) -> hidden: the method's selection (its registry entry).
    rows: query slices; mask_rows / bias_rows / context_rows cut the mask, the additive
    float bias (B|1, 1, T|1, S) and the context to a slice. scale: q's scaling.
    """

    select: Callable
    rows: List[slice]
    mask_rows: Callable[[slice], Optional[Tensor]]
    bias_rows: Callable[[slice], Optional[Tensor]]
    context_rows: Callable[[slice], AttentionContext]
    scale: float
    dropout: Callable[[Tensor], Tensor]
    dropout_p: float


def _chunk_weights(q: Tensor, k: Tensor, plan: ChunkPlan, rows: slice) -> Tensor:
    """float32 weights of the queries ``rows``, as the registered function computes them:
    scores of the scaled queries in q's dtype, then float32, then the selection and softmax."""
    ctx = plan.context_rows(rows)
    scores = torch.matmul(q[:, :, rows] * plan.scale, k.transpose(-1, -2)).float()
    bias = plan.bias_rows(rows)
    if bias is not None:
        scores = scores + bias
    hidden = plan.select(scores, plan.mask_rows(rows), ctx)
    return masked_softmax(with_key_counts(scores, ctx), hidden)


class SelectedSoftmaxInChunks(torch.autograd.Function):
    """out = softmax over the selected keys of (scale q) k^T, times v.

    q: (B, H, T, d), not yet scaled; k, v: (B, H, S, d). Returns (B, H, T, d) in v's dtype.
    """

    @staticmethod
    def forward(fctx, q: Tensor, k: Tensor, v: Tensor, plan: ChunkPlan) -> Tensor:
        out = v.new_empty(*q.shape[:-1], v.size(-1))
        recompute = len(plan.rows) > 1
        kept_masks, saved_weights = [], None
        for rows in plan.rows:
            weights = _chunk_weights(q, k, plan, rows)
            if plan.dropout_p > 0:
                dropped = plan.dropout(weights)
                kept_masks.append(pack_bits(dropped != 0) if recompute else dropped != 0)
            else:
                dropped = weights
            out[:, :, rows] = torch.matmul(dropped.to(v.dtype), v)
            if not recompute:
                saved_weights = weights
        fctx.plan, fctx.kept_masks, fctx.saved_weights = plan, kept_masks, saved_weights
        fctx.save_for_backward(q, k, v)
        return out

    @staticmethod
    def backward(fctx, grad_out: Tensor):
        q, k, v = fctx.saved_tensors
        plan = fctx.plan
        recompute = fctx.saved_weights is None
        grad_q, grad_k, grad_v = float32_gradients(q, k, v)
        k32, v32 = k.float(), v.float()
        keep_scale = 1.0 / (1.0 - plan.dropout_p) if plan.dropout_p > 0 else 1.0
        for i, rows in enumerate(plan.rows):
            if recompute:
                weights = _chunk_weights(q, k, plan, rows)
            else:
                weights = fctx.saved_weights
            grad_rows = grad_out[:, :, rows].float()
            if fctx.kept_masks:
                kept = unpack_bits(fctx.kept_masks[i], k.size(2)) if recompute else fctx.kept_masks[i]
                grad_v += torch.matmul((weights * kept * keep_scale).transpose(-1, -2), grad_rows)
                grad_weights = torch.matmul(grad_rows, v32.transpose(-1, -2)) * kept * keep_scale
            else:
                grad_v += torch.matmul(weights.transpose(-1, -2), grad_rows)
                grad_weights = torch.matmul(grad_rows, v32.transpose(-1, -2))
            # softmax backward; keys outside the selection have weight 0 and get no gradient
            grad_scores = weights * (grad_weights - (grad_weights * weights).sum(dim=-1, keepdim=True))
            grad_q[:, :, rows] = torch.matmul(grad_scores, k32) * plan.scale
            grad_k += torch.matmul(grad_scores.transpose(-1, -2), q[:, :, rows].float() * plan.scale)
        return grad_q.to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype), None
