"""Softmax over a few gathered keys per query: top-k and the structured patterns at length.

Once a query's n selected keys are known (n = k for top-k, about 2k for a window), its
weights need only their n key rows and its output only their n value rows: gather them,
n scores, a softmax over n, a weighted sum. The backward pass needs the same rows and the
saved weights, so it costs O(T x n x d) where dense attention's products cost O(T x S x d),
and nothing of size (T, S) is kept for it: per query, n key indices, n float32 weights and
(with attention dropout) n kept-or-dropped bits.

The selection itself is found a chunk of queries at a time (``Selection``):

* top-k: the chunk's scores once (one (Tc, S) product; under a causal mask only the keys
  up to the chunk's last query), then ``torch.topk``. Keys tied with the k-th score are
  all kept, as ``attention.functions.topk_mask`` keeps them: on the CPU the chunk's n grows
  to the widest tie; on a GPU, where reading that width would stall the host every chunk,
  n is k + TIE_SLOTS (a wider tie keeps TIE_SLOTS of its extra keys: exact float ties of
  more than TIE_SLOTS + 1 keys at the k-th score);
* a pattern with a ``selection_band`` (block, window, dilated): its own rule evaluated on
  the keys within ``band(k)`` real-token positions of each query, O(T x band);
* any other selection (global, random, bigbird, Top-k OOW): its rule over the chunk's keys,
  the selected keys then packed into n index slots (n: the chunk's widest row). Only where
  the host reads that width for free (the CPU): on a GPU these run in query chunks
  (``selected_softmax``) instead.

Outputs and gradients are those of the registered functions to float rounding
(tests/core/modules/test_gathered_attention.py). With attention dropout the n weights of a
query are dropped independently with probability p, as dense dropout drops them (the
random numbers differ from the dense path's: it draws S of them per query).
"""

import copy
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import torch
from torch import Tensor

from .selected_softmax import float32_gradients

_NEG_INF = float("-inf")
# Query chunks of the gathered path hold at most this many float32 entries each, per device type:
# the (B x H x Tc x S) scores of a chunk that reads them, or its (B x H x Tc x n x d) gathered rows.
# CPU (top-k self-attention, 8 heads, 512-d, forward + backward, one thread): 2**18 / 2**19 / 2**20
# entries peak at 11.7 / 13.1 / 18.8 MiB in 57 / 53 / 52 ms at 512 tokens, 76 MiB in 1.09 / 1.14 / 1.04 s at 4096.
# CUDA: a chunk is a few small kernels and a host synchronisation (top-k's tie width, a pattern's
# slot count); with 2**19 entries an H100 waited on Python (results/bench/gpu_h100.md).
GATHER_CHUNK_ELEMENTS = {"cpu": 2**19, "cuda": 2**23}


# Extra slots a top-k query keeps for keys tied with its k-th score where the tie's width is not read
# (a GPU; see the module's docstring).
TIE_SLOTS = 4


def host_reads_values(device: torch.device) -> bool:
    """True where the host reads a tensor's value without waiting for a device (the CPU): the
    gathered path then sizes its slots exactly. Elsewhere every size is fixed in advance."""
    return device.type == "cpu"


def chunk_elements(device: torch.device) -> int:
    """The gathered path's chunk budget (float32 entries) on ``device``."""
    return GATHER_CHUNK_ELEMENTS.get(device.type, GATHER_CHUNK_ELEMENTS["cpu"])


@dataclass
class Selection:
    """The keys one chunk of Tc queries attends to, n slots a query.

    indices: (B|1, H|1, Tc, n) long key index of each slot (a valid index even when empty);
    empty:   (B|1, H|1, Tc, n) bool, True for a slot holding no key;
    scores:  (B, H, Tc, n) float32 scaled scores of the slots when the selection read them
             (top-k), else None: the kernel computes them from the gathered keys.
    """

    indices: Tensor
    empty: Tensor
    scores: Optional[Tensor] = None


@dataclass
class GatherPlan:
    """rows: query slices; select(rows) -> Selection; scale: q's scaling; dropout_p: attention dropout."""

    rows: List[slice]
    select: Callable[[slice], Selection]
    scale: float
    dropout_p: float


def dropout_keep(weights: Tensor, p: float) -> Tensor:
    """bool, like ``weights``: True where a weight survives attention dropout (probability 1 - p)."""
    return torch.empty_like(weights).bernoulli_(1.0 - p).bool()


