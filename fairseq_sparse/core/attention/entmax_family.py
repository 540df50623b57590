"""sparsemax, 1.5-entmax and learned alpha-entmax (Correia et al., 2019), from the ``entmax`` package.

A decoding step of sparsemax and 1.5-entmax runs as one kernel where the kernels run
(``kernels.decoding_step``: the threshold by Newton's method on the scores held in one block).

alpha-entmax keeps the package's mapping and backward pass but finds its threshold by Newton's method
in 16 steps instead of the package's 50 bisection passes over every row (``EntmaxNewton``).

The package's mappings are autograd Functions with Python-side bookkeeping, which TorchScript
cannot compile: these functions are registered ``scriptable=False`` (eager models only)."""

from functools import partial
from typing import Optional

import torch
from entmax import entmax15
from entmax.activations import SparsemaxFunction
from entmax.root_finding import EntmaxBisectFunction
from torch import Tensor, nn

from ..kernels.decoding_step import decoding_step
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


# Newton steps of EntmaxNewton. From tau = max - 1 it reached the float32 precision of a float64 solution
# (or the package's own float32 error, whichever is larger) within 10 steps for every alpha in
# {1.01, 1.1, 1.25, 1.5, 1.75, 2}, 2 to 4,096 keys, score scales 0.01 to 1,000, Gaussian rows, linear ramps
# and two near-equal peaks (tests/core/attention/test_entmax_newton.py keeps a sample of them).
NEWTON_STEPS = 16


class EntmaxNewton(EntmaxBisectFunction):
    """alpha-entmax (Peters et al., 2019) with the threshold found by Newton's method; the entmax package's
    ``entmax_bisect`` otherwise (its backward pass, for the scores and for alpha, is inherited).

    p_i = [(alpha - 1) x_i - tau]_+ ** (1 / (alpha - 1)) with tau such that sum_i p_i = 1. The package
    bisects tau for 50 passes, each a pass over every row and about ten kernels (an alpha-entmax decoding
    step dispatched 14x softmax's operations). f(tau) = sum_i p_i - 1 is decreasing and convex in tau
    for alpha in (1, 2], so Newton's method started left of the root (tau = max - 1, where the largest
    term alone is 1) climbs to it monotonically, never overshooting, and converges quadratically once
    near. The number of steps is fixed: stopping when converged would read a value on the host.
    """

    @classmethod
    def forward(cls, ctx, X, alpha, dim=-1, n_iter=NEWTON_STEPS, ensure_sum_one=True):
        alpha_shape = list(X.shape)
        alpha_shape[dim] = 1
        alpha = alpha.expand(*alpha_shape)
        ctx.alpha = alpha
        ctx.dim = dim
        power = 1.0 / (alpha - 1)
        # excess ** (power - 1) is -d/dtau (excess ** power) / power. At alpha = 2 its exponent is 0, and
        # 0 ** 0 = 1 would count keys outside the support; 0 ** 1e-30 = 0 while x ** 1e-30 = 1 in float32
        # for every x > 0 (one operation where a test of the support would take two every step).
        slope_power = (power - 1).clamp(min=1e-30)
        X = X * (alpha - 1)
        tau = X.max(dim=dim, keepdim=True)[0] - 1.0
        for _ in range(n_iter):
            excess = (X - tau).clamp(min=0)
            slope = excess.pow(slope_power)
            mass = (slope * excess).sum(dim=dim, keepdim=True)
            tau = torch.addcdiv(tau, mass - 1, slope.sum(dim=dim, keepdim=True) * power)
        p = (X - tau).clamp(min=0).pow(power)
        if ensure_sum_one:
            p = p / p.sum(dim=dim, keepdim=True)
        ctx.save_for_backward(p)
        return p


def entmax_newton(scores: Tensor, alpha: Tensor, dim: int = -1) -> Tensor:
    """alpha-entmax over ``dim`` with ``alpha`` broadcast against ``scores`` (size 1 along ``dim``)."""
    return EntmaxNewton.apply(scores, alpha, dim)


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


@register_attention("sparsemax", scriptable=False, decoding_kernel=partial(decoding_step, mode="sparsemax"))
def sparsemax_attention(scores, values, mask, ctx) -> AttentionOutput:
    """Sparsemax attention (Martins & Astudillo, 2016), from the entmax package."""
    weights = _entmax_family(sparsemax, scores, mask)
    return attend(weights, values, ctx), weights


@register_attention("entmax15", scriptable=False, decoding_kernel=partial(decoding_step, mode="entmax15"))
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
    """alpha-entmax attention with a learned alpha per head (Correia et al., 2019)."""
    # Expanding here (not inside the Function) lets autograd sum alpha's gradient over rows.
    alpha = ctx.head_params.view(-1, 1, 1).expand(*scores.shape[:-1], 1)
    weights = _entmax_family(entmax_newton, scores, mask, alpha=alpha)
    return attend(weights, values, ctx), weights
