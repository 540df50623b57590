"""One decoding step of hard retrieval, ReLA or top-k attention as one kernel: scores, selection and output at once.

A decoding step asks each head of each hypothesis for one query's output over its cached keys. Done
eagerly that is a chain of small kernels on (B, H, 1, S) tensors: hard retrieval scales the query,
multiplies by the keys, casts, masks, takes the argmax, computes the row offsets and gathers the
value row, and clears queries with no key (about ten launches); ReLA multiplies, rectifies, masks,
weighs by key counts, casts and multiplies by the values. On a GPU a decoding step is bound by
those launches, which is why hard retrieval, whose paper measures it 1.43x faster than softmax in
decoding, was measured slower. Here one program per (sentence, head) walks the keys in blocks:

* ``argmax``: keeps the best score and its first key (ties go to the first key, as ``torch.argmax``)
  and reads that one value row, never the others (Hard Retrieval, eq. 6);
* ``relu`` / ``leaky_relu`` / ``gelu``: accumulates activation(score) x value, with L0Drop's key
  counts as weights, and no normalisation (ReLA, eq. 3; the output norm follows in the module);
* ``topk``: holds the query's scores in one block, finds the k-th largest by k rounds of taking the
  largest (a key of count c fills c places, as ``attention.functions.kth_largest``), and takes the
  softmax over the keys at or above it (ties with the k-th all kept) times their values (Explicit
  Sparse Transformer, eq. 5). One block holds at most ``MAX_KEYS`` scores: the keys' rows are read 64 at a
  time, their scores written to a scratch row of the program's own and read back as one block (4,096 keys x
  d_h in one block took 430 s to compile for sm_80 at d_h = 256 and would not fit the registers).
* ``sparsemax`` / ``entmax15``: holds the scores in one block too and finds the threshold tau by Newton's
  method from the left (tau = max - 1, where the largest key alone has weight 1): for sparsemax each step
  is tau = (sum of the scores above tau - 1) / their number, exact once the support stops shrinking; for
  1.5-entmax (x = score / 2, weights (x - tau)_+^2) ``ENTMAX_NEWTON_STEPS`` steps, then tau solved
  exactly on the support found, the quadratic the entmax package solves after its sort. Weights are
  not renormalised, as the package's are not.

A query with no unmasked key gets a zero row, as the registered functions give it. The eager twins are
the registered functions themselves (``attention.hard_retrieval``, ``attention.rela``,
``attention.functions``' top-k): the kernel runs only where they would run with one query, no requested
weights, no attention mask, no dropout and no gradient (``SparseMultiheadAttention``), and is tested
against them under Triton's interpreter. Scores are
accumulated in float32 from the cached keys, so in half precision they may differ from the eager
product in the last bits (a near-tie of the argmax within that rounding can go the other way).

The kernel is one operation of the dispatcher (``torch.ops.fairseq_sparse.decoding_step``), so a
dispatch counter sees what a GPU launches.
"""

from typing import Optional

import torch
from torch import Tensor

from .device import triton
from .tiles import padding_and_counts, rows_of

# How the step turns scores into its output; the activation's index is the kernel's MODE.
MODES = ("argmax", "relu", "leaky_relu", "gelu", "topk", "sparsemax", "entmax15")
# Modes that hold every key of a step in one block.
ONE_BLOCK_MODES = ("topk", "sparsemax", "entmax15")
# Newton steps of the sparsemax / 1.5-entmax thresholds. Sparsemax's steps are exact once its support is
# found (each step removes the keys below the new tau); 1.5-entmax's tau is solved exactly on the support
# after them. Over 2 to 4,096 keys, score scales 0.01 to 1,000, Gaussian, ramp and log-uniform rows, both
# supports were found within 9 steps; tests/core/kernels/test_decoding_step.py checks a sample of such rows
# against the entmax package.
NEWTON_STEPS = 24
# The most cached keys a step takes in the kernel (top-k and the entmax family hold all their scores in one block);
# the module keeps the registered function beyond (a decoding step past 4,096 tokens of context).
MAX_KEYS = 4096
# Keys per block of the walks over the cache.
BLOCK_KEYS = 64

