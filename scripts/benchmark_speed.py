#!/usr/bin/env python
"""Train-step and beam-search decode throughput of each attention function, as ratios to softmax.

Every function gets the same architecture, the same initial weights (where the
parameters coincide), the same batches and the same number of decoding steps
(min_len = max_len, so an untrained model's early EOS cannot shorten the work).
Repetitions are interleaved across functions and the median time is reported, so
machine noise hits every function alike. Ratios > 1 mean faster than softmax.

    python scripts/benchmark_speed.py                        # CPU, all functions
    python scripts/benchmark_speed.py --device cuda --arch transformer_sparse --batch-size 128
    python scripts/benchmark_speed.py --data data/bible-de-en/bin   # real sentences

Timings are not tests: this script asserts nothing.
"""

import argparse
import logging
import sys
from typing import Dict

import torch
from fairseq.data import Dictionary, data_utils

import fairseq_sparse  # noqa: F401
from fairseq_sparse.attention import attention_names, get_attention
from fairseq_sparse.benchmarking import build, forced_length_decoder, interleaved_medians, make_batch, random_sentences, synthetic_dictionary

logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO, stream=sys.stdout, force=True)
logger = logging.getLogger("fairseq_sparse.benchmark_speed")

# Where each method runs: its paper's placement (hard retrieval: decoder self + cross).
PLACEMENT = {"hard": ("decoder", "cross")}
ALL_SUBLAYERS = ("encoder", "decoder", "cross")


def placement(fn: str, self_only: bool):
    sublayers = PLACEMENT.get(fn, ALL_SUBLAYERS)
    return tuple(s for s in sublayers if not (self_only and s == "cross"))


def load_pairs(args, dictionary: Dictionary):
    if not args.data:
        sources = random_sentences(dictionary, args.batch_size, args.src_len, args.seed)
        return sources, sources
    src, tgt = args.pair.split("-")
    src_data = data_utils.load_indexed_dataset(f"{args.data}/{args.split}.{args.pair}.{src}", dictionary)
    tgt_data = data_utils.load_indexed_dataset(f"{args.data}/{args.split}.{args.pair}.{tgt}", dictionary)
    if src_data is None or tgt_data is None:
        sys.exit(f"benchmark_speed: error: no binarised {args.split}.{args.pair} split in {args.data}")
    count = min(len(src_data), args.batch_size)
    return [src_data[i] for i in range(count)], [tgt_data[i] for i in range(count)]


def main(argv=None) -> Dict[str, Dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--functions", nargs="+", default=attention_names(), help="attention functions (default: all)")
    parser.add_argument("--arch", default="transformer_sparse_iwslt_de_en")
    parser.add_argument("--k", type=int, default=8, help="k for functions that take it")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--batch-size", type=int, default=32, help="sentences per batch")
    parser.add_argument("--src-len", type=int, default=30, help="max length of random sentences (min is half)")
    parser.add_argument("--decode-len", type=int, default=30, help="decoding steps (min_len = max_len)")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repetitions; the median is reported")
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--data", help="binarised fairseq data dir (default: random tokens)")
    parser.add_argument("--pair", default="de-en", help="language pair of --data")
    parser.add_argument("--split", default="test")
    parser.add_argument("--vocab", type=int, default=8000, help="vocabulary size of random data")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    for name in args.functions:
        if name not in attention_names():
            parser.error(f"unknown attention function {name!r}; valid choices: {', '.join(attention_names())}")
    functions = ["softmax"] + [fn for fn in args.functions if fn != "softmax"]

    dictionary = Dictionary.load(f"{args.data}/dict.{args.pair.split('-')[0]}.txt") if args.data else synthetic_dictionary(args.vocab)
    batch, target = make_batch(*load_pairs(args, dictionary), dictionary, args.device)
    ntokens = int(target.ne(dictionary.pad()).sum())
    sentences = len(batch["src_tokens"])
    logger.info(f"{args.arch}, {sentences} sentences, {ntokens} target tokens, device {args.device}, "
                f"torch threads {torch.get_num_threads()}")

    models, sublayers = {}, {}
    for fn in functions:
        sublayers[fn] = placement(fn, get_attention(fn).self_attention_only)
        models[fn] = build(args.arch, dictionary, args.seed, args.device, attn_k=args.k,
                           **{f"{s}_attn_fn": fn for s in sublayers[fn]})
    optimizers = {fn: torch.optim.Adam(m.parameters(), lr=1e-4) for fn, m in models.items()}

    def train_step(fn):
        model = models[fn].train()
        optimizers[fn].zero_grad()
        logits, _ = model(**batch)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), target.view(-1), ignore_index=dictionary.pad())
        loss.backward()
        optimizers[fn].step()

    decoders = {fn: forced_length_decoder(models[fn], dictionary, args.beam, args.decode_len) for fn in functions}
    jobs = {}
    for fn in functions:
        if not args.skip_train:
            jobs[(fn, "train")] = lambda fn=fn: train_step(fn)
        jobs[(fn, "decode")] = lambda fn=fn: decoders[fn](batch)
    seconds = interleaved_medians(jobs, args.repeats, args.device, log=logger.info)

    print(f"\n| function | sublayers | train tok/s | train ratio | decode sent/s (beam {args.beam}) | decode ratio |")
    print("|---|---|---:|---:|---:|---:|")
    results = {}
    for fn in functions:
        train = seconds.get((fn, "train"), float("nan"))
        decode = seconds[(fn, "decode")]
        results[fn] = {"train_ratio": seconds.get(("softmax", "train"), float("nan")) / train,
                       "decode_ratio": seconds[("softmax", "decode")] / decode}
        print(f"| {fn} | {'+'.join(sublayers[fn])} | {ntokens / train:,.0f} | {results[fn]['train_ratio']:.2f}x | "
              f"{sentences / decode:,.1f} | {results[fn]['decode_ratio']:.2f}x |")
    print(f"\nmedian of {args.repeats} interleaved repetitions; ratio = softmax time / function time "
          f"(>1 is faster); decode = {args.decode_len} forced steps, beam {args.beam}, batch {sentences}")
    return results


if __name__ == "__main__":
    main()
