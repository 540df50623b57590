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
import statistics
import sys
import time
from typing import Callable, Dict, List

import torch
from fairseq import utils
from fairseq.data import Dictionary, data_utils
from fairseq.data.data_utils import collate_tokens
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
from fairseq.sequence_generator import SequenceGenerator

import fairseq_sparse  # noqa: F401
from fairseq_sparse.attention import attention_names

logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO, stream=sys.stdout, force=True)
logger = logging.getLogger("fairseq_sparse.benchmark_speed")

# Where each method runs by default: its paper's placement.
PLACEMENT = {"hard": ("decoder", "cross")}
ALL_SUBLAYERS = ("encoder", "decoder", "cross")


class _Task:
    def __init__(self, dictionary: Dictionary):
        self.source_dictionary = self.target_dictionary = dictionary


def load_batches(args, dictionary: Dictionary):
    """Source/target token batches: from a binarised fairseq split, or random tokens."""
    gen = torch.Generator().manual_seed(args.seed)
    if args.data:
        src, tgt = args.pair.split("-")
        src_data = data_utils.load_indexed_dataset(f"{args.data}/{args.split}.{args.pair}.{src}", dictionary)
        tgt_data = data_utils.load_indexed_dataset(f"{args.data}/{args.split}.{args.pair}.{tgt}", dictionary)
        if src_data is None or tgt_data is None:
            sys.exit(f"benchmark_speed: error: no binarised {args.split}.{args.pair} split in {args.data}")
        pairs = [(src_data[i], tgt_data[i]) for i in range(min(len(src_data), args.batch_size))]
    else:
        def sentence(n):
            return torch.cat([torch.randint(dictionary.nspecial, len(dictionary), (n - 1,), generator=gen), torch.tensor([dictionary.eos()])])

        lengths = torch.randint(args.src_len // 2, args.src_len + 1, (args.batch_size,), generator=gen).tolist()
        pairs = [(sentence(n), sentence(n)) for n in lengths]
    pad, eos = dictionary.pad(), dictionary.eos()
    src_tokens = collate_tokens([s for s, _ in pairs], pad, eos, left_pad=True)
    target = collate_tokens([t for _, t in pairs], pad, eos, left_pad=False)
    prev = collate_tokens([t for _, t in pairs], pad, eos, left_pad=False, move_eos_to_beginning=True)
    src_lengths = torch.tensor([len(s) for s, _ in pairs])
    return {"src_tokens": src_tokens, "src_lengths": src_lengths, "prev_output_tokens": prev}, target


def build_model(args, fn: str, dictionary: Dictionary):
    model_args = argparse.Namespace(dropout=0.1, attention_dropout=0.1, attn_k=args.k, share_all_embeddings=True)
    for sublayer in PLACEMENT.get(fn, ALL_SUBLAYERS):
        setattr(model_args, f"{sublayer}_attn_fn", fn)
    ARCH_CONFIG_REGISTRY[args.arch](model_args)
    torch.manual_seed(args.seed)
    return ARCH_MODEL_REGISTRY[args.arch].build_model(model_args, _Task(dictionary)).to(args.device)


def timed(fn: Callable[[], None], device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


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
    args.functions = ["softmax"] + [fn for fn in args.functions if fn != "softmax"]
    for name in args.functions:
        if name not in attention_names():
            parser.error(f"unknown attention function {name!r}; valid choices: {', '.join(attention_names())}")

    if args.data:
        src = args.pair.split("-")[0]
        dictionary = Dictionary.load(f"{args.data}/dict.{src}.txt")
    else:
        dictionary = Dictionary()
        for i in range(args.vocab):
            dictionary.add_symbol(f"w{i}")
    batch, target = load_batches(args, dictionary)
    batch = utils.move_to_cuda(batch) if args.device == "cuda" else batch
    target = target.to(args.device)
    ntokens = int(target.ne(dictionary.pad()).sum())
    logger.info(f"{args.arch}, {len(batch['src_tokens'])} sentences, {ntokens} target tokens, device {args.device}, "
                f"torch threads {torch.get_num_threads()}")

    models = {fn: build_model(args, fn, dictionary) for fn in args.functions}
    for model in models.values():
        for layer in model.decoder.layers:
            # as fairseq-generate's make_generation_fast_: weights only for the alignment layer
            layer.need_attn = False
    optimizers = {fn: torch.optim.Adam(m.parameters(), lr=1e-4) for fn, m in models.items()}

    def train_step(fn):
        model = models[fn].train()
        optimizers[fn].zero_grad()
        logits, _ = model(**batch)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), target.view(-1), ignore_index=dictionary.pad())
        loss.backward()
        optimizers[fn].step()

    generators = {
        fn: SequenceGenerator([models[fn]], dictionary, beam_size=args.beam, max_len_a=0, max_len_b=args.decode_len, min_len=args.decode_len)
        for fn in args.functions
    }

    def decode(fn):
        models[fn].eval()
        with torch.no_grad():
            generators[fn].generate([models[fn]], {"net_input": {k: batch[k] for k in ("src_tokens", "src_lengths")}})

    times: Dict[str, Dict[str, List[float]]] = {fn: {"train": [], "decode": []} for fn in args.functions}
    for fn in args.functions:  # warm-up, untimed
        if not args.skip_train:
            train_step(fn)
        decode(fn)
    for rep in range(args.repeats):
        for fn in args.functions:
            if not args.skip_train:
                times[fn]["train"].append(timed(lambda: train_step(fn), args.device))
            times[fn]["decode"].append(timed(lambda: decode(fn), args.device))
        logger.info(f"repetition {rep + 1}/{args.repeats} done")

    sentences = len(batch["src_tokens"])
    results = {}
    header = f"| function | sublayers | train tok/s | train ratio | decode sent/s (beam {args.beam}) | decode ratio |"
    print("\n" + header)
    print("|---|---|---:|---:|---:|---:|")
    base = {kind: statistics.median(times["softmax"][kind]) if times["softmax"][kind] else float("nan") for kind in ("train", "decode")}
    for fn in args.functions:
        train = statistics.median(times[fn]["train"]) if times[fn]["train"] else float("nan")
        dec = statistics.median(times[fn]["decode"])
        results[fn] = {"train_ratio": base["train"] / train, "decode_ratio": base["decode"] / dec}
        sublayers = "+".join(PLACEMENT.get(fn, ALL_SUBLAYERS))
        print(f"| {fn} | {sublayers} | {ntokens / train:,.0f} | {results[fn]['train_ratio']:.2f}x | "
              f"{sentences / dec:,.1f} | {results[fn]['decode_ratio']:.2f}x |")
    print(f"\nmedian of {args.repeats} interleaved repetitions; ratio = softmax time / function time "
          f"(>1 is faster); decode = {args.decode_len} forced steps, beam {args.beam}, batch {sentences}")
    return results


if __name__ == "__main__":
    main()
