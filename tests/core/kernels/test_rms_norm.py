"""The fused RMSNorm kernel equals the eager RMSNorm that defines it (under Triton's interpreter on the CPU),
and compiles for the GPUs our users train on."""

import pytest
import torch
from gpu_compilation import assert_compiles

from fairseq_sparse.bench.dispatch_counts import count
from fairseq_sparse.core.attention.norms import RMSNorm
from fairseq_sparse.core.kernels import rms_norm as kernel

pytestmark = pytest.mark.skipif(kernel.triton is None, reason="Triton is not installed (requirements.txt pins it)")
ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"


NORMS = {
    "rela_g": lambda dim: RMSNorm(dim, gated=True),
    "rela_i": lambda dim: RMSNorm(dim, gain_init_bound=0.3),
    "relu_rmsnorm": lambda dim: RMSNorm(dim),
}


@pytest.mark.parametrize("dim", [16, 24, 512])
@pytest.mark.parametrize("norm", sorted(NORMS))
def test_the_kernel_equals_the_eager_norm(norm, dim, fused):
    torch.manual_seed(dim)
    module = NORMS[norm](dim).to(DEVICE)
    x = torch.randn(7, 3, dim, device=DEVICE)
    x[2, 1] = 0.0  # null attention: a zero row stays zero
    with torch.enable_grad():
        expected = module(x)  # records a gradient: the eager norm
    with torch.no_grad():
        got = module(x)
        counter = count(lambda: module(x))
    assert counter.by_operation == {"fairseq_sparse.rms_norm": 1}, "decoding should take the kernel"
    assert got.dtype == x.dtype and got.shape == x.shape
    assert (got - expected).abs().max() <= 1e-5 * max(1.0, expected.abs().max())
    assert torch.equal(got[2, 1], torch.zeros(dim, device=DEVICE))


def test_rows_of_a_strided_tensor_and_an_empty_batch(fused):
    module = NORMS["rela_g"](16).to(DEVICE)
    x = torch.randn(4, 6, 32, device=DEVICE)[..., ::2]  # not contiguous
    with torch.no_grad():
        got, empty = module(x), module(torch.zeros(0, 2, 16, device=DEVICE))
    with torch.enable_grad():
        expected = module(x)
    assert (got - expected).abs().max() <= 1e-5 and empty.shape == (0, 2, 16)


def test_training_keeps_the_eager_norm_and_its_gradient(fused):
    module = NORMS["rela_g"](16).to(DEVICE)
    x = torch.randn(3, 2, 16, device=DEVICE, requires_grad=True)
    counter = count(lambda: module(x).sum().backward())
    assert "fairseq_sparse.rms_norm" not in counter.by_operation and x.grad is not None


def test_the_cpu_runs_the_eager_norm_unless_asked():
    module = NORMS["rela_g"](16)
    with torch.no_grad():
        counter = count(lambda: module(torch.randn(2, 16)))
    assert "fairseq_sparse.rms_norm" not in counter.by_operation


COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from fairseq_sparse.core.kernels.rms_norm import _rms_norm_rows
# activations and parameters alike (fairseq's --fp16 / --bf16 models), or half activations with float32 parameters
for arch in (80, 90):
    for dtype, param in (("fp32", "fp32"), ("bf16", "bf16"), ("fp16", "fp16"), ("bf16", "fp32"), ("fp16", "fp32")):
        for gated in (False, True):
            signature = {"x_ptr": f"*{dtype}", "weight_ptr": f"*{param}", "gate_ptr": f"*{param}", "out_ptr": f"*{dtype}",
                         "dim": "i32", "eps": "fp32", "x_row_stride": "i32", "out_row_stride": "i32",
                         "GATED": "constexpr", "BLOCK": "constexpr"}
            source = ASTSource(fn=_rms_norm_rows, signature=signature, constexprs={"GATED": gated, "BLOCK": 512})
            compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32))
            assert compiled.asm["ptx"], (arch, dtype, param, gated)
print("compiled")
"""


@pytest.mark.skipif(ON_GPU, reason="on a GPU the tests above compile and run the kernel itself")
def test_the_kernel_compiles_for_sm80_and_sm90_in_every_precision():
    assert_compiles(COMPILE)
