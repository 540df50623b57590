"""ReLA, rectified linear attention (Zhang et al., 2021), and the ablations of its Table 1."""

import math
from functools import partial
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..kernels.decoding_step import decoding_step
from ..kernels.rectified_attention import rectified_attention
from .functions import attend, fill_masked
from .norms import RMSNorm
from .registry import AttentionContext, AttentionOutput, register_attention


def _rectified(activation, doc: str):
    """Build a ReLA-style function: activation of the scores, masked keys get weight 0.

    A query whose scores are all rectified to 0 attends to nothing (null attention):
    its output is exactly 0 before the output norm.
    """

    def rectified_attention(scores: Tensor, values: Tensor, mask: Optional[Tensor], ctx: AttentionContext) -> AttentionOutput:
        weights = fill_masked(activation(scores), mask, 0.0)
        key_counts = ctx.key_counts
        if key_counts is not None:  # c identical keys add up their weights
            weights = weights * key_counts
        return attend(weights, values, ctx), weights

    rectified_attention.__doc__ = doc
    return rectified_attention


def _gated_rmsnorm(embed_dim: int, head_dim: int) -> nn.Module:
    return RMSNorm(embed_dim, gated=True)


def _xavier_rmsnorm(embed_dim: int, head_dim: int) -> nn.Module:
    return RMSNorm(embed_dim, gain_init_bound=math.sqrt(3.0 / head_dim))


def _plain_rmsnorm(embed_dim: int, head_dim: int) -> nn.Module:
    return RMSNorm(embed_dim)


class GatedLayerNorm(nn.Module):
    """ReLA Table 1 row 8: LayerNorm in place of RMSNorm, with ReLA-g's sigmoid gate."""

    def __init__(self, embed_dim: int, head_dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(embed_dim)
        bound = math.sqrt(3.0 / embed_dim)
        self.gate = nn.Parameter(torch.empty(embed_dim).uniform_(-bound, bound))

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(x) * torch.sigmoid(self.gate * x)


# ReLA (Zhang et al., 2021) and the ablations of its Table 1 (row numbers in brackets).
_RELA_VARIANTS = {
    "rela_g": (F.relu, _gated_rmsnorm, "ReLA-g [7]: ReLU attention, gated RMSNorm over the concatenated heads."),
    "rela_i": (F.relu, _xavier_rmsnorm, "ReLA-i [6]: ReLU attention, RMSNorm with gain ~ U(+-sqrt(3/d_h))."),
    "relu": (F.relu, None, "ReLU attention without normalisation [4] (the paper reports it fails to train)."),
    "relu_rmsnorm": (F.relu, _plain_rmsnorm, "ReLU attention with RMSNorm, no gate, gain 1 [5]."),
    "rela_g_layernorm": (F.relu, GatedLayerNorm, "ReLA-g with LayerNorm in place of RMSNorm [8]."),
    "rela_g_gelu": (F.gelu, _gated_rmsnorm, "ReLA-g with GeLU in place of ReLU [9]."),
    "rela_g_leaky_relu": (F.leaky_relu, _gated_rmsnorm, "ReLA-g with leaky ReLU in place of ReLU [10]."),
}
# the activation as kernels.decoding_step names it
_KERNEL_MODES = {F.relu: "relu", F.leaky_relu: "leaky_relu", F.gelu: "gelu"}
for _name, (_activation, _norm, _doc) in _RELA_VARIANTS.items():
    register_attention(_name, build_output_norm=_norm, supports_key_counts=True, weights_are_probabilities=False,
                       decoding_kernel=partial(decoding_step, mode=_KERNEL_MODES[_activation]),
                       sequence_kernel=partial(rectified_attention, mode=_KERNEL_MODES[_activation]))(
        _rectified(_activation, _doc))
