#!/usr/bin/env python
"""Where forced-length beam search spends its time, per attention function (torch.profiler).

Builds the same models as ``fairseq_sparse.bench.run`` (same placement, seed, sentences), decodes
once untimed, then once under ``torch.profiler`` with labelled regions:

* ``attention fn``: the registered attention function itself (scores -> output), every
  sublayer where the row runs it;
* ``output norm``: the normalisation of the concatenated heads some functions add (ReLA's
  gated RMSNorm);
* ``attention sublayers``: whole ``SparseMultiheadAttention`` calls (projections, cache,
  masks, the function, output norm and projection), softmax sublayers included;
* ``encoder``, ``decoder``: the model's forward passes (the decoder's includes its vocabulary
  projection), and ``log-probs``: the log-softmax over the vocabulary;
* the rest of the decode is fairseq's beam search (top-k over beams, reordering the
  caches, bookkeeping).

Times are the profiler's CPU time per region (on CUDA also the device time). The profiler
adds a few microseconds per op, which inflates regions with many small ops; read shares,
not absolute numbers. ``Amdahl bound`` is the speed-up of the whole decode if the attention
function and its output norm cost nothing: 1 / (1 - their share).

    python -m fairseq_sparse.bench.profile_decode --functions softmax hard topk rela_g --batch-size 32 --decode-len 10
    python -m fairseq_sparse.bench.profile_decode --device cuda --top 15       # also the heaviest aten ops
"""

import argparse
import dataclasses
import functools
import gc
import logging
import os

os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # before torch: no profiler start/stop lines

import torch
from fairseq.data import Dictionary
from torch.profiler import ProfilerActivity, profile, record_function

import fairseq_sparse  # noqa: F401
from fairseq_sparse.bench.common import build_row, forced_length_decoder, make_batch, random_sentences, synthetic_dictionary
from fairseq_sparse.core.attention import DEFAULT_K
from fairseq_sparse.core.modules.sparse_multihead_attention import SparseMultiheadAttention

logging.basicConfig(level=logging.WARNING, force=True)
REGIONS = ["attention fn", "output norm", "attention sublayers", "encoder", "decoder", "log-probs"]


def labelled(label, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with record_function(label):
            return fn(*args, **kwargs)
    return wrapper


def instrument(model) -> None:
    for module in model.modules():
        if isinstance(module, SparseMultiheadAttention):
            module.spec = dataclasses.replace(module.spec, fn=labelled("attention fn", module.spec.fn))
            module.forward = labelled("attention sublayers", module.forward)
            if module.output_norm is not None:
                module.output_norm.forward = labelled("output norm", module.output_norm.forward)
    model.encoder.forward = labelled("encoder", model.encoder.forward)
    model.decoder.forward = labelled("decoder", model.decoder.forward)
    model.get_normalized_probs = labelled("log-probs", model.get_normalized_probs)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--functions", nargs="+", default=["softmax", "hard", "topk", "rela_g"])
    parser.add_argument("--arch", default="transformer_sparse_iwslt_de_en")
    parser.add_argument("--k", type=int, default=DEFAULT_K)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int)
    parser.add_argument("--batch-size", type=int, default=32, help="sentences decoded in one batch")
    parser.add_argument("--src-len", type=int, default=30)
    parser.add_argument("--decode-len", type=int, default=30)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--pruned", "--sparsity", type=float, default=0.45)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--top", type=int, default=0, help="also print the N aten ops with the most self time")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device")

    dictionary: Dictionary = synthetic_dictionary(args.vocab)
    sources = random_sentences(dictionary, args.batch_size, args.src_len, args.seed)
    batch, _ = make_batch(sources, sources, dictionary, args.device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    lines = [f"\n{args.arch}, batch {len(sources)}, beam {args.beam}, {args.decode_len} forced steps, device {args.device}, "
             f"torch threads {torch.get_num_threads()}; ms of CPU time per region (% of the decode)", "",
             "| function | decode ms | " + " | ".join(REGIONS) + " | beam search & rest | Amdahl bound |",
             "|---|---:|" + "---:|" * (len(REGIONS) + 2)]
    tops = []
    for row in args.functions:
        model, _ = build_row(row, args.arch, dictionary, args.seed, args.device, args.k, batch, args.pruned)
        instrument(model)
        decode = forced_length_decoder(model, dictionary, args.beam, args.decode_len)
        decode(batch)  # warm-up
        gc.collect()  # the previous row's model is garbage now: collect it before, not during, the profile
        with profile(activities=activities) as prof:
            with record_function("decode"):
                decode(batch)
            if args.device == "cuda":
                torch.cuda.synchronize()
        events = {e.key: e for e in prof.key_averages()}
        ms = {name: events[name].cpu_time_total / 1e3 if name in events else 0.0 for name in REGIONS + ["decode"]}
        total = ms["decode"]
        rest = total - ms["encoder"] - ms["decoder"] - ms["log-probs"]
        share = (ms["attention fn"] + ms["output norm"]) / total
        cells = [f"{ms[name]:.0f} ({ms[name] / total:.0%})" for name in REGIONS] + [f"{rest:.0f} ({rest / total:.0%})"]
        lines.append(f"| {row} | {total:.0f} | " + " | ".join(cells) + f" | {1 / (1 - share):.2f}× |")
        if args.device == "cuda":
            device_ms = {name: getattr(events[name], "device_time_total", 0) / 1e3 for name in REGIONS if name in events}
            lines.append("|  (device ms) | | " + " | ".join(f"{device_ms.get(n, 0):.0f}" for n in REGIONS) + " | | |")
        if args.top:
            tops.append(f"\n{row}: aten ops with the most self CPU time\n"
                        + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))
    print("\n".join(lines + tops))


if __name__ == "__main__":
    main()
