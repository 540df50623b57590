"""The attention functions. Shapes and the calling convention are in ``registry``.

Every function receives float32 scores (the module upcasts half precision) and
returns weights in float32; the value product runs in the dtype of ``values``.
"""

import math
from typing import Optional

import torch
import torch.nn.functional as F
from entmax import entmax15, entmax_bisect, sparsemax
from torch import Tensor, nn

from .norms import RMSNorm
from .registry import AttentionContext, AttentionOutput, register_attention


def _attend(weights: Tensor, values: Tensor, ctx: AttentionContext) -> Tensor:
    """(*, H, T, S) weights x (*, H, S, D) values -> (*, H, T, D), with attention dropout."""
    return torch.matmul(ctx.dropout(weights).to(values.dtype), values)


def _fill_masked(x: Tensor, mask: Optional[Tensor], value: float) -> Tensor:
    return x if mask is None else x.masked_fill(mask, value)


def masked_softmax(scores: Tensor, mask: Optional[Tensor]) -> Tensor:
    """Softmax over unmasked keys; a query with every key masked gets all-zero weights.

    Softmax of an all -inf row is NaN everywhere; every entry of such a row is
    masked, so the second fill replaces exactly those NaNs (and its backward
    zeroes their gradient).
    """
    return softmax_of_filled(_fill_masked(scores, mask, float("-inf")), mask)


def softmax_of_filled(filled: Tensor, mask: Optional[Tensor]) -> Tensor:
    """``masked_softmax`` for scores that are already -inf at the masked keys."""
    weights = torch.softmax(filled, dim=-1)
    if mask is None:
        return weights
    if torch.is_grad_enabled() and weights.requires_grad:
        return weights.masked_fill(mask, 0.0)
    return weights.masked_fill_(mask, 0.0)  # inference: in place, no extra allocation


def with_key_counts(scores: Tensor, ctx: AttentionContext) -> Tensor:
    """Scores of c identical keys, for softmax: exp(s + log c) = c * exp(s)."""
    return scores if ctx.key_counts is None else scores + ctx.key_counts.log()


# Rows at least this long find their k-th largest score with topk (unsorted, then its minimum),
# shorter ones with kthvalue: the faster of the exact ops on CPU (1,024 rows, k = 8, one thread:
# kthvalue 42 us at 16 keys where topk takes 129; at 24 keys both 244 us; at 64 keys 617 against
# 577). On CUDA topk is used at every length (kthvalue sorts there).
TOPK_FROM_KEYS = 24


def kth_largest(masked: Tensor, k: int, key_counts: Optional[Tensor] = None) -> Tensor:
    """(*, T, 1) the k-th largest of each row of ``masked`` (-inf at masked keys).

    With key counts the k-th largest is taken over the multiset (a key of count c fills
    c places). When a row has fewer than k keys the result is its smallest (possibly -inf).
    """
    num_keys = masked.size(-1)
    if key_counts is None:
        k = min(k, num_keys)
        if num_keys >= TOPK_FROM_KEYS or masked.is_cuda:  # a partial sort of k: about 4x faster than kthvalue at 512 keys (CPU)
            return masked.topk(k, dim=-1, sorted=False).values.amin(dim=-1, keepdim=True)
        # the k-th largest is the (S - k + 1)-th smallest: one kthvalue (faster for short rows)
        return masked.kthvalue(num_keys - k + 1, dim=-1, keepdim=True).values
    ranked, order = masked.sort(dim=-1, descending=True)
    filled = key_counts.expand_as(masked).gather(-1, order).cumsum(dim=-1)
    return ranked.gather(-1, (filled < k).sum(dim=-1, keepdim=True).clamp(max=num_keys - 1))


