"""Head diversity: generalised Jensen-Shannon divergence between heads (Correia et al. 2019).

For one query with head distributions p_1..p_H over the same keys,
    JS = H(mean_h p_h) - mean_h H(p_h)          (natural log, nats)
which is 0 when all heads agree. Following the ReLA paper (section 6, Table 6), rows
that are not probability distributions (ReLA) are re-normalised by
softmax(alpha ** tau) over the valid keys, and a null row (all weights 0) becomes a
one-hot distribution on an extra dummy slot (a zero vector; entropy 0).

Shapes: weights (H, B, T, S); valid (B, T, S) bool as in ``zero_weights``.
"""

import torch
from torch import Tensor


def to_distributions(weights: Tensor, valid: Tensor, renormalise: bool, tau: float = 1.0) -> Tensor:
    """(H, B, T, S + 1) distributions; the last slot is the dummy that takes null rows.

    renormalise: apply softmax(alpha ** tau) over valid keys (non-null rows only);
    otherwise the weights are used as they are (masked positions set to 0).
    """
    valid = valid.unsqueeze(0).expand_as(weights)
    w = weights.double().masked_fill(~valid, 0.0)
    null = ~(w != 0).any(-1, keepdim=True)  # (H, B, T, 1)
    if renormalise:
        scores = w.clamp(min=0) ** tau if tau != 1.0 else w
        probs = torch.softmax(scores.masked_fill(~valid, float("-inf")), dim=-1)
        probs = torch.nan_to_num(probs, nan=0.0)  # rows without any valid key
    else:
        probs = w
    probs = probs.masked_fill(null, 0.0)
    return torch.cat([probs, null.to(probs.dtype)], dim=-1)


def entropy(p: Tensor) -> Tensor:
    """Shannon entropy (nats) over the last dimension, with 0 log 0 = 0."""
    return -(p * torch.log(p.clamp(min=1e-300))).masked_fill(p <= 0, 0.0).sum(-1)


def js_divergence(p: Tensor) -> Tensor:
    """Generalised JS divergence between heads. p: (H, ..., K) -> (...)."""
    return entropy(p.mean(0)) - entropy(p).mean(0)


def head_diversity(weights: Tensor, valid: Tensor, renormalise: bool, tau: float = 1.0) -> Tensor:
    """JS divergence per real query: (B, T); padding queries get NaN."""
    js = js_divergence(to_distributions(weights, valid, renormalise, tau))
    return js.masked_fill(~valid.any(-1), float("nan"))
