"""Hard retrieval attention (Xu et al., 2021): one key per head, sampled in training and taken by
argmax at inference, whose value row is gathered instead of a weighted sum."""

from functools import partial
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from ..kernels.decoding_step import decoding_step
from .functions import attention_dropout, fill_masked, masked_softmax
from .registry import AttentionContext, AttentionOutput, register_attention


class _RetrieveRows(torch.autograd.Function):
    """out = V[idx] forward; straight-through backward (Hard Retrieval eqs. 7-10).

    probs:   (*, H, T, S) attention probabilities P the indices were drawn from
    values:  (*, H, S, D), broadcastable against probs' leading dims
    indices: (*, H, T) chosen key per query
    The one-hot P_hard never exists: grad_P = grad_out @ V^T (eqs. 8-9) and
    grad_V adds each query's gradient into the row it retrieved (eq. 10).
    """

    @staticmethod
    def forward(ctx, probs: Tensor, values: Tensor, indices: Tensor) -> Tensor:
        ctx.save_for_backward(values, indices)
        return retrieve_rows(values, indices)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        values, indices = ctx.saved_tensors
        grad_probs = torch.matmul(grad_out, values.transpose(-1, -2).to(grad_out.dtype))
        grad_values = None
        if ctx.needs_input_grad[1]:
            grad_rows = grad_out.new_zeros(*grad_out.shape[:-2], *values.shape[-2:])
            grad_rows.scatter_add_(-2, indices.unsqueeze(-1).expand_as(grad_out), grad_out)
            grad_values = sum_to_shape(grad_rows, values.shape).to(values.dtype)
        return grad_probs, grad_values, None


def sum_to_shape(x: Tensor, shape: torch.Size) -> Tensor:
    """Sum a gradient over the dims along which a tensor of ``shape`` was broadcast."""
    x = x.sum(dim=tuple(range(x.dim() - len(shape)))) if x.dim() > len(shape) else x
    dims = tuple(i for i, n in enumerate(shape) if n == 1 and x.size(i) != 1)
    return x.sum(dim=dims, keepdim=True) if dims else x


def retrieve_rows(values: Tensor, indices: Tensor) -> Tensor:
    """Gather one value row per query: (*, H, S, D) values, (*, H, T) indices -> (*, H, T, D)."""
    num_keys, dim = values.size(-2), values.size(-1)
    leading: List[int] = list(indices.shape[:-1])
    rows_shape: List[int] = list(indices.shape) + [dim]
    if values.is_contiguous() and list(values.shape[:-2]) == leading:
        # Plain row indexing into the flattened values is several times faster than gather on CPU.
        offsets = torch.arange(0, values.numel() // dim, num_keys, device=values.device)
        rows = indices + offsets.view(leading + [1])
        return values.view(-1, dim)[rows.view(-1)].view(rows_shape)
    expanded = values.expand(leading + [num_keys, dim])
    return torch.gather(expanded, -2, indices.unsqueeze(-1).expand(rows_shape))


def _one_hot_weights(indices: Tensor, num_keys: int) -> Tensor:
    weights = torch.zeros(list(indices.shape) + [num_keys], dtype=torch.float32, device=indices.device)
    return weights.scatter_(-1, indices.unsqueeze(-1), 1.0)


@torch.jit.unused  # training only: a scripted model decodes, and autograd Functions do not script
def _sampled_rows(scores: Tensor, values: Tensor, mask: Optional[Tensor], ctx: AttentionContext) -> Tuple[Tensor, Tensor, Tensor]:
    """Training: the rows read (straight-through), the softmax weights, and the rows with nothing to read."""
    probs = masked_softmax(scores, mask)
    dropped = attention_dropout(probs, ctx)
    # A row with nothing left to pick (all keys masked, or all dropped out) reads a
    # zero row, as soft attention would; multinomial needs some mass, so give it one.
    empty_rows = dropped.sum(dim=-1) == 0
    if ctx.hard_train == "argmax":
        indices = dropped.argmax(dim=-1)
    else:
        sample_from = dropped.masked_fill(empty_rows.unsqueeze(-1), 1.0)
        indices = torch.multinomial(sample_from.reshape(-1, scores.size(-1)), 1).view(sample_from.shape[:-1])
    return _RetrieveRows.apply(dropped, values, indices), probs, empty_rows


# Counts need no handling: c identical keys have one argmax value and one value row.
@register_attention("hard", uses_hard_train=True, supports_key_counts=True, ties_to_first_key=True,
                    placement=("decoder", "cross"), decoding_kernel=partial(decoding_step, mode="argmax"))
def hard_retrieval_attention(scores: Tensor, values: Tensor, mask: Optional[Tensor], ctx: AttentionContext) -> AttentionOutput:
    """Hard retrieval attention: each head reads exactly one value row (Xu et al., 2021).

    Training draws the row from the softmax (after attention dropout), or takes its
    argmax with --hard-train argmax, with a straight-through gradient. Inference takes
    the argmax of the raw masked scores and gathers: no softmax, no product with V.
    A query with no unmasked key reads a zero row.
    """
    if ctx.training:
        output, probs, empty_rows = _sampled_rows(scores, values, mask, ctx)
        return output.masked_fill(empty_rows.unsqueeze(-1), 0.0), probs
    indices = fill_masked(scores, mask, float("-inf")).argmax(dim=-1)
    output = retrieve_rows(values, indices)
    weights: Optional[Tensor] = _one_hot_weights(indices, scores.size(-1)) if ctx.need_weights else None
    if mask is not None:
        # every call, not only when some query has no key: asking would stall a GPU's host each step
        empty = mask.all(dim=-1, keepdim=True)
        output = output.masked_fill(empty, 0.0)
        if weights is not None:
            weights = weights.masked_fill(empty, 0.0)
    return output, weights