if triton is not None:
    import triton.language as tl

    @triton.jit
    def _visible_scores(keys, num_keys, batch, padding_ptr, padding_batch_stride, k_base, k_key_stride, dims, in_dim,
                        query, HAS_PADDING: tl.constexpr):
        """Which of ``keys`` are keys (in range, not padding) and their scores against ``query``."""
        visible = keys < num_keys
        if HAS_PADDING:
            padded = tl.load(padding_ptr + batch * padding_batch_stride + keys, mask=visible, other=1)
            visible = visible & (padded == 0)
        key_rows = tl.load(k_base + keys[:, None] * k_key_stride + dims[None, :],
                           mask=visible[:, None] & in_dim[None, :], other=0.0)
        return visible, tl.sum(key_rows.to(tl.float32) * query[None, :], axis=1)

    @triton.jit
    def _counts_of(keys, visible, counts_ptr, batch, counts_batch_stride, HAS_COUNTS: tl.constexpr):
        """L0Drop's key counts of ``keys`` (1 without), 0 where a key is hidden."""
        counts = tl.where(visible, 1.0, 0.0)
        if HAS_COUNTS:
            counts = tl.load(counts_ptr + batch * counts_batch_stride + keys, mask=visible, other=0.0)
        return counts

    @triton.jit
    def _topk_threshold(scores, visible, keys, counts_ptr, batch, counts_batch_stride, attended,
                        HAS_COUNTS: tl.constexpr):
        """Over every key's score (-inf at hidden keys): the k-th largest over the multiset of counted keys (each
        round takes the largest key left, which fills its count), the largest score (0 without a visible key: no
        weight and no NaN) and the softmax's normaliser over the keys at or above the k-th."""
        counts = _counts_of(keys, visible, counts_ptr, batch, counts_batch_stride, HAS_COUNTS)
        remaining = scores
        kth = tl.full((), float("-inf"), tl.float32)
        filled = tl.zeros((), tl.float32)
        for _ in range(0, attended):
            largest = tl.max(remaining, axis=0)
            taken = keys == tl.argmax(remaining, axis=0, tie_break_left=True)
            kth = tl.where(filled < attended, largest, kth)
            filled += tl.sum(tl.where(taken, counts, 0.0), axis=0)
            remaining = tl.where(taken, float("-inf"), remaining)
        top = tl.max(scores, axis=0)
        top = tl.where(top > float("-inf"), top, 0.0)
        norm = tl.sum(tl.where(visible & (scores >= kth), tl.exp(scores - top), 0.0) * counts, axis=0)
        return kth, top, norm

    @triton.jit
    def _entmax_threshold(scores, visible, ENTMAX15: tl.constexpr, STEPS: tl.constexpr):
        """Over every key's score (-inf at hidden keys): the shift (the largest, halved for 1.5-entmax) and the
        threshold tau of sparsemax or 1.5-entmax, whose weights are (x - tau)_+ or (x - tau)_+^2 of x = the
        (halved) score minus the shift."""
        x = scores
        if ENTMAX15:
            x = scores * 0.5
        top = tl.max(x, axis=0)
        top = tl.where(top > float("-inf"), top, 0.0)
        x = tl.where(visible, x - top, float("-inf"))  # the largest is 0, as the package shifts it
        tau = tl.full((), -1.0, tl.float32)
        for _ in range(STEPS):
            above = x > tau
            excess = tl.where(above, x - tau, 0.0)
            size = tl.sum(above.to(tl.float32), axis=0)
            if ENTMAX15:  # f(tau) = sum excess^2 - 1, f'(tau) = -2 sum excess
                tau = tau + (tl.sum(excess * excess, axis=0) - 1.0) / tl.maximum(2.0 * tl.sum(excess, axis=0), 1e-30)
            else:  # f(tau) = sum excess - 1 on the current support: its root, exactly
                tau = (tl.sum(tl.where(above, x, 0.0), axis=0) - 1.0) / tl.maximum(size, 1.0)
        if ENTMAX15:  # tau solved on the support: size tau^2 - 2 s1 tau + s2 - 1 = 0, the smaller root
            above = x > tau
            size = tl.maximum(tl.sum(above.to(tl.float32), axis=0), 1.0)
            mean = tl.sum(tl.where(above, x, 0.0), axis=0) / size
            mean_square = tl.sum(tl.where(above, x * x, 0.0), axis=0) / size
            tau = mean - tl.sqrt(tl.maximum(mean * mean - mean_square + 1.0 / size, 0.0))
        return top, tau

    @triton.jit
    def _decoding_step(q_ptr, k_ptr, v_ptr, padding_ptr, counts_ptr, scores_ptr, out_ptr,
                       num_keys, heads, head_dim, scaling, attended,
                       q_batch_stride, q_head_stride, k_batch_stride, k_head_stride, k_key_stride,
                       v_batch_stride, v_head_stride, v_key_stride, padding_batch_stride, counts_batch_stride,
                       out_batch_stride, out_head_stride,
                       MODE: tl.constexpr, HAS_PADDING: tl.constexpr, HAS_COUNTS: tl.constexpr,
                       NEWTON_STEPS: tl.constexpr, BLOCK_KEYS: tl.constexpr, SCORE_SLOTS: tl.constexpr,
                       BLOCK_DIM: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)  # sentence x head; 64 bits, so that every offset below is
        batch = row // heads
        head = row % heads
        dims = tl.arange(0, BLOCK_DIM)
        in_dim = dims < head_dim
        query = tl.load(q_ptr + batch * q_batch_stride + head * q_head_stride + dims, mask=in_dim, other=0.0)
        query = (query * scaling).to(q_ptr.dtype.element_ty).to(tl.float32)  # the module's q * scaling
        k_base = k_ptr + batch * k_batch_stride + head * k_head_stride
        v_base = v_ptr + batch * v_batch_stride + head * v_head_stride
        best = tl.full((), float("-inf"), tl.float32)
        best_key = tl.zeros((), tl.int64)
        total = tl.zeros((BLOCK_DIM,), tl.float32)
        if MODE >= 4:  # top-k, sparsemax, 1.5-entmax: a threshold over every key's score (SCORE_SLOTS >= num_keys)
            # the scores of every key block into this row of the scratch, then all of them as one block: the keys'
            # rows are read a block at a time (every key x d_h at once did not fit the registers)
            scratch = scores_ptr + row * SCORE_SLOTS
            for start in range(0, num_keys, BLOCK_KEYS):
                keys = tl.cast(start, tl.int64) + tl.arange(0, BLOCK_KEYS)
                visible, scores = _visible_scores(keys, num_keys, batch, padding_ptr, padding_batch_stride, k_base,
                                                  k_key_stride, dims, in_dim, query, HAS_PADDING)
                tl.store(scratch + keys, tl.where(visible, scores, float("-inf")), mask=keys < num_keys)
            tl.debug_barrier()  # every thread's scores written before any thread reads them
            slots = tl.arange(0, SCORE_SLOTS)
            all_scores = tl.load(scratch + slots, mask=slots < num_keys, other=float("-inf"))
            all_visible = all_scores > float("-inf")
            if MODE == 4:
                kth, top, norm = _topk_threshold(all_scores, all_visible, slots, counts_ptr, batch, counts_batch_stride,
                                                 attended, HAS_COUNTS)
            else:
                top, tau = _entmax_threshold(all_scores, all_visible, MODE == 6, NEWTON_STEPS)
            for start in range(0, num_keys, BLOCK_KEYS):
                keys = tl.cast(start, tl.int64) + tl.arange(0, BLOCK_KEYS)
                scores = tl.load(scratch + keys, mask=keys < num_keys, other=float("-inf"))
                visible = scores > float("-inf")
                if MODE == 4:
                    counts = _counts_of(keys, visible, counts_ptr, batch, counts_batch_stride, HAS_COUNTS)
                    weights = tl.where(visible & (scores >= kth), tl.exp(scores - top), 0.0) * counts
                    weights = tl.where(norm > 0, weights / tl.where(norm > 0, norm, 1.0), 0.0)
                else:
                    x = scores
                    if MODE == 6:
                        x = scores * 0.5
                    excess = tl.where(visible & (x - top > tau), x - top - tau, 0.0)
                    weights = excess
                    if MODE == 6:
                        weights = excess * excess
                value_rows = tl.load(v_base + keys[:, None] * v_key_stride + dims[None, :],
                                     mask=visible[:, None] & in_dim[None, :], other=0.0)
                total += tl.sum(weights[:, None] * value_rows.to(tl.float32), axis=0)
        else:
            for start in range(0, num_keys, BLOCK_KEYS):
                keys = tl.cast(start, tl.int64) + tl.arange(0, BLOCK_KEYS)
                visible, scores = _visible_scores(keys, num_keys, batch, padding_ptr, padding_batch_stride, k_base,
                                                  k_key_stride, dims, in_dim, query, HAS_PADDING)
                if MODE == 0:
                    scores = tl.where(visible, scores, float("-inf"))
                    block_best = tl.max(scores, axis=0)
                    block_key = tl.argmax(scores, axis=0, tie_break_left=True)
                    better = block_best > best  # strictly: an equal score later keeps the first key
                    best_key = tl.where(better, start + block_key, best_key)
                    best = tl.where(better, block_best, best)
                else:
                    if MODE == 1:
                        weights = tl.maximum(scores, 0.0)
                    elif MODE == 2:
                        weights = tl.where(scores > 0, scores, scores * 0.01)  # F.leaky_relu's default slope
                    else:
                        weights = 0.5 * scores * (1.0 + tl.erf(scores * 0.7071067811865476))
                    weights = tl.where(visible, weights, 0.0)
                    if HAS_COUNTS:
                        weights *= tl.load(counts_ptr + batch * counts_batch_stride + keys, mask=visible, other=0.0)
                    value_rows = tl.load(v_base + keys[:, None] * v_key_stride + dims[None, :],
                                         mask=visible[:, None] & in_dim[None, :], other=0.0)
                    total += tl.sum(weights[:, None] * value_rows.to(tl.float32), axis=0)
        if MODE == 0:
            value_row = tl.load(v_base + best_key * v_key_stride + dims, mask=in_dim, other=0.0)
            total = tl.where(best > float("-inf"), value_row.to(tl.float32), 0.0)
        out = out_ptr + batch * out_batch_stride + head * out_head_stride + dims
        tl.store(out, total.to(out_ptr.dtype.element_ty), mask=in_dim)


