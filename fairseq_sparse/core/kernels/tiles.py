"""What the sequence kernels (``rectified_attention``, ``topk_attention``) share: which keys of a (queries x keys) tile
are visible, attention dropout drawn in the kernel, the tiles each GPU gets, the precision of float32 products, and
the launch helpers around them (the decoding-step kernel takes its padding and key counts as they do).

Dropout is drawn from one seed per call, drawn on the device (no host round trip), and each entry's position in the
call, ``tl.rand(seed, (row x T + query) x S + key)`` with row = sentence x heads + head and the position in 64 bits:
a backward pass that recomputes a tile draws the same mask as its forward pass did, no two entries of a call share a
position (a 32-bit ``query x S + key`` wrapped at T x S = 2^32), and the seed is Philox's key, never added to a
position (``seed + row`` made call s's row r + 1 the stream of call s + 1's row r). ``dropout_keep`` materialises
the mask for the tests, ``dropout_keep_at`` a few of its entries at any position.

Tiles. A sequence kernel's program holds a few (queries x head tile) and (keys x head tile) blocks in shared memory
for ``tl.dot``; how many bytes that is depends on the block sizes, the head tile, the element size and the
architecture's layouts, and each GPU caps it per block (``SHARED_MEMORY_LIMIT``). ``SEQUENCE_TILES`` is our own
table, (architecture, element size, head tile) -> block sizes, rather than Triton's autotuning: the choice must be
known before the call (where nothing fits, the module takes the chunked reference path instead, and autotuning
would only find that out by failing at launch), it must be the same for every length (autotuning keyed on lengths
benchmarks again for each new one), and a table can be checked on a machine without a GPU:
``tests/core/kernels/test_shared_memory.py`` compiles every kernel with its entry for every architecture, dtype and
head size, and checks the compiled kernel's shared memory against the card's limit. ``python -m
fairseq_sparse.core.kernels.tile_search search`` compiles the candidates and prints the table.
"""

import logging
import warnings
from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from .device import triton

logger = logging.getLogger(__name__)

# Shared memory a block may use (opt-in), per compute capability: T4 64 KB; A100 (and Jetson Orin) 163 KB; RTX 30xx,
# A10, RTX 40xx, L4, L40 99 KB; H100/H200 227 KB (CUDA C programming guide, "Technical specifications per compute
# capability").
SHARED_MEMORY_LIMIT = {75: 64 * 1024, 80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024}
# The head tile of a sequence kernel: a power of two from tl.dot's 16 up to d_h 256 (beyond, no kernel).
HEAD_TILES = (16, 32, 64, 128, 256)


class Tiles(NamedTuple):
    """How a sequence kernel is launched: queries and keys per block, Triton's warps and software-pipeline stages."""

    block_queries: int
    block_keys: int
    num_warps: int = 4
    num_stages: int = 2


def _table(entries: str):
    """'arch bytes head_tile block_q block_k' lines -> {(arch, bytes, head_tile): Tiles or None}; block sizes 0: none
    fits, the reference path. sm_75 has no cp.async to pipeline loads with: one stage there."""
    table = {}
    for line in entries.strip().splitlines():
        arch, size, head_tile, block_q, block_k = map(int, line.split())
        table[(arch, size, head_tile)] = (Tiles(block_q, block_k, 4, 1 if arch < 80 else 2) if block_q else None)
    return table


