#!/usr/bin/env python
"""Peak memory of one self-attention sublayer over a long sequence, per attention function and for stock fairseq.

One ``SparseMultiheadAttention`` (the module every transformer_sparse sublayer uses) runs a
forward pass, and a forward + backward pass, over each of ``--lengths`` tokens (512 by
default: the document-level blocks). The ``fairseq`` row is stock
``fairseq.modules.MultiheadAttention`` with the same weights as the ``softmax`` row (loaded
from its state dict). Both modules are called as fairseq's transformer layers call them in
training: ``query = key = value = x``, ``need_weights=False``, no incremental state, the
key padding mask the layer passes (``None``: the sequence has no padding), and with
``--causal`` the decoder's float causal mask (-inf above the diagonal); the encoder passes
no attention mask. So stock fairseq takes its fused path (``F.multi_head_attention_forward``,
which runs ``scaled_dot_product_attention``), as it does in a real encoder or decoder.

Peak memory is what the pass allocates above what existed before it (parameters and the
input are not counted), so the numbers compare the modules' working memory. Every row gets
the same weights and input; each row's peak is also given relative to stock fairseq and
to softmax.

* CPU: ``torch.profiler`` with ``profile_memory=True`` records every allocation and free;
  the peak is the largest running total of those events in time order.
* CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``.

    python -m fairseq_sparse.bench.memory                          # CPU, bidirectional (encoder), length 512
    python -m fairseq_sparse.bench.memory --lengths 512 1024 2048 4096
    python -m fairseq_sparse.bench.memory --causal                 # decoder self-attention mask
    python -m fairseq_sparse.bench.memory --device cuda --batch-size 8 --lengths 512 1024

At length, top-k and the structured patterns gather their selected keys
(``modules/gathered_attention``) and keep n indices and weights per query for the backward
pass; up to a 512-token block a pattern goes to the fused kernel as a boolean mask.
Measurements are not tests: this script asserts nothing.
"""

import argparse
import sys
from typing import Callable, Dict, List

import torch
from fairseq.modules import MultiheadAttention
from torch.profiler import ProfilerActivity, profile

import fairseq_sparse  # noqa: F401  (registers the functions)
from fairseq_sparse.core.attention import DEFAULT_K, attention_names, get_attention
from fairseq_sparse.bench.common import DTYPES, FAIRSEQ, add_attn_impl_option, add_dtype_option, resolve_dtype
from fairseq_sparse.core.modules.gathered_attention import GATHER_CHUNK_ELEMENTS
from fairseq_sparse.core.modules.sparse_multihead_attention import SparseMultiheadAttention

DEFAULT_FUNCTIONS = attention_names()
REFERENCES = (FAIRSEQ, "softmax")
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


