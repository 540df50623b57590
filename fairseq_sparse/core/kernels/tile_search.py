"""What the plugin's Triton kernels need of a GPU's shared memory, measured on a machine without a GPU, and the
table of tiles (``tiles.SEQUENCE_TILES``) derived from it.

Triton compiles a kernel for any architecture without the card (``GPUTarget("cuda", 80, 32)``); the compiled
kernel's metadata ``shared`` is the shared memory one program needs, which the card caps per block
(``tiles.SHARED_MEMORY_LIMIT``). Two commands:

* ``matrix``: every kernel for every architecture x float32, bfloat16, float16 x head sizes 32, 64, 96, 128 and
  256, launched as its launcher would (its tiles from the table, its constants from the launcher's own functions),
  one JSON line each: the tiles, the shared memory, the limit, and whether the TTGIR's dots multiply in TF32 on
  tensor cores (``tests/core/kernels/test_shared_memory.py`` checks every line against the card);
* ``search``: for each sequence kernel family, architecture, element size and head tile, the largest (queries,
  keys) blocks of a ladder whose three kernels fit, with float32 compiled in both precisions: the table's rows.

Cheap enough for the suite: compilation stops where Triton has allocated the shared memory, at the start of its
LLVM IR stage (the lowering to LLVM, LLVM's optimisation, PTX and ptxas take most of a compilation's time and add
nothing to the number), each distinct compilation runs once (head sizes 96
and 128 share the 128-wide head tile and so one binary), on every core, and its result is kept in
``~/.cache/fairseq-sparse/shared-memory`` under a hash of the kernel's source, Triton's version and everything the
compilation reads. Run it in a Python without ``TRITON_INTERPRET`` (which makes every kernel an interpreted one).

    python -m fairseq_sparse.core.kernels.tile_search matrix [--tf32] [--archs 80 90] [--dtypes fp32] [--head-sizes 64]
    python -m fairseq_sparse.core.kernels.tile_search search [--archs 75]
"""

import argparse
import concurrent.futures
import hashlib
import json
import multiprocessing
import os
import sys
from pathlib import Path

import torch
import triton
from triton._C.libtriton import ir, nvidia, passes
from triton.backends.nvidia.compiler import get_ptx_version_from_options
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.compiler.compiler import make_backend

from . import decoding_step, rectified_attention, rms_norm, tiles, topk_attention

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
HEAD_SIZES = (32, 64, 96, 128, 256)
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fairseq-sparse" / "shared-memory"
# The widest model dimension the RMSNorm kernel is compiled for (its block is the whole row).
NORM_WIDTH = 1024


def signature_of(fn, dtype: str) -> dict:
    """Triton's signature of one of the plugin's kernels: tensors in ``dtype``, the masks, counts, seeds and the top-k
    kernels' per-query rows in their own types, every other argument a 32-bit integer (a stride of 2^31 or more
    is passed as a 64-bit one at launch, which only widens what the kernel computes in 64 bits anyway)."""
    own = {"padding_ptr": "*i1", "counts_ptr": "*fp32", "seed_ptr": "*i64", "kth_ptr": "*fp32", "lse_ptr": "*fp32",
           "delta_ptr": "*fp32", "scores_ptr": "*fp32", "scaling": "fp32", "dropout_p": "fp32", "eps": "fp32",
           "weight_ptr": f"*{dtype}", "gate_ptr": f"*{dtype}"}
    constants = {param.name for param in fn.params if param.is_constexpr}
    return {name: "constexpr" if name in constants else own.get(name, f"*{dtype}" if name.endswith("_ptr") else "i32")
            for name in fn.arg_names}