# The largest (queries, keys) blocks whose three kernels (forward, backward over keys, backward over queries) fit
# the architecture's shared memory, for float32 (4 bytes, compiled with the IEEE and the TF32 products, the larger of
# the two) and float16 / bfloat16 (2 bytes), found by tile_search and checked by tests/core/kernels/test_shared_memory.py.
RECTIFIED_TILES = _table("""
75 4  16 64 64
75 4  32 64 64
75 4  64 32 64
75 4 128 16 32
75 4 256  0  0
75 2  16 64 64
75 2  32 64 64
75 2  64 64 64
75 2 128 32 32
75 2 256 16 16
80 4  16 64 64
80 4  32 64 64
80 4  64 64 64
80 4 128 32 64
80 4 256 16 32
80 2  16 64 64
80 2  32 64 64
80 2  64 64 64
80 2 128 64 64
80 2 256 64 64
86 4  16 64 64
86 4  32 64 64
86 4  64 32 64
86 4 128 16 32
86 4 256  0  0
86 2  16 64 64
86 2  32 64 64
86 2  64 64 64
86 2 128 64 64
86 2 256 32 32
89 4  16 64 64
89 4  32 64 64
89 4  64 32 64
89 4 128 16 32
89 4 256  0  0
89 2  16 64 64
89 2  32 64 64
89 2  64 64 64
89 2 128 64 64
89 2 256 32 32
90 4  16 64 64
90 4  32 64 64
90 4  64 64 64
90 4 128 64 64
90 4 256 32 32
90 2  16 64 64
90 2  32 64 64
90 2  64 64 64
90 2 128 64 64
90 2 256 64 64
""")
TOPK_TILES = _table("""
75 4  16 64 64
75 4  32 64 64
75 4  64 32 64
75 4 128 16 32
75 4 256  0  0
75 2  16 64 64
75 2  32 64 64
75 2  64 32 64
75 2 128 16 32
75 2 256  0  0
80 4  16 64 64
80 4  32 64 64
80 4  64 64 64
80 4 128 32 64
80 4 256 16 32
80 2  16 64 64
80 2  32 64 64
80 2  64 64 64
80 2 128 64 64
80 2 256 64 64
86 4  16 64 64
86 4  32 64 64
86 4  64 32 64
86 4 128 16 32
86 4 256  0  0
86 2  16 64 64
86 2  32 64 64
86 2  64 64 64
86 2 128 64 64
86 2 256 32 32
89 4  16 64 64
89 4  32 64 64
89 4  64 32 64
89 4 128 16 32
89 4 256  0  0
89 2  16 64 64
89 2  32 64 64
89 2  64 64 64
89 2 128 64 64
89 2 256 32 32
90 4  16 64 64
90 4  32 64 64
90 4  64 64 64
90 4 128 64 64
90 4 256 32 32
90 2  16 64 64
90 2  32 64 64
90 2  64 64 64
90 2 128 64 64
90 2 256 64 64
""")
SEQUENCE_TILES = {"rectified_attention": RECTIFIED_TILES, "topk_attention": TOPK_TILES}
# Under Triton's interpreter (the tests on a CPU) there is no shared memory: blocks of 64 as on an H100 in half
# precision, so that the tests' lengths of 70 and 131 span several blocks.
INTERPRETER_TILES = Tiles(64, 64)
_NOTICED = set()


def device_architecture(device: torch.device) -> Optional[int]:
    """The row of ``SHARED_MEMORY_LIMIT`` a CUDA device reads: its own compute capability where listed, else the
    listed architecture of the most shared memory the device has too (a newer card is taken for the card it can
    launch anything of: an sm_120 RTX 50xx with 99 KB for sm_86), None below sm_75 (Triton's tensor-core kernels
    need Turing or newer)."""
    major, minor = torch.cuda.get_device_capability(device)
    capability = 10 * major + minor
    if capability in SHARED_MEMORY_LIMIT:
        return capability
    if capability < 75:
        return None
    available = torch.cuda.get_device_properties(device).shared_memory_per_block_optin
    fitting = [arch for arch, limit in SHARED_MEMORY_LIMIT.items() if limit <= available and arch <= capability]
    return max(fitting, key=lambda arch: (SHARED_MEMORY_LIMIT[arch], arch)) if fitting else None


