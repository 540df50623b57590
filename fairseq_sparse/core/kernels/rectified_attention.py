"""ReLA's attention over a whole sequence of queries as one kernel forward and two backward, FlashAttention-style.

ReLA (Zhang et al., 2021, eq. 3) rectifies the scores and sums the values they weigh, with no
normalisation over the keys: out_i = sum_j act(q_i . k_j * scale) c_j v_j (c_j: L0Drop's key counts, 1
without). Done eagerly, the (B, H, T, S) scores and weights are kept for the backward pass, 20x stock
fairseq's memory at 4,096 tokens; cut into recomputed query chunks (``modules.function_in_chunks``) the
memory is gone but each chunk is some 30 small kernels. Here one program per block of queries walks the
keys in blocks, as FlashAttention does, and never writes a score to memory. Without softmax there is no
running maximum and no running sum to keep (nor FlashAttention's D_i = rowsum(dO o O) in the backward):
each block of keys adds act(S) V to the output, and the backward pass recomputes the block's scores
from q and k,

    dV = W^T dO,   dS = (dO V^T) o act'(S) o c,   dQ = scale dS K,   dK = scale dS^T Q,

one kernel walking key blocks for dK and dV, one walking query blocks for dQ (no atomics, so the
gradients are deterministic). What is saved for the backward pass is q, k, v and the dropout seed.

Attention dropout draws its mask in the kernel (Philox, ``tl.rand``) from one seed per call and the
entry's position, so the backward pass draws the same mask again; it is a different stream from
``F.dropout``'s, so tests compare against the registered function with the kernel's own mask
(``tiles.dropout_keep``). Keys are hidden by fairseq's padding mask and, for decoder self-attention, by its
future mask (``causal``: key j > query i); another attention mask takes the module's other paths.

q is scaled before its product with k, in q's dtype, as the module scales it for the registered function, so
both compute one expression and exact ties stay ties at every head size. Scores are accumulated in float32 from
q and k in their own dtype (float32 products in full float32 unless torch allows TF32, ``tiles.dot_precision``)
and the weights are cast to the values' dtype before their product, as the eager path casts them; in half
precision the eager path rounds the scores to half before the activation, the kernel does not (its outputs equal
the registered function applied to float32 scores). One program per (sentence x head, block of queries or keys):
sentence x head is grid axis 0 (2^31 - 1 programs; axis 1 would stop at 65,535), and every offset is computed in
64 bits. The kernel is the operation ``torch.ops.fairseq_sparse.rectified_attention``
(and ``..._backward``), so a dispatch counter sees one operation where a GPU launches one kernel.
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from .device import triton
from .tiles import (block_dim, dot_precision, dropout_seed, empty_gradients, padding_and_counts,
                    qkv_strides, rows_of, sequence_tiles)

# How the kernel rectifies the scores; the index is its MODE (the activations of ReLA's Table 1).
ACTIVATIONS = ("relu", "leaky_relu", "gelu")
# F.leaky_relu's default negative slope, which the registered function uses
LEAKY_SLOPE = 0.01

if triton is not None:
    import triton.language as tl

    from .tiles import kept_in_tile, scaled_rows as _scaled_rows, seed_of, visible_in_tile

    @triton.jit
    def _rectified(scores, MODE: tl.constexpr):
        if MODE == 0:
            return tl.maximum(scores, 0.0)
        elif MODE == 1:
            return tl.where(scores > 0, scores, scores * 0.01)
        else:
            return 0.5 * scores * (1.0 + tl.erf(scores * 0.7071067811865476))

    @triton.jit
    def _rectified_slope(scores, MODE: tl.constexpr):
        """The activation's derivative as torch's backward takes it (ReLU's and leaky ReLU's at 0: 0 and 0.01)."""
        if MODE == 0:
            return tl.where(scores > 0, 1.0, 0.0)
        elif MODE == 1:
            return tl.where(scores > 0, 1.0, 0.01)
        else:
            cdf = 0.5 * (1.0 + tl.erf(scores * 0.7071067811865476))
            return cdf + scores * 0.3989422804014327 * tl.exp(-0.5 * scores * scores)

    @triton.jit
    def _block_weights(q, k, queries, keys, num_queries, num_keys, batch, head, heads, seed, dropout_p,
                       padding_ptr, padding_batch_stride, counts_ptr, counts_batch_stride,
                       MODE: tl.constexpr, CAUSAL: tl.constexpr, HAS_PADDING: tl.constexpr,
                       HAS_COUNTS: tl.constexpr, DROPOUT: tl.constexpr, DOT_PRECISION: tl.constexpr):
        """One (queries x keys) tile of the scaled q: its scores, the weights act(s) c with hidden keys 0, the
        weights after dropout, and where the key is visible and kept (for the backward pass's slope)."""
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        visible = visible_in_tile(queries, keys, num_queries, num_keys, batch, padding_ptr, padding_batch_stride,
                                  CAUSAL, HAS_PADDING)
        weights = tl.where(visible, _rectified(scores, MODE), 0.0)
        scale = tl.where(visible, 1.0, 0.0)  # what multiplies the slope: counts, dropout's keep / (1 - p)
        if HAS_COUNTS:
            counts = tl.load(counts_ptr + batch * counts_batch_stride + keys, mask=keys < num_keys, other=0.0)
            weights = weights * counts[None, :]
            scale = scale * counts[None, :]
        dropped = weights
        if DROPOUT:
            kept = kept_in_tile(seed, batch, heads, head, queries, keys, num_queries, num_keys, dropout_p)
            dropped = tl.where(kept, weights / (1.0 - dropout_p), 0.0)
            scale = tl.where(kept, scale / (1.0 - dropout_p), 0.0)
        return scores, dropped, scale

    @triton.jit
    def _rectified_forward(q_ptr, k_ptr, v_ptr, padding_ptr, counts_ptr, seed_ptr, out_ptr,
                           num_queries, num_keys, heads, head_dim, scaling, dropout_p,
                           q_batch_stride, q_head_stride, q_row_stride, k_batch_stride, k_head_stride, k_row_stride,
                           v_batch_stride, v_head_stride, v_row_stride, padding_batch_stride, counts_batch_stride,
                           out_batch_stride, out_head_stride, out_row_stride,
                           MODE: tl.constexpr, CAUSAL: tl.constexpr, HAS_PADDING: tl.constexpr,
                           HAS_COUNTS: tl.constexpr, DROPOUT: tl.constexpr, DOT_PRECISION: tl.constexpr,
                           BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_DIM: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)  # sentence x head; 64 bits, so that every offset below is
        batch = row // heads
        head = row % heads
        start = tl.program_id(1).to(tl.int64) * BLOCK_Q
        seed = seed_of(seed_ptr, DROPOUT)
        queries = start + tl.arange(0, BLOCK_Q)
        dims = tl.arange(0, BLOCK_DIM)
        in_dim = dims < head_dim
        q = _scaled_rows(q_ptr + batch * q_batch_stride + head * q_head_stride, queries, dims, in_dim, q_row_stride,
                         num_queries, scaling)
        k_base = k_ptr + batch * k_batch_stride + head * k_head_stride
        v_base = v_ptr + batch * v_batch_stride + head * v_head_stride
        total = tl.zeros((BLOCK_Q, BLOCK_DIM), tl.float32)
        last = num_keys
        if CAUSAL:  # no key after the block's last query
            last = tl.minimum(num_keys, start + BLOCK_Q)
        for key_start in range(0, last, BLOCK_K):
            keys = tl.cast(key_start, tl.int64) + tl.arange(0, BLOCK_K)
            rows = (keys[:, None] < num_keys) & in_dim[None, :]
            k = tl.load(k_base + keys[:, None] * k_row_stride + dims[None, :], mask=rows, other=0.0)
            v = tl.load(v_base + keys[:, None] * v_row_stride + dims[None, :], mask=rows, other=0.0)
            _, dropped, _ = _block_weights(q, k, queries, keys, num_queries, num_keys, batch, head, heads, seed,
                                           dropout_p, padding_ptr, padding_batch_stride, counts_ptr, counts_batch_stride,
                                           MODE, CAUSAL, HAS_PADDING, HAS_COUNTS, DROPOUT, DOT_PRECISION)
            total += tl.dot(dropped.to(v.dtype), v, input_precision=DOT_PRECISION)
        out = out_ptr + batch * out_batch_stride + head * out_head_stride + queries[:, None] * out_row_stride + dims[None, :]
        tl.store(out, total.to(out_ptr.dtype.element_ty), mask=(queries[:, None] < num_queries) & in_dim[None, :])

    @triton.jit
    def _rectified_backward_keys(q_ptr, k_ptr, v_ptr, padding_ptr, counts_ptr, seed_ptr, grad_ptr, dk_ptr, dv_ptr,
                                 num_queries, num_keys, heads, head_dim, scaling, dropout_p,
                                 q_batch_stride, q_head_stride, q_row_stride, k_batch_stride, k_head_stride, k_row_stride,
                                 v_batch_stride, v_head_stride, v_row_stride, padding_batch_stride, counts_batch_stride,
                                 grad_batch_stride, grad_head_stride, grad_row_stride,
                                 MODE: tl.constexpr, CAUSAL: tl.constexpr, HAS_PADDING: tl.constexpr,
                                 HAS_COUNTS: tl.constexpr, DROPOUT: tl.constexpr, DOT_PRECISION: tl.constexpr,
                                 BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_DIM: tl.constexpr):
        """dK and dV of one block of keys, walking the queries that see them. dk, dv: contiguous (B, H, S, D).
        dK = dS^T (q scaling), the scaled q's product, as autograd takes it through the module's ``q * scaling``."""
        row = tl.program_id(0).to(tl.int64)
        batch = row // heads
        head = row % heads
        key_start = tl.program_id(1).to(tl.int64) * BLOCK_K
        seed = seed_of(seed_ptr, DROPOUT)
        keys = key_start + tl.arange(0, BLOCK_K)
        dims = tl.arange(0, BLOCK_DIM)
        in_dim = dims < head_dim
        rows = (keys[:, None] < num_keys) & in_dim[None, :]
        k = tl.load(k_ptr + batch * k_batch_stride + head * k_head_stride + keys[:, None] * k_row_stride + dims[None, :],
                    mask=rows, other=0.0)
        v = tl.load(v_ptr + batch * v_batch_stride + head * v_head_stride + keys[:, None] * v_row_stride + dims[None, :],
                    mask=rows, other=0.0)
        q_base = q_ptr + batch * q_batch_stride + head * q_head_stride
        grad_base = grad_ptr + batch * grad_batch_stride + head * grad_head_stride
        dk = tl.zeros((BLOCK_K, BLOCK_DIM), tl.float32)
        dv = tl.zeros((BLOCK_K, BLOCK_DIM), tl.float32)
        first = 0
        if CAUSAL:  # no query before the block's first key sees it
            first = (key_start // BLOCK_Q) * BLOCK_Q
        for start in range(first, num_queries, BLOCK_Q):
            queries = tl.cast(start, tl.int64) + tl.arange(0, BLOCK_Q)
            query_rows = (queries[:, None] < num_queries) & in_dim[None, :]
            q = _scaled_rows(q_base, queries, dims, in_dim, q_row_stride, num_queries, scaling)
            grad = tl.load(grad_base + queries[:, None] * grad_row_stride + dims[None, :], mask=query_rows, other=0.0)
            scores, dropped, scale = _block_weights(q, k, queries, keys, num_queries, num_keys, batch, head, heads,
                                                    seed, dropout_p, padding_ptr, padding_batch_stride,
                                                    counts_ptr, counts_batch_stride,
                                                    MODE, CAUSAL, HAS_PADDING, HAS_COUNTS, DROPOUT, DOT_PRECISION)
            dv += tl.dot(tl.trans(dropped.to(grad.dtype)), grad, input_precision=DOT_PRECISION)
            grad_scores = tl.dot(grad, tl.trans(v), input_precision=DOT_PRECISION) * scale * _rectified_slope(scores, MODE)
            dk += tl.dot(tl.trans(grad_scores.to(q.dtype)), q, input_precision=DOT_PRECISION)
        out = (row * num_keys + keys[:, None]) * head_dim + dims[None, :]
        tl.store(dk_ptr + out, dk.to(dk_ptr.dtype.element_ty), mask=rows)
        tl.store(dv_ptr + out, dv.to(dv_ptr.dtype.element_ty), mask=rows)

    @triton.jit
    def _rectified_backward_queries(q_ptr, k_ptr, v_ptr, padding_ptr, counts_ptr, seed_ptr, grad_ptr, dq_ptr,
                                    num_queries, num_keys, heads, head_dim, scaling, dropout_p,
                                    q_batch_stride, q_head_stride, q_row_stride, k_batch_stride, k_head_stride,
                                    k_row_stride, v_batch_stride, v_head_stride, v_row_stride, padding_batch_stride,
                                    counts_batch_stride, grad_batch_stride, grad_head_stride, grad_row_stride,
                                    MODE: tl.constexpr, CAUSAL: tl.constexpr, HAS_PADDING: tl.constexpr,
                                    HAS_COUNTS: tl.constexpr, DROPOUT: tl.constexpr, DOT_PRECISION: tl.constexpr,
                                    BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_DIM: tl.constexpr):
        """dQ of one block of queries, walking the keys they see. dq: contiguous (B, H, T, D)."""
        row = tl.program_id(0).to(tl.int64)
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
        grad = tl.load(grad_ptr + batch * grad_batch_stride + head * grad_head_stride + queries[:, None] * grad_row_stride
                       + dims[None, :], mask=query_rows, other=0.0)
        k_base = k_ptr + batch * k_batch_stride + head * k_head_stride
        v_base = v_ptr + batch * v_batch_stride + head * v_head_stride
        dq = tl.zeros((BLOCK_Q, BLOCK_DIM), tl.float32)
        last = num_keys
        if CAUSAL:
            last = tl.minimum(num_keys, start + BLOCK_Q)
        for key_start in range(0, last, BLOCK_K):
            keys = tl.cast(key_start, tl.int64) + tl.arange(0, BLOCK_K)
            rows = (keys[:, None] < num_keys) & in_dim[None, :]
            k = tl.load(k_base + keys[:, None] * k_row_stride + dims[None, :], mask=rows, other=0.0)
            v = tl.load(v_base + keys[:, None] * v_row_stride + dims[None, :], mask=rows, other=0.0)
            scores, _, scale = _block_weights(q, k, queries, keys, num_queries, num_keys, batch, head, heads,
                                              seed, dropout_p, padding_ptr, padding_batch_stride, counts_ptr,
                                              counts_batch_stride, MODE, CAUSAL, HAS_PADDING, HAS_COUNTS, DROPOUT,
                                              DOT_PRECISION)
            grad_scores = tl.dot(grad, tl.trans(v), input_precision=DOT_PRECISION) * scale * _rectified_slope(scores, MODE)
            dq += tl.dot(grad_scores.to(k.dtype), k, input_precision=DOT_PRECISION)
        out = (row * num_queries + queries[:, None]) * head_dim + dims[None, :]
        tl.store(dq_ptr + out, (dq * scaling).to(dq_ptr.dtype.element_ty), mask=query_rows)


def _launch_arguments(q: Tensor, k: Tensor, v: Tensor, padding: Optional[Tensor], counts: Optional[Tensor],
                      seed: Optional[Tensor]):
    """The pointers, sizes and strides every kernel of this module takes, in their order (after the pointers
    each kernel writes)."""
    heads, num_queries, head_dim = q.size(1), q.size(2), q.size(3)
    return ((q, k, v, q if padding is None else padding, q if counts is None else counts, q if seed is None else seed),
            (num_queries, k.size(2), heads, head_dim),
            (*qkv_strides(q, k, v), 0 if padding is None else padding.stride(0),
             0 if counts is None or counts.size(0) == 1 else counts.stride(0)))


def _constants(mode: str, causal: bool, padding, counts, dropout_p: float, q: Tensor, tiles):
    return dict(MODE=ACTIVATIONS.index(mode), CAUSAL=causal, HAS_PADDING=padding is not None,
                HAS_COUNTS=counts is not None, DROPOUT=dropout_p > 0, DOT_PRECISION=dot_precision(q.dtype),
                BLOCK_Q=tiles.block_queries, BLOCK_K=tiles.block_keys, BLOCK_DIM=block_dim(q.size(-1)),
                num_warps=tiles.num_warps, num_stages=tiles.num_stages)


def _forward(q: Tensor, k: Tensor, v: Tensor, padding: Optional[Tensor], counts: Optional[Tensor],
             seed: Optional[Tensor], scaling: float, causal: bool, dropout_p: float, mode: str) -> Tensor:
    """q (B, H, T, d), k and v (B, H, S, d), padding (B, S) bool (True: not a key) or None, counts (B|1, S)
    float or None, seed (1,) int64 on q's device where dropout_p > 0 -> (B, H, T, d) in v's dtype."""
    q, k, v = rows_of(q), rows_of(k), rows_of(v)
    batch, heads, num_queries, head_dim = q.shape
    out = torch.empty((batch, heads, num_queries, head_dim), dtype=v.dtype, device=v.device)
    if out.numel() > 0:
        tiles = sequence_tiles("rectified_attention", q)
        pointers, sizes, strides = _launch_arguments(q, k, v, padding, counts, seed)
        grid = (batch * heads, triton.cdiv(num_queries, tiles.block_queries))
        _rectified_forward[grid](*pointers, out, *sizes, scaling, dropout_p, *strides,
                                 out.stride(0), out.stride(1), out.stride(2),
                                 **_constants(mode, causal, padding, counts, dropout_p, q, tiles))
    return out


def _backward(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, padding: Optional[Tensor], counts: Optional[Tensor],
              seed: Optional[Tensor], scaling: float, causal: bool, dropout_p: float,
              mode: str) -> Tuple[Tensor, Tensor, Tensor]:
    """The gradients of q, k and v (their dtypes, contiguous) for the output gradient ``grad``, (B, H, T, d)."""
    q, k, v, grad = rows_of(q), rows_of(k), rows_of(v), rows_of(grad)
    batch, heads, num_queries, head_dim = q.shape
    dq, dk, dv = empty_gradients(q, k, v)
    if batch * heads == 0:
        return dq, dk, dv
    tiles = sequence_tiles("rectified_attention", q)
    pointers, sizes, strides = _launch_arguments(q, k, v, padding, counts, seed)
    grad_strides = (grad.stride(0), grad.stride(1), grad.stride(2))
    constants = _constants(mode, causal, padding, counts, dropout_p, q, tiles)
    if k.size(2) > 0:
        _rectified_backward_keys[(batch * heads, triton.cdiv(k.size(2), tiles.block_keys))](
            *pointers, grad, dk, dv, *sizes, scaling, dropout_p, *strides, *grad_strides, **constants)
    if num_queries > 0:
        _rectified_backward_queries[(batch * heads, triton.cdiv(num_queries, tiles.block_queries))](
            *pointers, grad, dq, *sizes, scaling, dropout_p, *strides, *grad_strides, **constants)
    return dq, dk, dv


if triton is not None:
    _forward_op = torch.library.custom_op("fairseq_sparse::rectified_attention", mutates_args=())(_forward)
    _backward_op = torch.library.custom_op("fairseq_sparse::rectified_attention_backward", mutates_args=())(_backward)

    @_forward_op.register_fake
    def _forward_shape(q, k, v, padding, counts, seed, scaling, causal, dropout_p, mode):
        return v.new_empty(q.shape)

    @_backward_op.register_fake
    def _backward_shape(grad, q, k, v, padding, counts, seed, scaling, causal, dropout_p, mode):
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)

    def _save_for_backward(ctx, inputs, output):
        q, k, v, padding, counts, seed, ctx.scaling, ctx.causal, ctx.dropout_p, ctx.mode = inputs
        ctx.save_for_backward(q, k, v, padding, counts, seed)

    def _differentiate(ctx, grad):
        q, k, v, padding, counts, seed = ctx.saved_tensors
        dq, dk, dv = _backward_op(grad, q, k, v, padding, counts, seed, ctx.scaling, ctx.causal, ctx.dropout_p, ctx.mode)
        return dq, dk, dv, None, None, None, None, None, None, None

    _forward_op.register_autograd(_differentiate, setup_context=_save_for_backward)
else:
    _forward_op = _forward


def rectified_attention(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Optional[Tensor],
                        key_counts: Optional[Tensor], scaling: float, causal: bool, dropout_p: float,
                        attended: int = 0, *, mode: str) -> Tensor:
    """ReLA's output for every query: q (B, H, T, d) unscaled, k and v (B, H, S, d), key_padding_mask (B, S)
    bool or None, key_counts (B|1, 1, 1, S) float or None, ``causal``: query i sees keys j <= i (T == S)
    -> (B, H, T, d) in v's dtype, differentiable in q, k and v. ``attended`` (top-k's k in the sequence kernels'
    common signature) is not read. Where the kernel's tiles do not fit q's device (``tiles.sequence_kernel_fits``)
    the module takes its reference path instead."""
    padding, counts = padding_and_counts(key_padding_mask, key_counts)
    seed = dropout_seed(q.device) if dropout_p > 0 else None
    return _forward_op(q, k, v, padding, counts, seed, scaling, causal, dropout_p, mode)