def launch_constants(mode: str, has_padding: bool, has_counts: bool, num_keys: int, head_dim: int) -> dict:
    """The kernel's constants for a call: key blocks of 64 in every mode, and for the modes with a threshold over
    every key (top-k, sparsemax, 1.5-entmax) one scratch row of scores per program, a power of two >= the keys."""
    return dict(MODE=MODES.index(mode), HAS_PADDING=has_padding, HAS_COUNTS=has_counts, NEWTON_STEPS=NEWTON_STEPS,
                BLOCK_KEYS=BLOCK_KEYS,
                SCORE_SLOTS=triton.next_power_of_2(max(num_keys, 16)) if mode in ONE_BLOCK_MODES else 16,
                BLOCK_DIM=triton.next_power_of_2(head_dim))


def decoding_step(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Optional[Tensor], key_counts: Optional[Tensor],
                  scaling: float, attended: int, mode: str) -> Tensor:
    """One query per (sentence, head): q (B, H, 1, d), k and v (B, H, S, d), key_padding_mask (B, S) bool
    (True: not a key), key_counts (B, 1, 1, S) float or None, ``attended`` top-k's k (unused by the other
    modes) -> (B, H, 1, d) in v's dtype. At most ``MAX_KEYS`` keys."""
    batch, heads, _, head_dim = q.shape
    num_keys = k.size(2)
    q, k, v = rows_of(q), rows_of(k), rows_of(v)
    out = torch.empty((batch, heads, 1, head_dim), dtype=v.dtype, device=v.device)
    padding, counts = padding_and_counts(key_padding_mask, key_counts)
    if batch * heads > 0:
        constants = launch_constants(mode, padding is not None, counts is not None, num_keys, head_dim)
        scratch = torch.empty((batch * heads, constants["SCORE_SLOTS"]) if mode in ONE_BLOCK_MODES else (1,),
                              dtype=torch.float32, device=q.device)
        _decoding_step[(batch * heads,)](
            q, k, v, q if padding is None else padding, q if counts is None else counts, scratch, out,
            num_keys, heads, head_dim, scaling, attended,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2),
            0 if padding is None else padding.stride(0),
            0 if counts is None or counts.size(0) == 1 else counts.stride(0),
            out.stride(0), out.stride(1), **constants)
    return out


def _decoding_step_shape(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Optional[Tensor],
                         key_counts: Optional[Tensor], scaling: float, attended: int, mode: str) -> Tensor:
    return v.new_empty((q.size(0), q.size(1), 1, q.size(3)))


if triton is not None:
    decoding_step = torch.library.custom_op("fairseq_sparse::decoding_step", mutates_args=())(decoding_step)
    decoding_step.register_fake(_decoding_step_shape)
