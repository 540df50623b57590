"""Every Triton kernel, compiled without a GPU for each GPU architecture our users have (sm_75 T4, sm_80 A100, sm_86
RTX 30xx / A10, sm_89 RTX 40xx / L4 / L40, sm_90 H100 / H200) x float32, bfloat16, float16 x head sizes 32, 64, 96,
128 and 256, with the tiles its launcher chooses (``tiles.SEQUENCE_TILES``): the compiled shared memory fits the
card, or the launcher chooses the reference path there; and float32 products follow torch's matmul setting."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from fairseq_sparse.core.kernels import device, tiles

pytestmark = [pytest.mark.skipif(device.triton is None, reason="Triton is not installed (requirements.txt pins it)"),
              pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the other tests launch the kernels")]
SEQUENCE_KERNELS = {"rectified_attention": ("_rectified_forward", "_rectified_backward_keys", "_rectified_backward_queries"),
                    "topk_attention": ("_topk_forward", "_topk_backward_keys", "_topk_backward_queries")}
OTHER_KERNELS = ("_decoding_step[gelu]", "_decoding_step[entmax15]", "_rms_norm_rows")


def _without_interpreter(command, timeout):
    """Run ``command`` in a Python without ``TRITON_INTERPRET`` (which would make every kernel an interpreted one)."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[3]), env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=timeout, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def _matrix(*options):
    lines = _without_interpreter(["-m", "fairseq_sparse.core.kernels.tile_search", "matrix", *options],
                                 timeout=3000).splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


@pytest.fixture(scope="module")
def compiled():
    """One run of the whole matrix (each distinct compilation once, on every core), shared by the tests below."""
    started = time.monotonic()
    rows = _matrix()
    print(f"\ncompiled the matrix in {time.monotonic() - started:.0f} s: {rows[-1]}")
    return rows[:-1]


def _key(row):
    return row["arch"], row["dtype"], row["head_size"]


def test_every_kernel_fits_every_card_it_is_launched_on(compiled):
    """The shared memory of each (kernel, architecture, dtype, head size), printed (pytest -s), at most the card's
    limit; a sequence kernel family has all three kernels or none (the chunked reference path) at each."""
    by_case = {}
    for row in compiled:
        by_case.setdefault(_key(row), {})[row["kernel"]] = row
    print("\narch dtype d_h kernel: shared memory / limit (blocks q x k x head tile)")
    for case, kernels in sorted(by_case.items()):
        for name, row in sorted(kernels.items()):
            print(f"sm_{row['arch']} {row['dtype']} {row['head_size']} {name}: {row['shared']} / {row['limit']} B "
                  f"({'x'.join(str(size) for size in row['tiles'] if size)})")
            assert row["shared"] <= row["limit"], row
        for family, members in SEQUENCE_KERNELS.items():
            present = [name in kernels for name in members]
            assert all(present) or not any(present), (case, family)
            if not any(present):
                print(f"sm_{case[0]} {case[1]} {case[2]} {family}: no tiles fit, the chunked reference path")
        assert set(OTHER_KERNELS) <= set(kernels), case
    assert len(by_case) == len(tiles.SHARED_MEMORY_LIMIT) * 3 * 5


def test_the_table_gives_tiles_wherever_the_users_run(compiled):
    """Half precision, the users' regime, has kernels on every card from sm_80 at every head size up to 128, and
    on an H100 at every head size; a card left to the reference path is a row of the table, not an accident."""
    launched = {(row["kernel"], *_key(row)) for row in compiled}
    for arch in (80, 86, 89, 90):
        for dtype in ("bf16", "fp16"):
            for head_size in (32, 64, 96, 128) + ((256,) if arch == 90 else ()):
                for members in SEQUENCE_KERNELS.values():
                    assert (members[0], arch, dtype, head_size) in launched, (arch, dtype, head_size)


def test_float32_products_are_full_float32_unless_torch_allows_tf32(compiled):
    """By default torch multiplies float32 in full precision, and so do the kernels: no dot of a float32 kernel
    is a TF32 one. With ``allow_tf32`` every such dot is, and the tiles still fit (sm_80 and sm_90, d_h 64 and 128)."""
    float32_dots = [row for row in compiled if row["dtype"] == "fp32" and row["dots"]]
    assert float32_dots and not any(row["tf32"] or row["tensor_cores"] for row in float32_dots)
    with_tf32 = [row for row in _matrix("--tf32", "--archs", "80", "90", "--dtypes", "fp32", "--head-sizes", "64", "128")
                 if "kernel" in row and row["dots"]]
    assert len(with_tf32) == 2 * 2 * 6
    for row in with_tf32:
        assert row["tf32"] and row["tensor_cores"] and row["shared"] <= row["limit"], row


