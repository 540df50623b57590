"""ReLA's RMSNorm of the concatenated head outputs, optionally gated, as one kernel for inference.

In decoding every attention sublayer's output norm is about ten small operations on a (B, E) row
block (square, mean, add, rsqrt, three products, the gate's product and sigmoid), each a kernel
launch on a GPU, where a decoding step is launch-bound: ReLA-g's step dispatched 1.16x softmax's
operations with them. Here a program per row loads the row once and writes y = x * rsqrt(mean(x^2)
+ eps) * w (* sigmoid(g * x)) once. Training keeps the eager norm (``attention.norms.RMSNorm``) and
its autograd; the kernel runs where no gradient is recorded.

The kernel is one operation of the dispatcher (``torch.ops.fairseq_sparse.rms_norm``), so a
dispatch counter sees what a GPU launches.
"""

from typing import Optional

import torch
from torch import Tensor

from .device import triton

if triton is not None:
    import triton.language as tl

    @triton.jit
    def _rms_norm_rows(x_ptr, weight_ptr, gate_ptr, out_ptr, dim, eps, x_row_stride, out_row_stride,
                       GATED: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        columns = tl.arange(0, BLOCK)
        inside = columns < dim
        x = tl.load(x_ptr + row * x_row_stride + columns, mask=inside, other=0.0).to(tl.float32)
        weight = tl.load(weight_ptr + columns, mask=inside, other=0.0).to(tl.float32)
        mean_square = tl.sum(x * x, axis=0) / dim
        y = x * (1.0 / tl.sqrt(mean_square + eps)) * weight
        if GATED:
            gate = tl.load(gate_ptr + columns, mask=inside, other=0.0).to(tl.float32)
            y = y * tl.sigmoid(gate * x)
        tl.store(out_ptr + row * out_row_stride + columns, y.to(out_ptr.dtype.element_ty), mask=inside)


def rms_norm(x: Tensor, weight: Tensor, gate: Optional[Tensor], eps: float) -> Tensor:
    """RMSNorm over the last dimension of ``x`` with gain ``weight`` and, if given, ReLA-g's gate; x's dtype."""
    rows = x.reshape(-1, x.size(-1))
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    dim = rows.size(-1)
    if rows.size(0) > 0:
        _rms_norm_rows[(rows.size(0),)](rows, weight, weight if gate is None else gate, out, dim, eps,
                                        rows.stride(0), out.stride(0), GATED=gate is not None,
                                        BLOCK=triton.next_power_of_2(dim))
    return out.view(x.shape)


def _rms_norm_shape(x: Tensor, weight: Tensor, gate: Optional[Tensor], eps: float) -> Tensor:
    return torch.empty_like(x)


if triton is not None:
    rms_norm = torch.library.custom_op("fairseq_sparse::rms_norm", mutates_args=())(rms_norm)
    rms_norm.register_fake(_rms_norm_shape)