def launches(arch: int, dtype: str, head_size: int, candidates=None):
    """(kernel name, jit function, constexprs, num_warps, num_stages) of every kernel as its launcher would launch it
    for q of ``dtype`` and ``head_size`` on ``arch``; a sequence kernel family without tiles there is left out.
    ``candidates``: {family: Tiles} tried in place of the table's (the search)."""
    q = torch.empty((1, 1, 1, head_size), dtype=DTYPES[dtype], device="meta")
    candidates = candidates or {}
    result = []
    rela_tiles = candidates.get("rectified_attention") or tiles.tiles_for("rectified_attention", arch, q.dtype,
                                                                            head_size)
    if rela_tiles is not None:  # GeLU (the most arithmetic) with every option: padding, causal, counts, dropout
        constants = rectified_attention._constants("gelu", True, q, q, 0.1, q, rela_tiles)
        for fn in (rectified_attention._rectified_forward, rectified_attention._rectified_backward_keys,
                   rectified_attention._rectified_backward_queries):
            result.append((fn.__name__, fn, constants))
    topk_tiles = candidates.get("topk_attention") or tiles.tiles_for("topk_attention", arch, q.dtype, head_size)
    if topk_tiles is not None:  # the largest k the kernel takes, with padding, causal and dropout
        constants = topk_attention._constants(True, q, 0.1, q, topk_tiles)
        result.append(("_topk_forward", topk_attention._topk_forward,
                       dict(constants, K_SLOTS=triton.next_power_of_2(topk_attention.MAX_K))))
        for fn in (topk_attention._topk_backward_keys, topk_attention._topk_backward_queries):
            result.append((fn.__name__, fn, constants))
    for mode in ("gelu", "entmax15"):  # a walk over key blocks; a threshold over the most keys the kernel takes
        result.append((f"_decoding_step[{mode}]", decoding_step._decoding_step,
                       decoding_step.launch_constants(mode, True, True, decoding_step.MAX_KEYS, head_size)))
    result.append(("_rms_norm_rows", rms_norm._rms_norm_rows, dict(GATED=True, BLOCK=NORM_WIDTH)))
    return [(name, fn, {k: v for k, v in c.items() if k not in ("num_warps", "num_stages")},
             c.get("num_warps", 4), c.get("num_stages", 3)) for name, fn, c in result]


def _compile_to_shared(fn, signature: dict, constexprs: dict, arch: int, num_warps: int, num_stages: int,
                       to_llir: bool = False):
    """(shared bytes, TTGIR text) of one kernel: Triton's own stages to the TTGIR, then the first passes of its
    LLVM IR stage (``make_llir`` in triton/backends/nvidia/compiler.py, Triton 3.9) up to and including the
    shared-memory allocation, whose total is the compiled kernel's metadata ``shared``; the lowering to LLVM and
    LLVM's optimisation after it (most of a compilation's time) change nothing of it. ``to_llir``: the whole LLVM
    IR stage instead, as ``triton.compile`` runs it (tests/core/kernels/test_shared_memory.py checks both agree)."""
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    options = backend.parse_options(dict(num_warps=num_warps, num_stages=num_stages))
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = source.make_ir(target, options, backend.get_codegen_implementation(options), backend.get_module_map(),
                            context)
    stages, metadata = {}, {}
    backend.add_stages(stages, options, source.language)
    module = stages["ttgir"](stages["ttir"](module, metadata), metadata)
    ttgir = str(module)
    if to_llir:
        stages["llir"](module, metadata)
        return metadata["shared"], ttgir
    capability = backend._parse_arch(options.arch)
    manager = ir.pass_manager(module.context)
    passes.ttgpuir.add_combine_tensor_select_and_if(manager)
    passes.ttgpuir.add_allocate_warp_groups(manager, False)
    passes.convert.add_scf_to_cf(manager)
    passes.gluon.add_inliner(manager)
    nvidia.passes.ttgpuir.add_allocate_shared_memory_nv(manager, capability,
                                                       get_ptx_version_from_options(options, target.arch))
    nvidia.passes.ttnvgpuir.add_allocate_tensor_memory(manager)
    manager.run(module, "make_llir")
    return module.get_int_attr("ttg.shared"), ttgir


RESULT_FORMAT = 3  # what compiled_shared keeps; a new format invalidates the cache


def _cache_key(fn, signature, constexprs, arch, num_warps, num_stages) -> str:
    text = json.dumps([RESULT_FORMAT, fn.cache_key, triton.__version__, signature, {k: str(v) for k, v in constexprs.items()}, arch,
                       num_warps, num_stages], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


# key -> (jit function, signature, constexprs, arch, num_warps, num_stages); forked workers read it (jit functions
# do not pickle)
JOBS = {}


def compiled_shared(key: str) -> dict:
    """{'shared': bytes, 'tf32': whether a dot of the TTGIR multiplies in TF32}, from the cache or compiled."""
    fn, signature, constexprs, arch, num_warps, num_stages = JOBS[key]
    path = CACHE / f"{key}.json"
    if path.exists():
        return json.loads(path.read_text())
    shared, ttgir = _compile_to_shared(fn, signature, constexprs, arch, num_warps, num_stages)
    # tt.dot, or on sm_90 the warp group's (wgmma); an MMA layout or wgmma: tensor cores, a blocked one: FMA
    dots = [line for line in ttgir.splitlines() if "tt.dot " in line or "warp_group_dot " in line]
    # float32 operands on tensor cores are TF32: tt.dot says so, wgmma takes float32 no other way
    tf32 = any("inputPrecision = tf32" in line or ("warp_group_dot " in line and "xf32, #ttg.dot_op" in line)
               for line in dots)
    result = {"shared": shared, "dots": len(dots), "tf32": tf32,
              "tensor_cores": any("#mma" in line or "warp_group_dot " in line for line in dots)}
    CACHE.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result))
    return result