def tiles_for(kernel: str, arch: Optional[int], dtype: torch.dtype, head_dim: int) -> Optional[Tiles]:
    """The table's tiles of ``kernel`` ('rectified_attention' or 'topk_attention') on ``arch`` (a row of
    ``SHARED_MEMORY_LIMIT``) for q of ``dtype`` and head size ``head_dim``; None where none fits."""
    head = block_dim(head_dim)
    if arch is None or head not in HEAD_TILES:
        return None
    return SEQUENCE_TILES[kernel].get((arch, torch.empty((), dtype=dtype, device="meta").element_size(), head))


def sequence_tiles(kernel: str, q: Tensor) -> Optional[Tiles]:
    """The tiles of ``kernel`` for q's device, dtype and head size, None where none fits (the caller takes the
    reference path; a notice is logged once per architecture, dtype and head tile)."""
    if q.device.type != "cuda":
        return INTERPRETER_TILES
    arch = device_architecture(q.device)
    tiles = tiles_for(kernel, arch, q.dtype, q.size(-1))
    if tiles is None and (kernel, arch, q.dtype, block_dim(q.size(-1))) not in _NOTICED:
        _NOTICED.add((kernel, arch, q.dtype, block_dim(q.size(-1))))
        message = (f"fairseq_sparse: the {kernel} kernel does not fit {torch.cuda.get_device_name(q.device)} "
                   f"(sm_{arch}) for {q.dtype} at head size {q.size(-1)}; such calls take the chunked reference path")
        warnings.warn(message)
        logger.warning(message)
    return tiles


def fits_device(kernel: str, q: Tensor) -> bool:
    """Whether ``kernel`` has tiles for q (the module's check before it takes the kernel)."""
    return sequence_tiles(kernel, q) is not None


def torch_allows_tf32() -> bool:
    """Whether torch's own float32 matmuls on CUDA may run in TF32: ``torch.backends.cuda.matmul.fp32_precision``
    (torch >= 2.9) where it is set, else ``allow_tf32``, which ``torch.set_float32_matmul_precision("high")`` also
    sets (reading it raises where a program mixed the two APIs: then the global precision decides)."""
    setting = getattr(torch.backends.cuda.matmul, "fp32_precision", None)
    if setting in ("ieee", "tf32"):
        return setting == "tf32"
    try:
        return bool(torch.backends.cuda.matmul.allow_tf32)
    except RuntimeError:
        return torch.get_float32_matmul_precision() != "highest"