def topk_mask(scores: Tensor, mask: Optional[Tensor], k: int, key_counts: Optional[Tensor] = None) -> Optional[Tensor]:
    """Extend ``mask`` to every key below the k-th largest unmasked score of its query.

    Selection happens after the causal/padding masks, as in the Explicit Sparse
    Transformer code. k is clipped to the number of keys. Keys tied with the k-th
    score are all kept (so a row may keep more than k); when fewer than k keys are
    unmasked the threshold is -inf and every unmasked key is kept.
    """
    if key_counts is None and k >= scores.size(-1):
        return mask
    masked = _fill_masked(scores, mask, float("-inf"))
    below = masked < kth_largest(masked, k, key_counts)
    return below if mask is None else below | mask


def register_selection(name: str, reads_scores: bool = False, **options):
    """Register softmax over the keys a selection leaves, from the selection alone.

    The decorated ``select(scores, mask, ctx) -> hidden`` becomes the selection of the
    registered method, and its attention function is the masked softmax over ``~hidden``.
    """

    def wrap(select):
        def attention(scores, values, mask, ctx) -> AttentionOutput:
            weights = masked_softmax(scores, select(scores, mask, ctx))
            return _attend(weights, values, ctx), weights

        attention.__doc__ = select.__doc__
        register_attention(name, selection=select, selection_reads_scores=reads_scores, **options)(attention)
        return select

    return wrap


def visible_keys(scores, mask, ctx) -> Optional[Tensor]:
    """Softmax's selection: every key the mask leaves."""
    return mask


def topk_selection(scores, mask, ctx) -> Optional[Tensor]:
    """Top-k's selection: the k largest scores of each query among the visible keys."""
    return topk_mask(scores, mask, ctx.k, ctx.key_counts)


@register_attention("softmax", supports_key_counts=True, selection=visible_keys)
def softmax_attention(scores, values, mask, ctx) -> AttentionOutput:
    """Scaled dot-product attention (Vaswani et al., 2017)."""
    weights = masked_softmax(with_key_counts(scores, ctx), mask)
    return _attend(weights, values, ctx), weights


@register_attention("topk", uses_k=True, supports_key_counts=True, selection=topk_selection, selection_reads_scores=True)
def topk_attention(scores, values, mask, ctx) -> AttentionOutput:
    """Explicit sparse attention: softmax over the k largest scores of each query (Zhao et al., 2019)."""
    if ctx.key_counts is None and ctx.k >= scores.size(-1):
        weights = masked_softmax(scores, mask)
        return _attend(weights, values, ctx), weights
    # the same selection as topk_mask, with fewer passes over the scores (this runs every decoding step)
    masked = _fill_masked(scores, mask, float("-inf"))
    selected = masked.masked_fill(masked < kth_largest(masked, ctx.k, ctx.key_counts), float("-inf"))
    weights = softmax_of_filled(with_key_counts(selected, ctx), mask)
    return _attend(weights, values, ctx), weights


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


@register_attention("sparsemax")
def sparsemax_attention(scores, values, mask, ctx) -> AttentionOutput:
    """Sparsemax attention (Martins & Astudillo, 2016), from the entmax package."""
    weights = _entmax_family(sparsemax, scores, mask)
    return _attend(weights, values, ctx), weights


@register_attention("entmax15")
def entmax15_attention(scores, values, mask, ctx) -> AttentionOutput:
    """1.5-entmax attention (Peters et al., 2019), from the entmax package."""
    weights = _entmax_family(entmax15, scores, mask)
    return _attend(weights, values, ctx), weights


class LearnedAlpha(nn.Module):
    """One entmax alpha per head: alpha = 1 + sigmoid(p), clamped to [1.01, 2] (Correia et al., 2019)."""

    def __init__(self, num_heads: int):
        super().__init__()
        self.pre_alpha = nn.Parameter(torch.zeros(num_heads))  # alpha starts at 1.5

    def alpha(self) -> Tensor:
        return (1.0 + torch.sigmoid(self.pre_alpha.float())).clamp(1.01, 2.0)