def build_attention(name: str, args) -> torch.nn.Module:
    """The plugin's module running ``name``, or (``fairseq``) stock MultiheadAttention with softmax's weights."""
    torch.manual_seed(args.seed)  # the same projections for every function
    plugin = SparseMultiheadAttention(args.embed_dim, args.heads, attn_fn="softmax" if name == FAIRSEQ else name,
                                      attn_k=args.k, dropout=args.attention_dropout, self_attention=True,
                                      impl=args.attn_impl)
    if name != FAIRSEQ:
        return plugin.to(args.device, DTYPES[args.dtype])
    stock = MultiheadAttention(args.embed_dim, args.heads, dropout=args.attention_dropout, self_attention=True)
    state = plugin.state_dict()
    missing, unexpected = set(stock.state_dict()) - set(state), set(state) - set(stock.state_dict())
    if missing or unexpected:
        raise RuntimeError(f"parameter names differ between SparseMultiheadAttention and fairseq's MultiheadAttention: "
                           f"missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    stock.load_state_dict(state, strict=True)
    return stock.to(args.device, DTYPES[args.dtype])


def measure(name: str, length: int, args) -> Dict[str, float]:
    """Peak MiB of a forward and of a forward + backward pass of one row."""
    attention = build_attention(name, args).train()
    gen = torch.Generator().manual_seed(args.seed)
    x = torch.randn(length, args.batch_size, args.embed_dim, generator=gen).to(args.device, DTYPES[args.dtype]).requires_grad_(True)
    # as TransformerDecoderBase.buffered_future_mask builds it (the encoder layer passes no attn_mask)
    causal = torch.triu(torch.full((length, length), float("-inf")), 1).to(x) if args.causal else None
    peak_bytes = cuda_peak_bytes if args.device.startswith("cuda") else cpu_peak_bytes

    def call():
        return attention(query=x, key=x, value=x, key_padding_mask=None, need_weights=False, attn_mask=causal)

    def forward():
        with torch.no_grad():
            call()

    def forward_backward():
        out, _ = call()
        out.sum().backward()
        attention.zero_grad(set_to_none=True)
        x.grad = None

    forward_backward()  # warm-up: one-off allocations (kernels, caches) stay out of the numbers
    return {"forward": peak_bytes(forward) / MIB, "forward+backward": peak_bytes(forward_backward) / MIB}


def format_table(results: Dict[str, Dict[str, float]], length: int, args) -> str:
    mode = "causal (decoder)" if args.causal else "bidirectional (encoder)"
    lines = [
        f"peak memory above inputs and parameters, one self-attention sublayer, {mode}, length {length}, "
        f"batch {args.batch_size}, d_model {args.embed_dim}, {args.heads} heads, k={args.k}, "
        f"attention dropout {args.attention_dropout}, device {args.device}, {args.dtype}, --attn-impl {args.attn_impl}; "
        f"{FAIRSEQ} = stock fairseq MultiheadAttention (fused path), softmax's weights",
        "",
        "| function | forward MiB | ×fairseq | ×softmax | forward+backward MiB | ×fairseq | ×softmax |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]

    def ratio(peaks, reference, pass_):
        base = results.get(reference)
        return f"{peaks[pass_] / base[pass_]:.2f}" if base and base[pass_] > 0 else "-"

    for name, peaks in results.items():
        cells = [f"{peaks[p]:.1f} | {ratio(peaks, FAIRSEQ, p)} | {ratio(peaks, 'softmax', p)}"
                 for p in ("forward", "forward+backward")]
        lines.append(f"| {name} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def main(argv: List[str] = None) -> Dict[int, Dict[str, Dict[str, float]]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--functions", nargs="+", default=DEFAULT_FUNCTIONS,
                        help=f"attention functions (default: %(default)s); '{FAIRSEQ}' (stock fairseq) is always measured")
    parser.add_argument("--lengths", "--length", nargs="+", type=int, default=[512], dest="lengths",
                        help="tokens in the sequence; one table per length (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--embed-dim", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--k", type=int, default=DEFAULT_K, help="attended positions for functions that take k (default: %(default)s)")
    parser.add_argument("--attention-dropout", type=float, default=0.0,
                        help="attention dropout of every row, active in the passes (default: %(default)s)")
    parser.add_argument("--causal", action="store_true", help="decoder self-attention: mask future keys")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    add_attn_impl_option(parser)
    add_dtype_option(parser)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--gather-chunk-elements", type=int, metavar="N",
                        help="the gathered path's chunk budget on --device, in float32 entries (top-k and the "
                             "patterns at length; default: gathered_attention.GATHER_CHUNK_ELEMENTS)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.gather_chunk_elements:
        GATHER_CHUNK_ELEMENTS[torch.device(args.device).type] = args.gather_chunk_elements
    rows = [FAIRSEQ] + [name for name in dict.fromkeys(args.functions) if name != FAIRSEQ]
    for name in rows[1:]:
        if name not in attention_names():
            parser.error(f"unknown attention function {name!r}; valid choices: {FAIRSEQ}, {', '.join(attention_names())}")
        if get_attention(name).owns_parameters:
            print(f"note: {name} owns parameters of its own; they are counted as its inputs", file=sys.stderr)
    if any(length < 1 for length in args.lengths):
        parser.error("--lengths must be positive")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device")
    resolve_dtype(args)
    tables = {}
    for length in dict.fromkeys(args.lengths):
        tables[length] = {name: measure(name, length, args) for name in rows}
        print(format_table(tables[length], length, args) + "\n", flush=True)
    return tables


if __name__ == "__main__":
    main()
