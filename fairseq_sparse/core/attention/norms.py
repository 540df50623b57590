"""Normalisation of the concatenated head outputs (ReLA)."""

import math
from typing import Optional

import torch
from torch import Tensor, nn

from ..kernels import rms_norm as _rms_norm_kernel  # noqa: F401  (defines torch.ops.fairseq_sparse.rms_norm)
from ..kernels.device import runs_fused


class RMSNorm(nn.Module):
    """RMSNorm (Zhang & Sennrich, 2019), optionally gated as in ReLA-g.

    y = g * x / sqrt(mean(x^2) + eps), times sigmoid(w * x) when gated.
    A zero vector (null attention) stays exactly zero, and so does its gradient: the
    true derivative there is gain / sqrt(eps) = 1e4 x gain, which overflows float16
    under a loss scale (a ReLU row that is all zero passes no gradient further back,
    so nothing downstream needs it).

    gain_init_bound: None initialises the gain g to ones; a bound b draws it from
        U(-b, b) (ReLA-i uses b = sqrt(3 / d_h)).
    gated: adds the per-dimension gate w of ReLA-g, drawn from U(+-sqrt(3 / dim)),
        the default (Glorot) initialiser of the official ReLA code's 1-d gate.
    """

    def __init__(self, dim: int, eps: float = 1e-8, gated: bool = False, gain_init_bound: Optional[float] = None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        if gain_init_bound is not None:
            nn.init.uniform_(self.weight, -gain_init_bound, gain_init_bound)
        # may run as one kernel where no gradient is recorded (kernels.rms_norm); --attn-impl reference: never
        self.kernel = True
        self.gate = None
        if gated:
            bound = math.sqrt(3.0 / dim)
            self.gate = nn.Parameter(torch.empty(dim).uniform_(-bound, bound))

    def __setstate__(self, state):
        state.setdefault("kernel", True)  # a module pickled before the kernel existed
        super().__setstate__(state)

    def forward(self, x: Tensor) -> Tensor:
        if not torch.jit.is_scripting() and self.kernel and not torch.is_grad_enabled() and self._runs_fused(x):
            return self._fused(x)
        xf = x.float()
        mean_square = xf.pow(2).mean(dim=-1, keepdim=True)
        inverse_rms = torch.rsqrt(mean_square + self.eps)
        if torch.is_grad_enabled() and x.requires_grad:  # the guard is for the gradient (no ops for it in decoding)
            inverse_rms = inverse_rms.masked_fill(mean_square == 0, 0.0)
        y = xf * inverse_rms * self.weight.float()
        if self.gate is not None:
            y = y * torch.sigmoid(self.gate.float() * xf)
        return y.type_as(x)

    @torch.jit.unused
    def _runs_fused(self, x: Tensor) -> bool:
        return runs_fused(x.device)

    @torch.jit.unused
    def _fused(self, x: Tensor) -> Tensor:
        """One kernel where no gradient is recorded (decoding): ``kernels.rms_norm``."""
        return torch.ops.fairseq_sparse.rms_norm(x, self.weight, self.gate, self.eps)
