"""Sparsity rate and null rate of attention weights (ReLA paper, Figures 3 and 6), and the peak
share: how much of a query's attention its single largest weight holds (1 for hard retrieval), which
says what decoding with hard retrieval throws away (Hard Retrieval Attention, Table 4).

Shapes: weights (H, B, T, S) per-head attention of one sublayer; valid (B, T, S) bool,
True where query t of sentence b may attend key s (both real tokens, and the causal
mask allows it). Queries with no valid key (padding) count nowhere.
"""

from typing import Tuple

import torch
from torch import Tensor


def zero_weight_counts(weights: Tensor, valid: Tensor) -> Tuple[Tensor, Tensor]:
    """Per head: (number of valid weights exactly 0, number of valid weights), both (H,).

    Sparsity rate = zeros / total: the fraction of attention weights over valid
    (unmasked) key positions that are exactly 0.
    """
    valid = valid.unsqueeze(0).expand_as(weights)
    zeros = ((weights == 0) & valid).flatten(1).sum(1)
    total = valid.flatten(1).sum(1)
    return zeros, total


def null_counts(weights: Tensor, valid: Tensor) -> Tuple[Tensor, Tensor]:
    """Per head: (number of null queries, number of queries), both (H,).

    A query is null when all its weights over valid keys are exactly 0; the null
    rate is the fraction of (real) queries that are null.
    """
    queries = valid.any(-1)  # (B, T)
    nonzero = ((weights != 0) & valid.unsqueeze(0)).any(-1)  # (H, B, T)
    null = (~nonzero & queries.unsqueeze(0)).flatten(1).sum(1)
    return null, queries.sum().expand(weights.size(0)).clone()


def peak_share_sums(weights: Tensor, valid: Tensor) -> Tuple[Tensor, Tensor]:
    """Per head: (sum over attending queries of largest weight / sum of weights, number of
    attending queries), both (H,).

    Attending: a real query with some weight over valid keys (null and padding queries count
    nowhere). A share rather than the largest weight itself, so that unnormalised weights (ReLA)
    are comparable with distributions.
    """
    w = weights.float().masked_fill(~valid.unsqueeze(0), 0.0)
    total, peak = w.sum(-1), w.amax(-1)  # (H, B, T)
    attending = total > 0
    shares = torch.where(attending, peak / total.clamp(min=torch.finfo(w.dtype).tiny), torch.zeros_like(total))
    return shares.flatten(1).sum(1), attending.flatten(1).sum(1)


def rate(numerator: Tensor, denominator: Tensor) -> Tensor:
    """Elementwise numerator / denominator, 0 where the denominator is 0."""
    return numerator.double() / denominator.double().clamp(min=1)
