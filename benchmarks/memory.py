#!/usr/bin/env python
"""Peak memory of one self-attention sublayer over a long sequence, per attention function.

One ``SparseMultiheadAttention`` (the module every transformer_sparse sublayer uses) runs a
forward pass, and a forward + backward pass, over ``--length`` tokens (512 by default: the
document-level blocks). Peak memory is what the pass allocates above what existed before it
(parameters and the input are not counted), so the numbers compare the functions' working
memory. Every function gets the same weights and input.

* CPU: ``torch.profiler`` with ``profile_memory=True`` records every allocation and free;
  the peak is the largest running total of those events in time order.
* CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``.

    python benchmarks/memory.py                     # CPU, bidirectional (encoder)
    python benchmarks/memory.py --causal            # decoder self-attention mask
    python benchmarks/memory.py --device cuda --batch-size 8

The structured patterns are computed as masks over the dense score matrix, as ``topk`` is,
so they are not expected to save memory; the table shows what they cost on top of softmax.
Measurements are not tests: this script asserts nothing.
"""

import argparse
import sys
from typing import Callable, Dict, List

import torch
from torch.profiler import ProfilerActivity, profile

import fairseq_sparse  # noqa: F401  (registers the functions)
from fairseq_sparse.attention import attention_names, get_attention
from fairseq_sparse.modules.sparse_multihead_attention import SparseMultiheadAttention

DEFAULT_FUNCTIONS = ["softmax", "topk", "block", "window", "dilated", "global", "random", "bigbird", "topk_oow"]
MIB = 2**20


def cpu_peak_bytes(step: Callable[[], None]) -> int:
    """Largest running total of CPU allocations minus frees while ``step`` runs."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    cpu = torch._C._autograd.DeviceType.CPU
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]" and e.device_type() == cpu]
    total, peak = 0, 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        total += event.nbytes()
        peak = max(peak, total)
    return peak


def cuda_peak_bytes(step: Callable[[], None]) -> int:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def build_attention(name: str, args) -> SparseMultiheadAttention:
    torch.manual_seed(args.seed)  # the same projections for every function
    return SparseMultiheadAttention(args.embed_dim, args.heads, attn_fn=name, attn_k=args.k, self_attention=True).to(args.device)


def measure(name: str, args) -> Dict[str, float]:
    """Peak MiB of a forward and of a forward + backward pass of one function."""
    attention = build_attention(name, args)
    gen = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.length, args.batch_size, args.embed_dim, generator=gen).to(args.device).requires_grad_(True)
    causal = torch.ones(args.length, args.length, dtype=torch.bool, device=args.device).triu(1) if args.causal else None
    peak_bytes = cuda_peak_bytes if args.device.startswith("cuda") else cpu_peak_bytes

    def forward():
        with torch.no_grad():
            attention(x, x, x, attn_mask=causal, need_weights=False)

    def forward_backward():
        out, _ = attention(x, x, x, attn_mask=causal, need_weights=False)
        out.sum().backward()
        attention.zero_grad(set_to_none=True)
        x.grad = None

    forward_backward()  # warm-up: one-off allocations (kernels, caches) stay out of the numbers
    return {"forward": peak_bytes(forward) / MIB, "forward+backward": peak_bytes(forward_backward) / MIB}


def format_table(results: Dict[str, Dict[str, float]], args) -> str:
    base = results.get("softmax")
    mode = "causal (decoder)" if args.causal else "bidirectional (encoder)"
    lines = [
        f"peak memory above inputs and parameters, one self-attention sublayer, {mode}, length {args.length}, "
        f"batch {args.batch_size}, d_model {args.embed_dim}, {args.heads} heads, k={args.k}, device {args.device}",
        "",
        "| function | forward MiB | x softmax | forward+backward MiB | x softmax |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, peaks in results.items():
        ratios = [f"{peaks[p] / base[p]:.2f}" if base else "-" for p in ("forward", "forward+backward")]
        lines.append(f"| {name} | {peaks['forward']:.1f} | {ratios[0]} | {peaks['forward+backward']:.1f} | {ratios[1]} |")
    return "\n".join(lines)


def main(argv: List[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--functions", nargs="+", default=DEFAULT_FUNCTIONS, help="attention functions (softmax first is the baseline)")
    parser.add_argument("--length", type=int, default=512, help="tokens in the sequence (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--embed-dim", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--k", type=int, default=8, help="attended positions for functions that take k (default: %(default)s)")
    parser.add_argument("--causal", action="store_true", help="decoder self-attention: mask future keys")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    for name in args.functions:
        if name not in attention_names():
            parser.error(f"unknown attention function {name!r}; valid choices: {', '.join(attention_names())}")
        if get_attention(name).build_head_params or get_attention(name).build_output_norm:
            print(f"note: {name} owns parameters of its own; they are counted as its inputs", file=sys.stderr)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device")
    results = {name: measure(name, args) for name in args.functions}
    print(format_table(results, args))


if __name__ == "__main__":
    main()
