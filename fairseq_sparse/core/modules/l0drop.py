"""L0Drop (Zhang et al., 2021): hard-concrete gates on encoder outputs, and the compressed memory.

Gate of encoding x_i: log alpha_i = x_i . w + b. Training samples (reparameterised)
    s = sigmoid((log u - log(1 - u) + log alpha) / beta),  u ~ U(0, 1)
    g = clamp(s * (zeta - gamma) + gamma, 0, 1)
with beta = 2/3 and the stretch interval (gamma, zeta) = (-0.1, 1.1) (the paper's
epsilon = 0.1). Evaluation uses the expected gate of eq. 13,
    g_hat = clamp(sigmoid(log alpha) * (zeta - gamma) + gamma, 0, 1),
which is often exactly 0 or 1. The expected L0 of a gate (eq. 10) is
    1 - P(g = 0) = sigmoid(log alpha - beta * log(-gamma / zeta)).
"""

import math
from typing import NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import UsageError

# (the constants reach the functions as default arguments: TorchScript reads no global numbers)
BETA = 2.0 / 3.0
GAMMA, ZETA = -0.1, 1.1
# ``open`` initialisation: with w = 0 and this bias, g_hat = 1 and P(g = 0) = 1 - sigmoid(3 - beta *
# log(-gamma / zeta)) is about 1e-2, so fine-tuning a converged model starts from that model; the
# penalty's gradient there is sigmoid'(4.6), 14x weaker than at log alpha = 0.
OPEN_GATE_BIAS = 3.0
# ``official``: the official code's source_pruning layer, built under its model initialiser
# (variance scaling, fan_avg, uniform, gain 1 = Glorot uniform) with a zero bias, so log alpha
# starts spread around 0 and the gates start half open.
GATE_INITS = ("official", "open")


def check_gate_init(init: str) -> str:
    if init not in GATE_INITS:
        raise UsageError(f"--l0drop-gate-init must be one of {', '.join(GATE_INITS)}, got {init!r}")
    return init


class GateOutput(NamedTuple):  # a NamedTuple: TorchScript compiles it
    gates: Tensor  # (B, T) the gate applied: sampled in training, g_hat in evaluation; 0 at padding
    expected_l0: Tensor  # (B, T) 1 - P(g = 0); 0 at padding
    closed: Tensor  # (B, T) bool, g_hat == 0 at a real token (the paper's "pruned")


def expected_gate(log_alpha: Tensor, gamma: float = GAMMA, zeta: float = ZETA) -> Tensor:
    """g_hat of eq. 13."""
    return (torch.sigmoid(log_alpha) * (zeta - gamma) + gamma).clamp(0.0, 1.0)


def probability_open(log_alpha: Tensor, beta: float = BETA, gamma: float = GAMMA, zeta: float = ZETA) -> Tensor:
    """1 - P(g = 0), the expected L0 norm of one gate (eq. 10)."""
    return torch.sigmoid(log_alpha - beta * math.log(-gamma / zeta))


def sample_gate(log_alpha: Tensor, beta: float = BETA, gamma: float = GAMMA, zeta: float = ZETA) -> Tensor:
    """A reparameterised hard-concrete sample (eqs. 6-8)."""
    u = torch.rand_like(log_alpha).clamp(1e-6, 1.0 - 1e-6)
    s = torch.sigmoid((u.log() - (-u).log1p() + log_alpha) / beta)
    return (s * (zeta - gamma) + gamma).clamp(0.0, 1.0)


class HardConcreteGate(nn.Module):
    """One hard-concrete gate per encoder output, predicted from that output."""

    def __init__(self, embed_dim: int, init: str = "official"):
        super().__init__()
        self.log_alpha = nn.Linear(embed_dim, 1)
        if check_gate_init(init) == "official":
            nn.init.xavier_uniform_(self.log_alpha.weight)
            nn.init.zeros_(self.log_alpha.bias)
        else:
            nn.init.zeros_(self.log_alpha.weight)
            nn.init.constant_(self.log_alpha.bias, OPEN_GATE_BIAS)

    def forward(self, x: Tensor, padding_mask: Optional[Tensor], src_tokens: Optional[Tensor] = None) -> Tuple[Tensor, GateOutput]:
        """x: (T, B, C); padding_mask: (B, T) True at padding. Returns gated x and the gate statistics.

        ``src_tokens`` is unused: the gate reads the encodings (rule patterns read the tokens).
        """
        # float32 whatever the model's dtype: the gate's statistics and the L0 penalty are
        # sums over many tokens, and a half-precision log alpha moves g_hat in steps of 1e-2
        weight, bias = self.log_alpha.weight.float(), self.log_alpha.bias.float()
        log_alpha = F.linear(x.float(), weight, bias).squeeze(-1).transpose(0, 1)  # (B, T)
        g_hat = expected_gate(log_alpha)
        gates = sample_gate(log_alpha) if self.training else g_hat
        expected_l0 = probability_open(log_alpha)
        closed = g_hat == 0
        if padding_mask is not None:
            gates = gates.masked_fill(padding_mask, 0.0)
            expected_l0 = expected_l0.masked_fill(padding_mask, 0.0)
            closed = closed & ~padding_mask
        gated = x * gates.transpose(0, 1).unsqueeze(-1).to(x.dtype)
        return gated, GateOutput(gates=gates, expected_l0=expected_l0, closed=closed)


