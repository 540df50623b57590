"""sparsemax, 1.5-entmax and learned alpha-entmax (Correia et al., 2019), from the ``entmax`` package.

The package's mappings are autograd Functions with Python-side bookkeeping, which TorchScript
cannot compile: these functions are registered ``scriptable=False`` (eager models only)."""

from typing import Optional

import torch
from entmax import entmax15, entmax_bisect
from entmax.activations import SparsemaxFunction
from torch import Tensor, nn

from .functions import attend
from .registry import AttentionOutput, register_attention


class Sparsemax(SparsemaxFunction):
    """The entmax package's sparsemax, with a backward pass that reads nothing on the host.

    The package's backward zeroes the gradient outside the support by boolean indexing
    (``grad[output == 0] = 0``), which finds its positions with a nonzero: on a GPU, a wait for the
    device in every training step. ``masked_fill`` is the same arithmetic without it.
    """

    @classmethod
    def backward(cls, ctx, grad_output):
        support_size, output = ctx.saved_tensors
        outside = output == 0
        grad_input = grad_output.masked_fill(outside, 0.0)
        mean = grad_input.sum(dim=ctx.dim, keepdim=True) / support_size.to(output.dtype)
        return torch.where(outside, grad_input, grad_input - mean), None, None


def sparsemax(scores: Tensor, dim: int = -1) -> Tensor:
    """sparsemax over ``dim`` (the entmax package's forward: a full sort)."""
    return Sparsemax.apply(scores, dim, None)


def _entmax_family(mapping, scores: Tensor, mask: Optional[Tensor], **kwargs) -> Tensor:
    """Apply an entmax-package mapping with masking.

    The package crashes on an all -inf row (entmax issue 19): such rows are
    mapped from zeros and zeroed afterwards.
    """
    if mask is None:
        return mapping(scores, dim=-1, **kwargs)
    empty_rows = mask.all(dim=-1, keepdim=True)
    z = scores.masked_fill(mask, float("-inf")).masked_fill(empty_rows, 0.0)
    return mapping(z, dim=-1, **kwargs).masked_fill(mask, 0.0)


@register_attention("sparsemax", scriptable=False)
def sparsemax_attention(scores, values, mask, ctx) -> AttentionOutput:
    """Sparsemax attention (Martins & Astudillo, 2016), from the entmax package."""
    weights = _entmax_family(sparsemax, scores, mask)
    return attend(weights, values, ctx), weights


@register_attention("entmax15", scriptable=False)
def entmax15_attention(scores, values, mask, ctx) -> AttentionOutput:
    """1.5-entmax attention (Peters et al., 2019), from the entmax package."""
    weights = _entmax_family(entmax15, scores, mask)
    return attend(weights, values, ctx), weights


class LearnedAlpha(nn.Module):
    """One entmax alpha per head: alpha = 1 + sigmoid(p), clamped to [1.01, 2] (Correia et al., 2019)."""

    def __init__(self, num_heads: int):
        super().__init__()
        self.pre_alpha = nn.Parameter(torch.zeros(num_heads))  # alpha starts at 1.5

    def forward(self) -> Tensor:
        """(H,) the alphas, handed to the attention function as ctx.head_params."""
        return (1.0 + torch.sigmoid(self.pre_alpha.float())).clamp(1.01, 2.0)


@register_attention("entmax_alpha", build_head_params=LearnedAlpha, scriptable=False)
def entmax_alpha_attention(scores, values, mask, ctx) -> AttentionOutput:
    """alpha-entmax attention with a learned alpha per head (entmax_bisect; Correia et al., 2019)."""
    # Expanding here (not inside entmax_bisect) lets autograd sum alpha's gradient over rows.
    alpha = ctx.head_params.view(-1, 1, 1).expand(*scores.shape[:-1], 1)
    weights = _entmax_family(entmax_bisect, scores, mask, alpha=alpha)
    return attend(weights, values, ctx), weights
