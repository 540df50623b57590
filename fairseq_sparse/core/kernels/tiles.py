"""What the sequence kernels (``rectified_attention``, ``topk_attention``) share: which keys of a (queries x keys) tile
are visible, attention dropout drawn in the kernel, and the launch helpers around them (the decoding-step kernel
takes its padding and key counts as they do).

Dropout is drawn from one seed per call, drawn on the device (no host round trip), and each entry's position:
``tl.rand(seed + sentence x heads + head, query x S + key)``, so a backward pass that recomputes a tile draws the
same mask as its forward pass did. ``dropout_keep`` materialises that mask for the tests.
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from .device import triton

if triton is not None:
    import triton.language as tl

    @triton.jit
    def seed_of(seed_ptr, DROPOUT: tl.constexpr):
        """The call's dropout seed (a tensor on the device), 0 without dropout."""
        seed = tl.zeros((), tl.int64)
        if DROPOUT:
            seed = tl.load(seed_ptr)
        return seed

    @triton.jit
    def visible_in_tile(queries, keys, num_queries, num_keys, batch, padding_ptr, padding_batch_stride,
                        CAUSAL: tl.constexpr, HAS_PADDING: tl.constexpr):
        """(queries x keys) True where the key is in range, not padding and (causal) not after the query."""
        visible = (queries[:, None] < num_queries) & (keys[None, :] < num_keys)
        if CAUSAL:
            visible = visible & (keys[None, :] <= queries[:, None])
        if HAS_PADDING:
            padded = tl.load(padding_ptr + batch * padding_batch_stride + keys, mask=keys < num_keys, other=1)
            visible = visible & (padded == 0)[None, :]
        return visible

    @triton.jit
    def kept_in_tile(seed, batch, heads, head, queries, keys, num_keys, dropout_p):
        """(queries x keys) True where attention dropout keeps the weight."""
        return tl.rand(seed + batch * heads + head, queries[:, None] * num_keys + keys[None, :]) >= dropout_p

    @triton.jit
    def _dropout_keep(seed_ptr, keep_ptr, num_queries, num_keys, heads, dropout_p,
                      BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr):
        batch = tl.program_id(1) // heads
        head = tl.program_id(1) % heads
        seed = tl.load(seed_ptr)
        queries = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)
        for start in range(0, num_keys, BLOCK_K):
            keys = start + tl.arange(0, BLOCK_K)
            kept = kept_in_tile(seed, batch, heads, head, queries, keys, num_keys, dropout_p)
            out = keep_ptr + tl.program_id(1) * num_queries * num_keys + queries[:, None] * num_keys + keys[None, :]
            tl.store(out, kept, mask=(queries[:, None] < num_queries) & (keys[None, :] < num_keys))


def rows_of(x: Tensor) -> Tensor:
    """``x`` with unit stride along its last dimension (what the kernels index)."""
    return x if x.stride(-1) == 1 else x.contiguous()


def qkv_strides(q: Tensor, k: Tensor, v: Tensor) -> Tuple[int, ...]:
    """The batch, head and row strides of q, k and v, in the order the sequence kernels take them."""
    return tuple(stride for x in (q, k, v) for stride in x.stride()[:3])


def block_dim(head_dim: int) -> int:
    """The kernels' tile width over a head's dimensions: a power of two, at least ``tl.dot``'s 16."""
    return max(16, triton.next_power_of_2(head_dim))


def empty_gradients(q: Tensor, k: Tensor, v: Tensor):
    """Contiguous tensors for the gradients of q, k and v, in their dtypes (what the backward kernels write)."""
    return tuple(torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in (q, k, v))


def dropout_seed(device: torch.device) -> Tensor:
    """A seed for one call's dropout mask, drawn from torch's generator of ``device`` (no host round trip)."""
    return torch.randint(0, 2**31 - 2**20, (1,), dtype=torch.int64, device=device)  # room for seed + sentence x head


def dropout_keep(seed: Tensor, batch: int, heads: int, num_queries: int, num_keys: int, dropout_p: float) -> Tensor:
    """The entries the kernels keep under dropout with ``seed``: (B, H, T, S) bool (for tests)."""
    keep = torch.empty((batch, heads, num_queries, num_keys), dtype=torch.bool, device=seed.device)
    if keep.numel() > 0:
        _dropout_keep[(triton.cdiv(num_queries, 64), batch * heads)](seed, keep, num_queries, num_keys, heads, dropout_p,
                                                                     BLOCK_Q=64, BLOCK_K=64)
    return keep


def padding_and_counts(key_padding_mask: Optional[Tensor], key_counts: Optional[Tensor]):
    """fairseq's padding mask (B, S) and the module's key counts (B|1, 1, 1, S) as the kernels read them."""
    counts = None if key_counts is None else rows_of(key_counts.reshape(key_counts.size(0), -1).float())
    padding = None if key_padding_mask is None else rows_of(key_padding_mask)
    return padding, counts
