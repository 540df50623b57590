"""Top-k attention over a whole sequence of queries as one kernel forward and two backward: the k-th largest
score of each query found tile by tile, then FlashAttention over the keys at or above it.

The Explicit Sparse Transformer (Zhao et al., 2019, eq. 5) takes the softmax over the k largest visible scores
of each query (keys tied with the k-th all kept, as ``attention.functions.topk_attention``). Eagerly, at length,
that is a gather of the selected keys a chunk of queries at a time (``modules.gathered_attention``): some 55
small kernels a chunk. Here one program per block of queries walks the keys twice:

1. the threshold: each tile's scores are computed and its k largest per query merged into k running values
   (k rounds: the tile's largest left replaces the smallest running value where it is larger), so that after
   the last tile the smallest running value is the k-th largest visible score, -inf where a query sees fewer
   than k keys (every visible key kept then, as the registered function keeps them);
2. FlashAttention's online softmax over the keys whose score is at or above that threshold.

It keeps the threshold and the log of the softmax's normaliser per query, (B, H, T) float32 each, and q, k, v
for the backward pass, which recomputes each tile's scores and selection from them (one kernel per block of
keys for dK and dV, one per block of queries for dQ, with FlashAttention's D = rowsum(dO o O)): nothing of size
(T, S) is written or kept. No gradient flows through the selection, as none flows through the registered
function's mask. Padding, fairseq's future mask and attention dropout (``tiles``) are read in the kernel;
L0Drop's key counts are not (a key of count c would fill c places of the k): such a call takes the module's
other paths. q is scaled before its product with k, in q's dtype, as the module scales it for the registered
function, so both compute one expression and exact ties are ties in both at every head size. Scores are
accumulated in float32 (float32 products in full float32 unless torch allows TF32, ``tiles.dot_precision``): in
half precision the eager path rounds the scores to half before it selects the k largest, the kernel selects from
float32 scores, closer to float64's choice (its outputs equal the registered function applied to float32 scores).
Sentence x head is grid axis 0 (axis 1 stops at 65,535 programs) and every offset is computed in 64 bits.

The kernels are ``torch.ops.fairseq_sparse.topk_attention`` and ``..._backward`` (one dispatcher operation each).
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from .device import triton
from .tiles import (block_dim, dot_precision, dropout_seed, empty_gradients, padding_and_counts,
                    qkv_strides, rows_of, sequence_tiles)

# The largest k the kernel takes (its running values are one (queries x next power of 2 of k) tile); beyond, the
# module's other paths.
MAX_K = 64

if triton is not None:
    import triton.language as tl

    from .tiles import kept_in_tile, scaled_rows as _scaled_rows, seed_of, visible_in_tile

    @triton.jit
    def _tile_scores(q, k_base, keys, dims, in_dim, k_row_stride, queries, num_queries, num_keys, batch,
                     padding_ptr, padding_batch_stride, CAUSAL: tl.constexpr, HAS_PADDING: tl.constexpr,
                     DOT_PRECISION: tl.constexpr):
        """A tile's scores (-inf at hidden keys) against the scaled q, its keys' rows and which keys are visible."""
        k = tl.load(k_base + keys[:, None] * k_row_stride + dims[None, :],
                    mask=(keys[:, None] < num_keys) & in_dim[None, :], other=0.0)
        visible = visible_in_tile(queries, keys, num_queries, num_keys, batch, padding_ptr, padding_batch_stride,
                                  CAUSAL, HAS_PADDING)
        scores = tl.where(visible, tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION), float("-inf"))
        return scores, k, visible

    @triton.jit
    def _kth_largest(q, k_base, dims, in_dim, k_row_stride, queries, num_queries, num_keys, last, batch,
                     attended, padding_ptr, padding_batch_stride, CAUSAL: tl.constexpr, HAS_PADDING: tl.constexpr,
                     DOT_PRECISION: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, K_SLOTS: tl.constexpr):
        """(BLOCK_Q,) the k-th largest visible score of each query, -inf where it sees fewer than k keys."""
        slots = tl.arange(0, K_SLOTS)
        # k running values; the slots past k stay +inf, so they are never the smallest
        best = tl.where(slots[None, :] < attended, float("-inf"), float("inf")) + tl.zeros((BLOCK_Q, K_SLOTS), tl.float32)
        for key_start in range(0, last, BLOCK_K):
            keys = tl.cast(key_start, tl.int64) + tl.arange(0, BLOCK_K)
            scores, _, _ = _tile_scores(q, k_base, keys, dims, in_dim, k_row_stride, queries, num_queries, num_keys,
                                        batch, padding_ptr, padding_batch_stride, CAUSAL, HAS_PADDING, DOT_PRECISION)
            columns = tl.arange(0, BLOCK_K)
            for _ in range(0, attended):
                largest = tl.max(scores, axis=1)
                taken = tl.argmax(scores, axis=1, tie_break_left=True)
                scores = tl.where(columns[None, :] == taken[:, None], float("-inf"), scores)
                smallest = tl.min(best, axis=1)
                replaced = tl.argmin(best, axis=1, tie_break_left=True)
                better = largest > smallest
                best = tl.where((slots[None, :] == replaced[:, None]) & better[:, None], largest[:, None], best)
        return tl.min(best, axis=1)

    @triton.jit
    def _topk_forward(q_ptr, k_ptr, v_ptr, padding_ptr, seed_ptr, out_ptr, kth_ptr, lse_ptr,
                      num_queries, num_keys, heads, head_dim, scaling, dropout_p, attended,
                      q_batch_stride, q_head_stride, q_row_stride, k_batch_stride, k_head_stride, k_row_stride,
                      v_batch_stride, v_head_stride, v_row_stride, padding_batch_stride,
                      CAUSAL: tl.constexpr, HAS_PADDING: tl.constexpr, DROPOUT: tl.constexpr,
                      DOT_PRECISION: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
                      BLOCK_DIM: tl.constexpr, K_SLOTS: tl.constexpr):
        """out: contiguous (B, H, T, D); kth and lse: contiguous (B, H, T) float32."""
        row = tl.program_id(0).to(tl.int64)  # sentence x head; 64 bits, so that every offset below is
        batch = row // heads
        head = row % heads
        start = tl.program_id(1).to(tl.int64) * BLOCK_Q
        seed = seed_of(seed_ptr, DROPOUT)
        queries = start + tl.arange(0, BLOCK_Q)
        dims = tl.arange(0, BLOCK_DIM)
        in_dim = dims < head_dim
        query_rows = (queries[:, None] < num_queries) & in_dim[None, :]
        q = _scaled_rows(q_ptr + batch * q_batch_stride + head * q_head_stride, queries, dims, in_dim, q_row_stride,
                         num_queries, scaling)
        k_base = k_ptr + batch * k_batch_stride + head * k_head_stride
        v_base = v_ptr + batch * v_batch_stride + head * v_head_stride
        last = num_keys
        if CAUSAL:
            last = tl.minimum(num_keys, start + BLOCK_Q)
        kth = _kth_largest(q, k_base, dims, in_dim, k_row_stride, queries, num_queries, num_keys, last, batch,
                           attended, padding_ptr, padding_batch_stride, CAUSAL, HAS_PADDING, DOT_PRECISION,
                           BLOCK_Q, BLOCK_K, K_SLOTS)
        top = tl.full((BLOCK_Q,), float("-inf"), tl.float32)
        norm = tl.zeros((BLOCK_Q,), tl.float32)
        total = tl.zeros((BLOCK_Q, BLOCK_DIM), tl.float32)
        for key_start in range(0, last, BLOCK_K):
            keys = tl.cast(key_start, tl.int64) + tl.arange(0, BLOCK_K)
            scores, _, _ = _tile_scores(q, k_base, keys, dims, in_dim, k_row_stride, queries, num_queries, num_keys,
                                        batch, padding_ptr, padding_batch_stride, CAUSAL, HAS_PADDING, DOT_PRECISION)
            scores = tl.where(scores >= kth[:, None], scores, float("-inf"))
            new_top = tl.maximum(top, tl.max(scores, axis=1))
            shift = tl.where(new_top > float("-inf"), new_top, 0.0)  # a query with no key yet: nothing to shift
            weights = tl.exp(scores - shift[:, None])
            rescale = tl.exp(top - shift)
            norm = norm * rescale + tl.sum(weights, axis=1)
            if DROPOUT:
                kept = kept_in_tile(seed, batch, heads, head, queries, keys, num_queries, num_keys, dropout_p)
                weights = tl.where(kept, weights / (1.0 - dropout_p), 0.0)
            v = tl.load(v_base + keys[:, None] * v_row_stride + dims[None, :],
                        mask=(keys[:, None] < num_keys) & in_dim[None, :], other=0.0)
            total = total * rescale[:, None] + tl.dot(weights.to(v.dtype), v, input_precision=DOT_PRECISION)
            top = new_top
        has_keys = norm > 0
        total = tl.where(has_keys[:, None], total / tl.where(has_keys, norm, 1.0)[:, None], 0.0)
        rows = row * num_queries + queries
        out = out_ptr + rows[:, None] * head_dim + dims[None, :]
        tl.store(out, total.to(out_ptr.dtype.element_ty), mask=query_rows)
        in_range = queries < num_queries
        tl.store(kth_ptr + rows, kth, mask=in_range)
        # log of the normaliser, +inf where a query has no key (its weights exp(s - lse) are then 0)
        tl.store(lse_ptr + rows, tl.where(has_keys, top + tl.log(tl.where(has_keys, norm, 1.0)), float("inf")),
                 mask=in_range)

    @triton.jit
    def _tile_gradients(q, k, v, grad, scores, kth, lse, delta, seed, batch, heads, head, queries, keys, num_queries,
                        num_keys, dropout_p, DROPOUT: tl.constexpr, DOT_PRECISION: tl.constexpr):
        """A tile's weights after dropout and dS = P o (dP - D), dP the gradient of the weights before dropout."""
        weights = tl.where(scores >= kth[:, None], tl.exp(scores - lse[:, None]), 0.0)
        grad_weights = tl.dot(grad, tl.trans(v), input_precision=DOT_PRECISION)
        dropped = weights
        if DROPOUT:
            kept = kept_in_tile(seed, batch, heads, head, queries, keys, num_queries, num_keys, dropout_p)
            dropped = tl.where(kept, weights / (1.0 - dropout_p), 0.0)
            grad_weights = tl.where(kept, grad_weights / (1.0 - dropout_p), 0.0)
        return dropped, weights * (grad_weights - delta[:, None])

    @triton.jit
    def _topk_backward_keys(q_ptr, k_ptr, v_ptr, padding_ptr, seed_ptr, grad_ptr, kth_ptr, lse_ptr, delta_ptr,
                            dk_ptr, dv_ptr, num_queries, num_keys, heads, head_dim, scaling, dropout_p,
                            q_batch_stride, q_head_stride, q_row_stride, k_batch_stride, k_head_stride, k_row_stride,
                            v_batch_stride, v_head_stride, v_row_stride, padding_batch_stride,
                            CAUSAL: tl.constexpr, HAS_PADDING: tl.constexpr, DROPOUT: tl.constexpr,
                            DOT_PRECISION: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
                            BLOCK_DIM: tl.constexpr):
        """dK and dV of one block of keys. grad: contiguous (B, H, T, D); dk, dv: contiguous (B, H, S, D).
        dK = dS^T (q scaling), the scaled q's product, as autograd takes it through the module's ``q * scaling``."""
        row = tl.program_id(0).to(tl.int64)
        batch = row // heads
        head = row % heads
        key_start = tl.program_id(1).to(tl.int64) * BLOCK_K
        seed = seed_of(seed_ptr, DROPOUT)
        keys = key_start + tl.arange(0, BLOCK_K)
        dims = tl.arange(0, BLOCK_DIM)
        in_dim = dims < head_dim
        key_rows = (keys[:, None] < num_keys) & in_dim[None, :]
        k_base = k_ptr + batch * k_batch_stride + head * k_head_stride
        v = tl.load(v_ptr + batch * v_batch_stride + head * v_head_stride + keys[:, None] * v_row_stride + dims[None, :],
                    mask=key_rows, other=0.0)
        q_base = q_ptr + batch * q_batch_stride + head * q_head_stride
        dk = tl.zeros((BLOCK_K, BLOCK_DIM), tl.float32)
        dv = tl.zeros((BLOCK_K, BLOCK_DIM), tl.float32)
        first = 0
        if CAUSAL:
            first = (key_start // BLOCK_Q) * BLOCK_Q
        for start in range(first, num_queries, BLOCK_Q):
            queries = tl.cast(start, tl.int64) + tl.arange(0, BLOCK_Q)
            query_rows = (queries[:, None] < num_queries) & in_dim[None, :]
            rows = row * num_queries + queries
            q = _scaled_rows(q_base, queries, dims, in_dim, q_row_stride, num_queries, scaling)
            grad = tl.load(grad_ptr + rows[:, None] * head_dim + dims[None, :], mask=query_rows, other=0.0)
            kth = tl.load(kth_ptr + rows, mask=queries < num_queries, other=float("inf"))
            lse = tl.load(lse_ptr + rows, mask=queries < num_queries, other=float("inf"))
            delta = tl.load(delta_ptr + rows, mask=queries < num_queries, other=0.0)
            scores, k, _ = _tile_scores(q, k_base, keys, dims, in_dim, k_row_stride, queries, num_queries, num_keys,
                                        batch, padding_ptr, padding_batch_stride, CAUSAL, HAS_PADDING, DOT_PRECISION)
            dropped, grad_scores = _tile_gradients(q, k, v, grad, scores, kth, lse, delta, seed, batch, heads, head,
                                                   queries, keys, num_queries, num_keys, dropout_p, DROPOUT,
                                                   DOT_PRECISION)
            dv += tl.dot(tl.trans(dropped.to(grad.dtype)), grad, input_precision=DOT_PRECISION)
            dk += tl.dot(tl.trans(grad_scores.to(q.dtype)), q, input_precision=DOT_PRECISION)
        out = (row * num_keys + keys[:, None]) * head_dim + dims[None, :]
        tl.store(dk_ptr + out, dk.to(dk_ptr.dtype.element_ty), mask=key_rows)
        tl.store(dv_ptr + out, dv.to(dv_ptr.dtype.element_ty), mask=key_rows)

    @triton.jit
    def _topk_backward_queries(q_ptr, k_ptr, v_ptr, padding_ptr, seed_ptr, grad_ptr, kth_ptr, lse_ptr, delta_ptr,
                               dq_ptr, num_queries, num_keys, heads, head_dim, scaling, dropout_p,
                               q_batch_stride, q_head_stride, q_row_stride, k_batch_stride, k_head_stride, k_row_stride,
                               v_batch_stride, v_head_stride, v_row_stride, padding_batch_stride,
                               CAUSAL: tl.constexpr, HAS_PADDING: tl.constexpr, DROPOUT: tl.constexpr,
                               DOT_PRECISION: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
                               BLOCK_DIM: tl.constexpr):
        """dQ of one block of queries. dq: contiguous (B, H, T, D)."""
        row = tl.program_id(0).to(tl.int64)
        batch = row // heads
        head = row % heads
        start = tl.program_id(1).to(tl.int64) * BLOCK_Q
        seed = seed_of(seed_ptr, DROPOUT)
        queries = start + tl.arange(0, BLOCK_Q)
        dims = tl.arange(0, BLOCK_DIM)
        in_dim = dims < head_dim
        query_rows = (queries[:, None] < num_queries) & in_dim[None, :]
        rows = row * num_queries + queries
        q = _scaled_rows(q_ptr + batch * q_batch_stride + head * q_head_stride, queries, dims, in_dim, q_row_stride,
                         num_queries, scaling)
        grad = tl.load(grad_ptr + rows[:, None] * head_dim + dims[None, :], mask=query_rows, other=0.0)
        kth = tl.load(kth_ptr + rows, mask=queries < num_queries, other=float("inf"))
        lse = tl.load(lse_ptr + rows, mask=queries < num_queries, other=float("inf"))
        delta = tl.load(delta_ptr + rows, mask=queries < num_queries, other=0.0)
        k_base = k_ptr + batch * k_batch_stride + head * k_head_stride
        v_base = v_ptr + batch * v_batch_stride + head * v_head_stride
        dq = tl.zeros((BLOCK_Q, BLOCK_DIM), tl.float32)
        last = num_keys
        if CAUSAL:
            last = tl.minimum(num_keys, start + BLOCK_Q)
        for key_start in range(0, last, BLOCK_K):
            keys = tl.cast(key_start, tl.int64) + tl.arange(0, BLOCK_K)
            scores, k, _ = _tile_scores(q, k_base, keys, dims, in_dim, k_row_stride, queries, num_queries, num_keys,
                                        batch, padding_ptr, padding_batch_stride, CAUSAL, HAS_PADDING, DOT_PRECISION)
            v = tl.load(v_base + keys[:, None] * v_row_stride + dims[None, :],
                        mask=(keys[:, None] < num_keys) & in_dim[None, :], other=0.0)
            _, grad_scores = _tile_gradients(q, k, v, grad, scores, kth, lse, delta, seed, batch, heads, head,
                                             queries, keys, num_queries, num_keys, dropout_p, DROPOUT, DOT_PRECISION)
            dq += tl.dot(grad_scores.to(k.dtype), k, input_precision=DOT_PRECISION)
        tl.store(dq_ptr + rows[:, None] * head_dim + dims[None, :], (dq * scaling).to(dq_ptr.dtype.element_ty),
                 mask=query_rows)


def _inputs(q: Tensor, k: Tensor, v: Tensor, padding: Optional[Tensor], seed: Optional[Tensor]):
    """The pointers each kernel reads first and the strides it reads last."""
    return ((q, k, v, q if padding is None else padding, q if seed is None else seed),
            (*qkv_strides(q, k, v), 0 if padding is None else padding.stride(0)))


def _constants(causal: bool, padding: Optional[Tensor], dropout_p: float, q: Tensor, tiles):
    return dict(CAUSAL=causal, HAS_PADDING=padding is not None, DROPOUT=dropout_p > 0,
                DOT_PRECISION=dot_precision(q.dtype), BLOCK_Q=tiles.block_queries, BLOCK_K=tiles.block_keys,
                BLOCK_DIM=block_dim(q.size(-1)), num_warps=tiles.num_warps, num_stages=tiles.num_stages)


def _forward(q: Tensor, k: Tensor, v: Tensor, padding: Optional[Tensor], seed: Optional[Tensor], scaling: float,
             causal: bool, dropout_p: float, attended: int) -> Tuple[Tensor, Tensor, Tensor]:
    """The output (B, H, T, d) in v's dtype, and each query's k-th largest score and log normaliser (B, H, T)."""
    q, k, v = rows_of(q), rows_of(k), rows_of(v)
    batch, heads, num_queries, head_dim = q.shape
    out = torch.empty((batch, heads, num_queries, head_dim), dtype=v.dtype, device=v.device)
    kth = torch.empty((batch, heads, num_queries), dtype=torch.float32, device=v.device)
    lse = torch.empty_like(kth)
    if out.numel() > 0:
        tiles = sequence_tiles("topk_attention", q)
        pointers, strides = _inputs(q, k, v, padding, seed)
        _topk_forward[(batch * heads, triton.cdiv(num_queries, tiles.block_queries))](
            *pointers, out, kth, lse, num_queries, k.size(2), heads, head_dim, scaling, dropout_p, attended, *strides,
            K_SLOTS=max(2, triton.next_power_of_2(attended)), **_constants(causal, padding, dropout_p, q, tiles))
    return out, kth, lse


def _backward(grad: Tensor, out: Tensor, kth: Tensor, lse: Tensor, q: Tensor, k: Tensor, v: Tensor,
              padding: Optional[Tensor], seed: Optional[Tensor], scaling: float, causal: bool,
              dropout_p: float) -> Tuple[Tensor, Tensor, Tensor]:
    """The gradients of q, k and v for the output gradient ``grad``."""
    q, k, v = rows_of(q), rows_of(k), rows_of(v)
    grad = grad.contiguous()
    batch, heads, num_queries, head_dim = q.shape
    dq, dk, dv = empty_gradients(q, k, v)
    if batch * heads == 0:
        return dq, dk, dv
    delta = (grad.float() * out.float()).sum(-1)  # FlashAttention's D: rowsum(dO o O), O after dropout
    tiles = sequence_tiles("topk_attention", q)
    pointers, strides = _inputs(q, k, v, padding, seed)
    constants = _constants(causal, padding, dropout_p, q, tiles)
    if k.size(2) > 0:
        _topk_backward_keys[(batch * heads, triton.cdiv(k.size(2), tiles.block_keys))](
            *pointers, grad, kth, lse, delta, dk, dv, num_queries, k.size(2), heads, head_dim, scaling, dropout_p,
            *strides, **constants)
    if num_queries > 0:
        _topk_backward_queries[(batch * heads, triton.cdiv(num_queries, tiles.block_queries))](
            *pointers, grad, kth, lse, delta, dq, num_queries, k.size(2), heads, head_dim, scaling, dropout_p,
            *strides, **constants)
    return dq, dk, dv


if triton is not None:
    _forward_op = torch.library.custom_op("fairseq_sparse::topk_attention", mutates_args=())(_forward)
    _backward_op = torch.library.custom_op("fairseq_sparse::topk_attention_backward", mutates_args=())(_backward)

    @_forward_op.register_fake
    def _forward_shape(q, k, v, padding, seed, scaling, causal, dropout_p, attended):
        rows = q.shape[:3]
        return v.new_empty(q.shape), q.new_empty(rows, dtype=torch.float32), q.new_empty(rows, dtype=torch.float32)

    @_backward_op.register_fake
    def _backward_shape(grad, out, kth, lse, q, k, v, padding, seed, scaling, causal, dropout_p):
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)

    def _save_for_backward(ctx, inputs, output):
        q, k, v, padding, seed, ctx.scaling, ctx.causal, ctx.dropout_p, _ = inputs
        out, kth, lse = output
        ctx.save_for_backward(out, kth, lse, q, k, v, padding, seed)
        ctx.mark_non_differentiable(kth, lse)

    def _differentiate(ctx, grad, _kth_grad, _lse_grad):
        out, kth, lse, q, k, v, padding, seed = ctx.saved_tensors
        dq, dk, dv = _backward_op(grad, out, kth, lse, q, k, v, padding, seed, ctx.scaling, ctx.causal, ctx.dropout_p)
        return dq, dk, dv, None, None, None, None, None, None

    _forward_op.register_autograd(_differentiate, setup_context=_save_for_backward)
else:
    _forward_op = _forward


def takes_kernel(key_counts: Optional[Tensor], attended: int) -> bool:
    """Whether the kernel computes a call: no key counts (L0Drop's counted memory), k at most ``MAX_K``."""
    return key_counts is None and attended <= MAX_K



def topk_attention(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Optional[Tensor], key_counts: Optional[Tensor],
                   scaling: float, causal: bool, dropout_p: float, attended: int) -> Tensor:
    """Top-k attention for every query: q (B, H, T, d) unscaled, k and v (B, H, S, d), key_padding_mask (B, S) bool
    or None, ``attended`` the k, ``causal``: query i sees keys j <= i (T == S) -> (B, H, T, d) in v's dtype,
    differentiable in q, k and v. ``key_counts`` must be None (``takes_kernel``)."""
    assert takes_kernel(key_counts, attended), "the top-k kernel reads no key counts and takes k <= MAX_K"
    padding, _ = padding_and_counts(key_padding_mask, None)
    seed = dropout_seed(q.device) if dropout_p > 0 else None
    return _forward_op(q, k, v, padding, seed, scaling, causal, dropout_p, attended)[0]