def _compile_all(keys):
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(max_workers=max(1, JOBS_AT_ONCE[0]), mp_context=context) as pool:
        return dict(zip(keys, pool.map(compiled_shared, keys)))


JOBS_AT_ONCE = [os.cpu_count() or 1]


def matrix(args) -> None:
    rows = []
    for arch in args.archs:
        for dtype in args.dtypes:
            for head_size in args.head_sizes:
                for name, fn, constexprs, num_warps, num_stages in launches(arch, dtype, head_size):
                    job = (fn, signature_of(fn, dtype), constexprs, arch, num_warps, num_stages)
                    key = _cache_key(*job)
                    JOBS[key] = job
                    rows.append(dict(kernel=name, arch=arch, dtype=dtype, head_size=head_size, num_warps=num_warps,
                                     num_stages=num_stages, limit=tiles.SHARED_MEMORY_LIMIT[arch], key=key,
                                     tiles=[constexprs.get("BLOCK_Q"), constexprs.get("BLOCK_K"),
                                            constexprs.get("BLOCK_DIM")]))
    results = _compile_all(list(JOBS))
    for row in rows:
        row.update(results[row.pop("key")])
        print(json.dumps(row), flush=True)
    print(json.dumps({"compilations": len(JOBS)}), flush=True)


# (queries, keys) per block, largest first; tl.dot takes no side under 16
LADDER = ((64, 64), (32, 64), (32, 32), (16, 32), (16, 16))
FAMILIES = {"rectified_attention": ("_rectified_forward", "_rectified_backward_keys", "_rectified_backward_queries"),
            "topk_attention": ("_topk_forward", "_topk_backward_keys", "_topk_backward_queries")}


def search(args) -> None:
    """Print the table's rows: per family, architecture, element size (float32 in both precisions) and head tile,
    the first blocks of ``LADDER`` whose three kernels fit, 0 0 where none does."""
    rows = {family: [] for family in FAMILIES}
    for arch in args.archs:
        for dtype in ("fp32", "bf16"):
            for head_tile in tiles.HEAD_TILES:
                for family, members in FAMILIES.items():
                    chosen = (0, 0)
                    for block_q, block_k in LADDER:
                        candidate = tiles.Tiles(block_q, block_k, 4, 1 if arch < 80 else 2)
                        keys = []
                        for tf32 in ((False, True) if dtype == "fp32" else (False,)):
                            torch.backends.cuda.matmul.allow_tf32 = tf32
                            for name, fn, constexprs, num_warps, num_stages in launches(arch, dtype, head_tile,
                                                                                         {family: candidate}):
                                if name in members:
                                    job = (fn, signature_of(fn, dtype), constexprs, arch, num_warps, num_stages)
                                    JOBS[_cache_key(*job)] = job
                                    keys.append(_cache_key(*job))
                        shared = max(result["shared"] for result in _compile_all(keys).values())
                        if shared <= tiles.SHARED_MEMORY_LIMIT[arch]:
                            chosen = (block_q, block_k)
                            break
                    size = 4 if dtype == "fp32" else 2
                    rows[family].append(f"{arch} {size} {head_tile:>3} {chosen[0]:>2} {chosen[1]:>2}")
                    print(family, rows[family][-1], flush=True)
    for family, lines in rows.items():
        print(f"\n{family}:\n" + "\n".join(lines))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("matrix", "search"))
    parser.add_argument("--archs", type=int, nargs="+", default=sorted(tiles.SHARED_MEMORY_LIMIT))
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--head-sizes", type=int, nargs="+", default=list(HEAD_SIZES))
    parser.add_argument("--tf32", action="store_true", help="as torch.backends.cuda.matmul.allow_tf32 = True sets it")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compilations at once")
    args = parser.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    JOBS_AT_ONCE[0] = args.jobs
    matrix(args) if args.command == "matrix" else search(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