PTX = """
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from fairseq_sparse.core.kernels import rectified_attention, tiles, tile_search as matrix
torch.backends.cuda.matmul.allow_tf32 = {tf32}
q = torch.empty((1, 1, 1, 64), dtype=torch.float32, device="meta")
constants = rectified_attention._constants("relu", False, None, None, 0.0, q, tiles.tiles_for("rectified_attention", 80, q.dtype, 64))
options = dict(num_warps=constants.pop("num_warps"), num_stages=constants.pop("num_stages"))
fn = rectified_attention._rectified_forward
source = ASTSource(fn=fn, signature=matrix.signature_of(fn, "fp32"), constexprs=constants)
print("tf32 mma" if ".tf32.tf32" in triton.compile(source, target=GPUTarget("cuda", 80, 32), options=options).asm["ptx"] else "no tf32")
"""


@pytest.mark.parametrize("tf32", [False, True])
def test_the_ptx_of_a_float32_kernel_carries_tf32_mma_only_when_torch_allows_it(tf32):
    """Down to the PTX for sm_80 (ptxas included): ``mma ... .tf32.tf32`` where torch allows TF32, none otherwise."""
    out = _without_interpreter(["-c", PTX.format(tf32=tf32)], timeout=600)
    assert out.strip().splitlines()[-1] == ("tf32 mma" if tf32 else "no tf32")


def test_the_precision_follows_torch_s_setting():
    """``allow_tf32`` and ``set_float32_matmul_precision``, as a user sets them (restored after)."""
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        assert tiles.dot_precision(torch.float32) == "ieee"
        torch.backends.cuda.matmul.allow_tf32 = True
        assert tiles.dot_precision(torch.float32) == "tf32" and tiles.dot_precision(torch.bfloat16) == "ieee"
        torch.set_float32_matmul_precision("highest")
        assert tiles.dot_precision(torch.float32) == "ieee"
        torch.set_float32_matmul_precision("high")
        assert tiles.dot_precision(torch.float32) == "tf32"
    finally:
        torch.set_float32_matmul_precision("highest")
        torch.backends.cuda.matmul.allow_tf32 = False


SAME_SHARED = """
from fairseq_sparse.core.kernels import tile_search
for arch, dtype, head_size in ((75, "fp32", 64), (80, "fp32", 128), (90, "bf16", 256)):
    for name, fn, constexprs, num_warps, num_stages in tile_search.launches(arch, dtype, head_size):
        if name not in ("_rectified_backward_keys", "_topk_backward_queries"):  # two of the fullest
            continue
        signature = tile_search.signature_of(fn, dtype)
        short = tile_search._compile_to_shared(fn, signature, constexprs, arch, num_warps, num_stages)[0]
        whole = tile_search._compile_to_shared(fn, signature, constexprs, arch, num_warps, num_stages, to_llir=True)[0]
        assert short == whole, (arch, dtype, head_size, name, short, whole)
print("same")
"""


def test_stopping_after_the_allocation_measures_what_the_whole_compilation_does():
    """The matrix stops Triton's LLVM IR stage after its shared-memory allocation (the rest takes most of the time):
    on three architectures (FMA, mma and wgmma code), two of the fullest kernels' numbers equal those of the whole
    stage, as ``triton.compile`` runs it."""
    assert _without_interpreter(["-c", SAME_SHARED], timeout=900).strip().endswith("same")


def test_a_card_without_tiles_takes_the_reference_path_with_one_notice(monkeypatch, recwarn):
    """sm_75 in float32 at d_h 256 has no tiles: ``sequence_tiles`` answers None (the module takes the reference
    path) and warns once, not at every call."""
    monkeypatch.setattr(tiles, "device_architecture", lambda device: 75)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    monkeypatch.setattr(tiles, "_NOTICED", set())
    q = SimpleNamespace(device=torch.device("cuda", 0), dtype=torch.float32, size=lambda dim: 256)
    assert tiles.tiles_for("rectified_attention", 75, torch.float32, 256) is None
    assert tiles.sequence_tiles("rectified_attention", q) is None and tiles.sequence_tiles("rectified_attention", q) is None
    assert len([w for w in recwarn if "reference path" in str(w.message)]) == 1