def as_rows(x: Tensor) -> Tuple[Tensor, Tensor, int]:
    """(B, H, S, d) as a (N, d) table of rows, sharing x's memory when its layout is a permuted
    dense one (fairseq's heads are a permuted view of (S, B, H, d)); the row of (b, h, s) is
    ``first[b, h] + s * step``. Returns (rows, first (B, H, 1, 1), step)."""
    order = sorted(range(3), key=lambda i: -x.stride(i))
    if x.stride(-1) != 1 or not x.permute(*order, 3).is_contiguous():
        x, order = x.contiguous(), [0, 1, 2]
    rows = x.permute(*order, 3).reshape(-1, x.size(-1))  # a view: no copy
    row_strides = [x.stride(i) // x.size(-1) for i in range(3)]
    first = (torch.arange(x.size(0), device=x.device) * row_strides[0]).view(-1, 1, 1, 1) + (
        torch.arange(x.size(1), device=x.device) * row_strides[1]).view(1, -1, 1, 1)
    return rows, first, row_strides[2]


def _slices(selection: Selection, rows: slice, per_slot: int) -> List[Tuple[slice, Selection]]:
    """Cut a chunk's selection into query slices of at most ``chunk_elements`` gathered entries each."""
    num_queries = rows.stop - rows.start
    step = max(1, chunk_elements(selection.indices.device) // max(1, per_slot * selection.indices.size(-1)))
    if step >= num_queries:
        return [(rows, selection)]
    parts = []
    for start in range(0, num_queries, step):
        part = slice(start, min(start + step, num_queries))
        scores = None if selection.scores is None else selection.scores[..., part, :]
        parts.append((slice(rows.start + part.start, rows.start + part.stop),
                      Selection(selection.indices[..., part, :], selection.empty[..., part, :], scores)))
    return parts


class GatheredSoftmax(torch.autograd.Function):
    """out = softmax over each query's selected keys of (scale q) k^T, times v.

    q: (B, H, T, d), not yet scaled; k: (B, H, S, d); v: (B, H, S, d_v). Returns (B, H, T, d_v)
    in v's dtype (a permuted view of (T, B, H, d_v), fairseq's layout). A query whose slots are
    all empty gets output 0 and no gradient.
    """

    @staticmethod
    def forward(fctx, q: Tensor, k: Tensor, v: Tensor, plan: GatherPlan) -> Tensor:
        bsz, heads, num_queries, _ = q.shape
        key_rows, key_first, key_step = as_rows(k)
        value_rows, value_first, value_step = as_rows(v)
        out = v.new_empty(num_queries, bsz, heads, v.size(-1)).permute(1, 2, 0, 3)
        saved = []
        for chunk in plan.rows:
            for rows, selection in _slices(plan.select(chunk), chunk, bsz * heads * k.size(-1)):
                shape = (bsz, heads, rows.stop - rows.start, selection.indices.size(-1))
                key_index = (key_first + selection.indices * key_step).expand(shape)
                value_index = (value_first + selection.indices * value_step).expand(shape)
                scores = selection.scores
                if scores is None:
                    queries = q[:, :, rows] * plan.scale
                    scores = torch.matmul(key_rows[key_index], queries.unsqueeze(-1)).squeeze(-1).float()
                scores = scores.masked_fill(selection.empty, _NEG_INF)
                # a query with every slot empty: softmax of -inf only is NaN, replaced by 0
                weights = torch.softmax(scores, dim=-1).masked_fill(selection.empty, 0.0)
                keep, dropped = None, weights
                if plan.dropout_p > 0:
                    keep = dropout_keep(weights, plan.dropout_p)
                    dropped = weights * keep / (1.0 - plan.dropout_p)
                out[:, :, rows] = torch.matmul(dropped.to(v.dtype).unsqueeze(-2), value_rows[value_index]).squeeze(-2)
                saved.append((rows, selection.indices, weights, keep))  # a pattern's indices: one per head group
        fctx.plan, fctx.saved = plan, saved
        fctx.save_for_backward(q, k, v)
        return out

    @staticmethod
    def backward(fctx, grad_out: Tensor):
        q, k, v = fctx.saved_tensors
        plan = fctx.plan
        (key_rows, key_first, key_step), (value_rows, value_first, value_step) = as_rows(k), as_rows(v)
        key_rows, value_rows = key_rows.float(), value_rows.float()
        grad_q, grad_k, grad_v = float32_gradients(q, k, v)
        # the gradients have the layouts of k and v, so their rows are numbered alike
        grad_key_rows, grad_value_rows = as_rows(grad_k)[0], as_rows(grad_v)[0]
        for rows, indices, weights, keep in fctx.saved:
            key_index = (key_first + indices * key_step).expand(weights.shape)
            value_index = (value_first + indices * value_step).expand(weights.shape)
            grad_rows = grad_out[:, :, rows].float()  # (B, H, Tc, d_v)
            dropped = weights
            grad_weights = torch.matmul(value_rows[value_index], grad_rows.unsqueeze(-1)).squeeze(-1)
            if keep is not None:
                scale = keep / (1.0 - plan.dropout_p)
                dropped, grad_weights = weights * scale, grad_weights * scale
            grad_value_rows.index_add_(0, value_index.reshape(-1),
                                       (dropped.unsqueeze(-1) * grad_rows.unsqueeze(-2)).flatten(0, -2))
            # softmax backward over the slots; empty slots have weight 0 and get no gradient
            grad_scores = weights * (grad_weights - (grad_weights * weights).sum(dim=-1, keepdim=True))
            grad_q[:, :, rows] = torch.matmul(grad_scores.unsqueeze(-2), key_rows[key_index]).squeeze(-2) * plan.scale
            queries = q[:, :, rows].float() * plan.scale
            grad_key_rows.index_add_(0, key_index.reshape(-1),
                                     (grad_scores.unsqueeze(-1) * queries.unsqueeze(-2)).flatten(0, -2))
        return grad_q.to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype), None


def topk_selection(q: Tensor, k: Tensor, rows: slice, hidden: Optional[Tensor], num_top: int, scale: float,
                   causal: bool) -> Selection:
    """Top-k of one query chunk: the k largest scores among the visible keys, ties at the k-th kept.

    q: (B, H, T, d) unscaled; k: (B, H, S, d); hidden: bool (B|1, 1, Tc, S) or None (the chunk's
    mask). Under a plain causal mask (``causal``) keys after the chunk's last query are never
    visible and are not scored.
    """
    last_key = rows.stop if causal else k.size(2)
    scores = torch.matmul(q[:, :, rows] * scale, k[:, :, :last_key].transpose(-1, -2)).float()
    if hidden is not None:
        scores.masked_fill_(hidden[..., :last_key], _NEG_INF)
    width = min(num_top, last_key)
    if not host_reads_values(scores.device):
        values, indices = scores.topk(min(width + TIE_SLOTS, last_key), dim=-1, sorted=True)
        values = values.masked_fill(values < values[..., width - 1:width], _NEG_INF)
        return Selection(indices=indices, empty=values == _NEG_INF, scores=values)
    values, indices = scores.topk(width, dim=-1, sorted=True)
    if width < last_key:
        kth = values[..., -1:]
        # a row with fewer than k visible keys has kth = -inf and keeps them all: no tie to widen
        widest = int((scores >= kth).sum(dim=-1, keepdim=True).masked_fill_(kth == _NEG_INF, 0).max())
        if widest > width:  # ties at the k-th score: every tied key is kept, as topk_mask does
            values, indices = scores.topk(widest, dim=-1, sorted=True)
            values = values.masked_fill(values < kth, _NEG_INF)
    return Selection(indices=indices, empty=values == _NEG_INF, scores=values)


def pack_selected(selected: Tensor, width: Optional[int] = None) -> Selection:
    """Selected keys (bool (..., Tc, S)) as ``width`` index slots in key order; without a width,
    as many as the widest row's count (read on the host)."""
    counts = selected.sum(dim=-1, keepdim=True)
    if width is None:
        width = max(1, int(counts.max()))
    # the unselected go to a spare slot (and so would keys past a declared width)
    slot = torch.where(selected, (selected.long().cumsum(dim=-1) - 1).clamp(max=width), width)
    indices = torch.zeros(*selected.shape[:-1], width + 1, dtype=torch.long, device=selected.device)
    key_index = torch.arange(selected.size(-1), device=selected.device).expand_as(slot)
    indices.scatter_(-1, slot, key_index)
    empty = torch.arange(width, device=selected.device) >= counts
    return Selection(indices=indices[..., :width], empty=empty)


def band_candidates(query_positions: Tensor, key_table: Tensor, num_real: Tensor, query_index: Tensor,
                    width: int, causal: bool, num_keys: int):
    """The keys within ``width`` real-token positions of each query, for a banded pattern.

    query_positions: (B|1, 1, Tc) real-token positions; key_table, num_real: each sentence's
    real keys' tensor indices and their number (``real_key_table``); query_index: (Tc,) tensor
    index of each query (the causal mask compares tensor indices). Returns key indices
    (B|1, 1, Tc, C), their positions and a bool (B|1, 1, Tc, C) hiding candidates that are
    padding, out of range or in the future.
    """
    offsets = torch.arange(-width, width + 1, device=query_positions.device)
    positions = query_positions.unsqueeze(-1) + offsets  # (B|1, 1, Tc, C)
    hidden = (positions < 0) | (positions >= num_real.unsqueeze(-1))
    table = key_table.unsqueeze(-2).expand(*positions.shape[:-1], key_table.size(-1))
    indices = table.gather(-1, positions.clamp(0, num_keys - 1))
    if causal:
        hidden = hidden | (indices > query_index.view(1, 1, -1, 1))
    return indices, positions, hidden


def query_chunks(num_queries: int, per_query: int, device: torch.device) -> List[slice]:
    chunk = max(1, chunk_elements(device) // max(1, per_query))
    return [slice(start, min(start + chunk, num_queries)) for start in range(0, num_queries, chunk)]


def real_key_table(key_padding_mask: Optional[Tensor], num_keys: int, device) -> Tuple[Tensor, Tensor]:
    """(tensor index of each sentence's real keys in order, (B|1, 1, S); their number, (B|1, 1, 1)).

    Entry p of a row is the index of that sentence's p-th real key (entries past its real keys
    are S - 1, and hidden by the band's range check), for padding anywhere: no value is read on
    the host.
    """
    if key_padding_mask is None:
        return (torch.arange(num_keys, device=device).view(1, 1, -1),
                torch.full((1, 1, 1), num_keys, dtype=torch.long, device=device))
    real = ~key_padding_mask
    position = real.long().cumsum(dim=-1) - 1
    slot = torch.where(real, position, num_keys)  # padding keys write to a spare column
    index = torch.arange(num_keys, device=device).expand_as(slot)
    table = torch.full((real.size(0), num_keys + 1), num_keys - 1, dtype=torch.long, device=device)
    table.scatter_(-1, slot, index)
    return table[:, None, :num_keys], real.sum(dim=-1).view(-1, 1, 1)


def plan_gathered(spec, q: Tensor, k: Tensor, ctx, causal: bool, mask_rows: Callable[[slice], Optional[Tensor]],
                  context_rows: Callable[[slice], object], key_padding_mask: Optional[Tensor], scale: float,
                  dropout_p: float) -> Optional[GatherPlan]:
    """How ``GatheredSoftmax`` finds ``spec``'s selection chunk by chunk, or None where it cannot.

    q: (B, H, T, d) unscaled; k: (B, H, S, d); ctx: the call's AttentionContext (positions
    filled in for patterns); causal: the mask is exactly fairseq's causal mask (T == S);
    mask_rows(rows): the chunk's hidden keys (B|1, 1, Tc, S) or None. Top-k reads the scores
    once; a banded pattern evaluates its band; any other selection its dense rule.
    """
    bsz, heads, num_queries, head_dim = q.shape
    num_keys = k.size(2)
    if spec.selection_is_top_k:
        width = min(ctx.k, num_keys)
        rows = query_chunks(num_queries, max(bsz * heads * num_keys, bsz * heads * width * head_dim), q.device)
        select = lambda r: topk_selection(q, k, r, mask_rows(r), ctx.k, scale, causal)  # noqa: E731
        return GatherPlan(rows=rows, select=select, scale=scale, dropout_p=dropout_p)
    band = spec.selection_band(ctx.k) if spec.selection_band is not None else None
    if band is not None:
        if num_queries != num_keys:
            return None
        key_table, num_real = real_key_table(key_padding_mask, num_keys, q.device)
        slots = min(spec.selection_width(ctx.k), 2 * band + 1) if spec.selection_width is not None else None
        if slots is None and not host_reads_values(q.device):
            slots = 2 * band + 1
        rows = query_chunks(num_queries, bsz * heads * (2 * band + 1) * head_dim, q.device)

        def select_band(r: slice) -> Selection:
            query_positions = ctx.query_positions[..., r]
            query_index = torch.arange(r.start, r.stop, device=q.device)
            indices, positions, hidden = band_candidates(query_positions, key_table, num_real, query_index, band,
                                                         causal, num_keys)
            rule_ctx = copy.copy(ctx)
            rule_ctx.query_positions, rule_ctx.key_positions = query_positions, positions
            placeholder = q.new_zeros(()).expand(hidden.shape)
            selected = pack_selected(~spec.selection(placeholder, hidden, rule_ctx), slots)  # k of the 2 band + 1
            return Selection(indices=indices.gather(-1, selected.indices), empty=selected.empty)

        return GatherPlan(rows=rows, select=select_band, scale=scale, dropout_p=dropout_p)
    if not host_reads_values(q.device):
        return None  # packing a dense rule's keys needs its widest row's count: query chunks instead
    rows = query_chunks(num_queries, bsz * heads * num_keys, q.device)

    def select_dense(r: slice) -> Selection:
        chunk_ctx = context_rows(r)
        if spec.selection_reads_scores:
            scores = torch.matmul(q[:, :, r] * scale, k.transpose(-1, -2)).float()
            selection = pack_selected(~spec.selection(scores, mask_rows(r), chunk_ctx).expand_as(scores))
            selection.scores = scores.gather(-1, selection.indices)
            return selection
        placeholder = q.new_zeros(()).expand(q.size(0), 1, r.stop - r.start, num_keys)
        return pack_selected(~spec.selection(placeholder, mask_rows(r), chunk_ctx).expand_as(placeholder))

    return GatherPlan(rows=rows, select=select_dense, scale=scale, dropout_p=dropout_p)