def sequence_kernel_fits(kernel, q: Tensor) -> bool:
    """Whether an ``AttentionSpec.sequence_kernel`` (the function, or a partial of it) has tiles for q where the
    kernels run; the module takes its reference path where not."""
    name = getattr(kernel, "func", kernel).__name__
    return name not in SEQUENCE_TILES or fits_device(name, q)


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot``'s input precision (a constexpr of every sequence kernel) for operands of ``dtype``: full float32
    ("ieee") as torch multiplies by default, "tf32" where the user allowed it for torch's matmuls; float16 and
    bfloat16 multiply in their own type either way (the setting only reads float32 operands)."""
    return "tf32" if dtype == torch.float32 and torch_allows_tf32() else "ieee"


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
    def scaled_rows(ptr, rows, dims, in_dim, row_stride, num_rows, scaling):
        """q's rows of a block times the scaling, rounded to q's dtype: the module's ``q * scaling``."""
        q = tl.load(ptr + rows[:, None] * row_stride + dims[None, :], mask=(rows[:, None] < num_rows) & in_dim[None, :],
                    other=0.0)
        return (q * scaling).to(ptr.dtype.element_ty)

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
    def kept_at(seed, row, queries, keys, num_queries, num_keys, dropout_p):
        """True where attention dropout keeps the weight of (row, query, key), broadcast elementwise: Philox keyed by
        the call's seed at the entry's 64-bit position in the call."""
        position = (tl.cast(row, tl.int64) * num_queries + tl.cast(queries, tl.int64)) * num_keys + keys
        return tl.rand(seed, position) >= dropout_p

    @triton.jit
    def kept_in_tile(seed, batch, heads, head, queries, keys, num_queries, num_keys, dropout_p):
        """(queries x keys) True where attention dropout keeps the weight."""
        return kept_at(seed, batch * heads + head, queries[:, None], keys[None, :], num_queries, num_keys, dropout_p)

    @triton.jit
    def _dropout_keep(seed_ptr, keep_ptr, num_queries, num_keys, heads, dropout_p,
                      BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        seed = tl.load(seed_ptr)
        queries = tl.program_id(1).to(tl.int64) * BLOCK_Q + tl.arange(0, BLOCK_Q)
        for start in range(0, num_keys, BLOCK_K):
            keys = start + tl.arange(0, BLOCK_K)
            kept = kept_in_tile(seed, row // heads, heads, row % heads, queries, keys, num_queries, num_keys, dropout_p)
            out = keep_ptr + (row * num_queries + queries[:, None]) * num_keys + keys[None, :]
            tl.store(out, kept, mask=(queries[:, None] < num_queries) & (keys[None, :] < num_keys))

    @triton.jit
    def _dropout_keep_at(seed_ptr, rows_ptr, queries_ptr, keys_ptr, keep_ptr, points, num_queries, num_keys, dropout_p,
                         BLOCK: tl.constexpr):
        at = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = at < points
        rows = tl.load(rows_ptr + at, mask=inside, other=0)
        queries = tl.load(queries_ptr + at, mask=inside, other=0)
        keys = tl.load(keys_ptr + at, mask=inside, other=0)
        tl.store(keep_ptr + at, kept_at(tl.load(seed_ptr), rows, queries, keys, num_queries, num_keys, dropout_p),
                 mask=inside)


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
    """A seed for one call's dropout mask, drawn from torch's generator of ``device`` (no host round trip): Philox's
    64-bit key, of which 62 bits are drawn."""
    return torch.randint(0, 2**62, (1,), dtype=torch.int64, device=device)


def dropout_keep(seed: Tensor, batch: int, heads: int, num_queries: int, num_keys: int, dropout_p: float) -> Tensor:
    """The entries the kernels keep under dropout with ``seed``: (B, H, T, S) bool (for tests)."""
    keep = torch.empty((batch, heads, num_queries, num_keys), dtype=torch.bool, device=seed.device)
    if keep.numel() > 0:
        _dropout_keep[(batch * heads, triton.cdiv(num_queries, 64))](seed, keep, num_queries, num_keys, heads, dropout_p,
                                                                     BLOCK_Q=64, BLOCK_K=64)
    return keep


def dropout_keep_at(seed: Tensor, rows: Tensor, queries: Tensor, keys: Tensor, num_queries: int, num_keys: int,
                    dropout_p: float) -> Tensor:
    """Whether the kernels keep the entries (rows[i], queries[i], keys[i]) of a call of (B x H = rows) x T x S with
    ``seed``, row = sentence x heads + head: bool, as ``dropout_keep`` without allocating the call's mask (for tests
    at lengths whose mask would not fit in memory)."""
    rows, queries, keys = (x.to(torch.int64).contiguous() for x in (rows, queries, keys))
    keep = torch.empty(rows.shape, dtype=torch.bool, device=seed.device)
    if keep.numel() > 0:
        _dropout_keep_at[(triton.cdiv(keep.numel(), 256),)](seed, rows, queries, keys, keep, keep.numel(), num_queries,
                                                           num_keys, dropout_p, BLOCK=256)
    return keep


def padding_and_counts(key_padding_mask: Optional[Tensor], key_counts: Optional[Tensor]):
    """fairseq's padding mask (B, S) and the module's key counts (B|1, 1, 1, S) as the kernels read them."""
    counts = None if key_counts is None else rows_of(key_counts.reshape(key_counts.size(0), -1).float())
    padding = None if key_padding_mask is None else rows_of(key_padding_mask)
    return padding, counts