@register_attention("entmax_alpha", build_head_params=LearnedAlpha)
def entmax_alpha_attention(scores, values, mask, ctx) -> AttentionOutput:
    """alpha-entmax attention with a learned alpha per head (entmax_bisect; Correia et al., 2019)."""
    # Expanding here (not inside entmax_bisect) lets autograd sum alpha's gradient over rows.
    alpha = ctx.head_params.alpha().view(-1, 1, 1).expand(*scores.shape[:-1], 1)
    weights = _entmax_family(entmax_bisect, scores, mask, alpha=alpha)
    return _attend(weights, values, ctx), weights


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
    num_keys, dim = values.shape[-2:]
    if values.is_contiguous() and values.shape[:-2] == indices.shape[:-1]:
        # Plain row indexing into the flattened values is several times faster than gather on CPU.
        offsets = torch.arange(0, values.numel() // dim, num_keys, device=values.device)
        rows = indices + offsets.view(*indices.shape[:-1], 1)
        return values.view(-1, dim)[rows.view(-1)].view(*indices.shape, dim)
    rows = values.expand(*indices.shape[:-1], num_keys, dim)
    return torch.gather(rows, -2, indices.unsqueeze(-1).expand(*indices.shape, dim))


def _one_hot_weights(indices: Tensor, num_keys: int) -> Tensor:
    weights = torch.zeros(*indices.shape, num_keys, dtype=torch.float32, device=indices.device)
    return weights.scatter_(-1, indices.unsqueeze(-1), 1.0)


# Counts need no handling: c identical keys have one argmax value and one value row.
@register_attention("hard", supports_key_counts=True, ties_to_first_key=True)
def hard_retrieval_attention(scores, values, mask, ctx) -> AttentionOutput:
    """Hard retrieval attention: each head reads exactly one value row (Xu et al., 2021).

    Training draws the row from the softmax (after attention dropout), or takes its
    argmax with --hard-train argmax, with a straight-through gradient. Inference takes
    the argmax of the raw masked scores and gathers: no softmax, no product with V.
    A query with no unmasked key reads a zero row.
    """
    if ctx.training:
        probs = masked_softmax(scores, mask)
        dropped = ctx.dropout(probs)
        # A row with nothing left to pick (all keys masked, or all dropped out) reads a
        # zero row, as soft attention would; multinomial needs some mass, so give it one.
        empty_rows = dropped.sum(dim=-1) == 0
        if ctx.hard_train == "argmax":
            indices = dropped.argmax(dim=-1)
        else:
            sample_from = dropped.masked_fill(empty_rows.unsqueeze(-1), 1.0)
            indices = torch.multinomial(sample_from.reshape(-1, scores.size(-1)), 1).view(sample_from.shape[:-1])
        output = _RetrieveRows.apply(dropped, values, indices)
        weights = probs
    else:
        empty_rows = None if mask is None else mask.all(dim=-1)
        if empty_rows is not None and not empty_rows.any():
            empty_rows = None  # the usual case: skip two full-size fills
        indices = _fill_masked(scores, mask, float("-inf")).argmax(dim=-1)
        output = retrieve_rows(values, indices)
        weights = _one_hot_weights(indices, scores.size(-1)) if ctx.need_weights else None
        if weights is not None and empty_rows is not None:
            weights = weights.masked_fill(empty_rows.unsqueeze(-1), 0.0)
    if empty_rows is not None:
        output = output.masked_fill(empty_rows.unsqueeze(-1), 0.0)
    return output, weights


def _rectified(activation, doc: str):
    """Build a ReLA-style function: activation of the scores, masked keys get weight 0.

    A query whose scores are all rectified to 0 attends to nothing (null attention):
    its output is exactly 0 before the output norm.
    """

    def rectified_attention(scores, values, mask, ctx) -> AttentionOutput:
        weights = _fill_masked(activation(scores), mask, 0.0)
        if ctx.key_counts is not None:  # c identical keys add up their weights
            weights = weights * ctx.key_counts
        return _attend(weights, values, ctx), weights

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
for _name, (_activation, _norm, _doc) in _RELA_VARIANTS.items():
    register_attention(_name, build_output_norm=_norm, supports_key_counts=True)(_rectified(_activation, _doc))