def kept_order(kept: Tensor, width: Optional[int] = None) -> Tensor:
    """(B, W) the positions of each sentence's kept encodings, in order, W = ``width`` or the most kept
    in the batch (a sentence with fewer is filled with positions of pruned ones: its unused slots)."""
    if width is None:
        width = int(kept.sum(dim=1).max()) if kept.size(0) > 0 else 0
    # a stable sort puts each sentence's kept positions first, in their original order
    return torch.sort((~kept).to(torch.uint8), dim=1, stable=True).indices[:, :width]


def source_map(gates: Tensor, padding_mask: Optional[Tensor], width: int, first_pruned_only: bool) -> Tensor:
    """(B, 1 + W, S) float32: cross-attention weights over a compressed memory of W kept slots,
    (B, T, 1 + W), times this map are the uncompressed model's weights over the source positions, (B, T, S).

    A kept slot's weight goes to its encoding's position. The zero slot stands for the c pruned
    encodings, c identical keys, which get equal weights in the uncompressed model: its weight is
    shared among them, or, for a function that breaks ties by taking the first key (hard
    retrieval's argmax), all goes to the first pruned position. Built once per batch with the
    memory, so that each decoding step maps its weights with one product.
    """
    kept = gates > 0
    real = kept.new_ones(kept.shape) if padding_mask is None else ~padding_mask
    pruned = real & ~kept
    order = kept_order(kept, width)  # (B, W)
    used = torch.arange(width, device=gates.device)[None, :] < kept.sum(dim=1, keepdim=True)
    slots = torch.zeros(kept.size(0), width, kept.size(1), device=gates.device)
    slots.scatter_(-1, order.unsqueeze(-1), used.unsqueeze(-1).float())
    if first_pruned_only:
        share = torch.zeros_like(pruned).scatter_(1, pruned.long().argmax(dim=1, keepdim=True), True) & pruned
    else:
        share = pruned / pruned.sum(dim=1, keepdim=True).clamp(min=1)
    return torch.cat([share.float().unsqueeze(1), slots], dim=1)


def compress_memory(x: Tensor, gates: Tensor, padding_mask: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """Algorithm 1, step 1: drop encodings whose gate is 0, prepend one zero slot counting them.

    x: (T, B, C) gated encoder outputs (x * g); gates: (B, T), 0 at padding.
    Returns memory (1 + W, B, C) with slot 0 a zero vector followed by each sentence's
    kept encodings in order (W = most kept in the batch), and its key counts (B, 1 + W), int64:
    slot 0 = number pruned, kept slots 1, unused slots 0. The counts take the place of the
    encoder's padding mask (a count of 0 hides the slot: slot 0 when nothing was pruned), which
    fairseq's decoder hands to every cross-attention call (``counted_padding``).
    """
    bsz = x.size(1)
    kept = gates > 0
    real = kept.new_ones(kept.shape) if padding_mask is None else ~padding_mask
    num_kept = kept.sum(dim=1)
    num_pruned = (real & ~kept).sum(dim=1)
    order = kept_order(kept)
    width = order.size(1)
    rows = x.transpose(0, 1).gather(1, order.unsqueeze(-1).expand(-1, -1, x.size(-1)))  # (B, W, C)
    slot_used = torch.arange(width, device=x.device)[None, :] < num_kept[:, None]
    rows = rows.masked_fill(~slot_used.unsqueeze(-1), 0.0)
    memory = torch.cat([rows.new_zeros(bsz, 1, x.size(-1)), rows], dim=1).transpose(0, 1)
    counts = torch.cat([num_pruned[:, None], slot_used.long()], dim=1)
    return memory, counts


def counted_padding(key_padding_mask: Optional[Tensor]) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """Reads fairseq's key padding mask (B, S), which is either a padding mask (bool, or fairseq's
    0/1 floats) or a compressed memory's key counts (an integer tensor, ``compress_memory``).

    Returns the padding mask (True = hidden: padding, or a count of 0) and the key counts (None for
    a plain padding mask: one encoding per key).
    """
    if key_padding_mask is None or key_padding_mask.dtype == torch.bool or key_padding_mask.is_floating_point():
        return key_padding_mask, None
    return key_padding_mask.eq(0), key_padding_mask
