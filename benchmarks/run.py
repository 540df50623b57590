#!/usr/bin/env python
"""Train-step and beam-search decode throughput of each attention function and of L0Drop, as ratios to softmax.

One run builds one model per row, all with the same architecture and seed, and times
three jobs per row on the same sentences:

* train: one training step (forward + backward + Adam step) on the large batch;
  throughput in target tokens per second;
* decode, batch 1: beam search over ``--single-sentences`` sentences, one at a time;
* decode, large batch: beam search over ``--batch-size`` sentences in one batch.

Decoding is forced to ``--decode-len`` steps (min_len = max_len), so an untrained model's
early EOS cannot shorten the work and every row decodes the same number of steps. The
three measurements run one after the other (decode batch 1, decode large batch, train),
and within each the rows are interleaved: one untimed warm-up each, then ``--repeats``
rounds whose order rotates every round; the median time is reported. Machine noise thus
hits every row alike, and each ratio (softmax time / row time; > 1 is faster than
softmax) compares times measured in the same run. (The kinds are not mixed in one round
because the job after a train step runs slower, its large allocations just freed: with
all jobs in one rotated cycle, one row's decode would always follow a train step.)

Rows: attention functions run where their paper puts them (hard retrieval: decoder self-
and cross-attention; self-attention-only patterns: encoder and decoder self-attention;
everything else: all three sublayers). The ``l0drop`` row is the softmax model with
L0Drop gates whose bias is set so that ``--sparsity`` of the large batch's source
encodings are pruned; it decodes from the compressed memory (Algorithm 1). Its train
row samples the gates (the fraction pruned in training is whatever the sampled gates
give) and adds the expected-L0 penalty; its decode jobs run on an untrained copy, so the
pruned fraction stays the one set.

    python benchmarks/run.py                                     # CPU, default rows
    python benchmarks/run.py --device cuda --arch transformer_sparse --batch-size 128
    python benchmarks/run.py --data data/iwslt14.de-en/bin --functions softmax topk hard
    python benchmarks/run.py --csv speed.csv

Timings are not tests: this script asserts nothing.
"""

import argparse
import copy
import csv
import functools
import logging
import math
import sys
from typing import Dict, Optional

import torch
from fairseq.data import Dictionary

import fairseq_sparse  # noqa: F401
from fairseq_sparse.attention import attention_names
from fairseq_sparse.benchmarking import (L0DROP, build_row, forced_length_decoder, interleaved_medians, load_binarised_pairs,
                                         make_batch, random_sentences, row_sublayers, synthetic_dictionary)

logger = logging.getLogger("fairseq_sparse.benchmarks.run")

# Every registered function that is not a structured pattern (structured.py) or one of
# ReLA's Table 1 ablations 8-10 (rela_g_layernorm, rela_g_gelu, rela_g_leaky_relu; pass
# them, or any registered name, with --functions), then the L0Drop row.
DEFAULT_FUNCTIONS = ["softmax", "topk", "hard", "rela_g", "rela_i", "relu", "relu_rmsnorm",
                     "sparsemax", "entmax15", "entmax_alpha", L0DROP]
L0_LAMBDA = 0.3  # the penalty weight of the L0Drop train step (label_smoothed_cross_entropy_l0drop's default)

# The targets: (what, faster row, reference row, minimum of reference time / row time), for decoding.
TARGETS = [
    ("hard retrieval vs softmax", "hard", "softmax", 1.5),
    ("top-k vs softmax", "topk", "softmax", 0.95),
    ("ReLA-g vs softmax", "rela_g", "softmax", 0.95),
    ("top-k vs sparsemax", "topk", "sparsemax", 2.0),
    ("top-k vs α-entmax (entmax_alpha)", "topk", "entmax_alpha", 10.0),
]
JOBS = ("train", "decode1", "decodeN")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--functions", nargs="+", default=DEFAULT_FUNCTIONS,
                        help=f"rows: registered attention functions and/or '{L0DROP}' (default: %(default)s); "
                             "softmax is always measured, as the reference")
    parser.add_argument("--arch", default="transformer_sparse_iwslt_de_en")
    parser.add_argument("--k", type=int, default=8, help="k for functions that take it")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences of the large batch (train and decode)")
    parser.add_argument("--single-sentences", type=int, default=4,
                        help="sentences decoded one at a time for the batch-1 job (the first of the large batch)")
    parser.add_argument("--src-len", type=int, default=30, help="max length of random sentences (min is half)")
    parser.add_argument("--decode-len", type=int, default=30, help="decoding steps (min_len = max_len)")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repetitions; the median is reported")
    parser.add_argument("--sparsity", type=float, default=0.45, help="fraction of source encodings the l0drop row prunes")
    parser.add_argument("--skip-train", action="store_true", help="time decoding only")
    parser.add_argument("--data", help="binarised fairseq data dir with a joined dictionary (default: random tokens)")
    parser.add_argument("--pair", default="de-en", help="language pair of --data")
    parser.add_argument("--split", default="test")
    parser.add_argument("--vocab", type=int, default=8000, help="vocabulary size of random data")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--csv", metavar="FILE", help="also write one row per function to this CSV file")
    args = parser.parse_args(argv)
    for name in args.functions:
        if name != L0DROP and name not in attention_names():
            parser.error(f"unknown row {name!r}; valid choices: {L0DROP}, {', '.join(attention_names())}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device")
    if args.single_sentences < 1 or args.batch_size < 1 or args.repeats < 1:
        parser.error("--batch-size, --single-sentences and --repeats must be positive")
    return args


def load_sentences(args, dictionary: Dictionary):
    count = max(args.batch_size, args.single_sentences)
    if not args.data:
        sources = random_sentences(dictionary, count, args.src_len, args.seed)
        return sources, sources
    pairs = load_binarised_pairs(args.data, args.pair, args.split, count, dictionary)
    if pairs is None:
        sys.exit(f"benchmarks/run.py: error: no binarised {args.split}.{args.pair} split in {args.data}")
    return pairs


def describe(row: str, achieved_sparsity: Optional[float]) -> str:
    sublayers = "+".join(row_sublayers(row))
    if row == L0DROP:
        return f"{sublayers} (softmax), L0Drop {achieved_sparsity:.0%} pruned, compressed memory"
    return sublayers


def main(argv=None) -> Dict[str, Dict[str, float]]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = ["softmax"] + [fn for fn in dict.fromkeys(args.functions) if fn != "softmax"]

    dictionary = Dictionary.load(f"{args.data}/dict.{args.pair.split('-')[0]}.txt") if args.data else synthetic_dictionary(args.vocab)
    sources, targets = load_sentences(args, dictionary)
    large, target = make_batch(sources[:args.batch_size], targets[:args.batch_size], dictionary, args.device)
    singles = [make_batch([s], [s], dictionary, args.device)[0] for s in sources[:args.single_sentences]]
    ntokens = int(target.ne(dictionary.pad()).sum())
    src_tokens = int(large["src_tokens"].ne(dictionary.pad()).sum())
    n_large, n_single = len(large["src_tokens"]), len(singles)
    logger.info(f"{args.arch}, large batch {n_large} sentences ({src_tokens} source / {ntokens} target tokens), "
                f"{n_single} sentences at batch 1, {args.decode_len} forced steps, beam {args.beam}, device {args.device}, "
                f"torch threads {torch.get_num_threads()}, {'data ' + args.data if args.data else 'random tokens'}")

    train_models, decode_models, achieved = {}, {}, None
    for row in rows:
        model, pruned = build_row(row, args.arch, dictionary, args.seed, args.device, args.k, large, args.sparsity)
        train_models[row] = model
        # training moves the L0Drop gates: the l0drop row decodes with an untrained copy, at the sparsity set
        decode_models[row] = model if pruned is None else copy.deepcopy(model)
        achieved = pruned if pruned is not None else achieved
    if achieved is not None:
        logger.info(f"{L0DROP}: {achieved:.1%} of the large batch's source encodings pruned")
    optimizers = {row: torch.optim.Adam(m.parameters(), lr=1e-4) for row, m in train_models.items()}

    def train_step(row):
        model = train_models[row].train()
        optimizers[row].zero_grad()
        logits, extra = model(**large)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), target.view(-1), ignore_index=dictionary.pad())
        if "l0drop_expected_l0" in extra:  # L0Drop eq. 12, normalised as label_smoothed_cross_entropy_l0drop does
            loss = loss + L0_LAMBDA * extra["l0drop_expected_l0"].sum() / src_tokens
        loss.backward()
        optimizers[row].step()

    decoders = {row: forced_length_decoder(decode_models[row], dictionary, args.beam, args.decode_len) for row in rows}

    def decode_singles(row):
        for batch in singles:
            decoders[row](batch)

    kinds = {"decode1": decode_singles, "decodeN": lambda row: decoders[row](large)}
    if not args.skip_train:
        kinds["train"] = train_step
    seconds = {}
    for kind, job in kinds.items():
        jobs = {(row, kind): functools.partial(job, row) for row in rows}
        seconds.update(interleaved_medians(jobs, args.repeats, args.device, log=lambda m, kind=kind: logger.info(f"{kind}: {m}")))

    units = {"train": ntokens, "decode1": n_single, "decodeN": n_large}
    results = {}
    for row in rows:
        results[row] = {"sublayers": describe(row, achieved)}
        for job in JOBS:
            time = seconds.get((row, job), math.nan)
            results[row][f"{job}_seconds"] = time
            results[row][f"{job}_per_second"] = units[job] / time
            results[row][f"{job}_ratio"] = seconds.get(("softmax", job), math.nan) / time
    print(format_report(results, args, n_single, n_large, ntokens, achieved))
    if args.csv:
        write_csv(args.csv, results, args)
    return results


def format_report(results, args, n_single: int, n_large: int, ntokens: int, achieved: Optional[float]) -> str:
    soft = results["softmax"]
    lines = [
        "",
        f"## Throughput vs softmax ({args.arch}, {args.device}, torch threads {torch.get_num_threads()})",
        "",
        f"| function | sublayers | train ×softmax | decode batch 1 ×softmax | decode batch {n_large} ×softmax |",
        "|---|---|---:|---:|---:|",
    ]
    for row, r in results.items():
        lines.append(f"| {row} | {r['sublayers']} | {r['train_ratio']:.2f}× | {r['decode1_ratio']:.2f}× | {r['decodeN_ratio']:.2f}× |")
    lines += [
        "",
        f"softmax, absolute: train {soft['train_per_second']:,.0f} target tok/s ({soft['train_seconds']:.3f} s per step of "
        f"{ntokens} target tokens); decode batch 1 {soft['decode1_per_second']:.2f} sent/s ({soft['decode1_seconds']:.3f} s "
        f"for {n_single} sentences); decode batch {n_large} {soft['decodeN_per_second']:.2f} sent/s "
        f"({soft['decodeN_seconds']:.3f} s)",
        f"ratio = softmax time / row time (> 1 is faster than softmax); median of {args.repeats} interleaved repetitions "
        f"per measurement, order rotated every repetition; decoding: beam {args.beam}, {args.decode_len} forced steps"
        + ("" if achieved is None else f"; {L0DROP}: {achieved:.1%} of source encodings pruned"),
        "",
        "## Targets (decoding; ratio = reference time / row time)",
        "",
        f"| target | required | batch 1 | batch {n_large} |",
        "|---|---:|---:|---:|",
    ]
    for label, row, reference, minimum in TARGETS:
        if row not in results or reference not in results:
            lines.append(f"| {label} | ≥ {minimum:.2f}× | not measured | not measured |")
            continue
        cells = []
        for job in ("decode1", "decodeN"):
            ratio = results[reference][f"{job}_seconds"] / results[row][f"{job}_seconds"]
            cells.append(f"{ratio:.2f}× {'met' if ratio >= minimum else 'MISSED'}")
        lines.append(f"| {label} | ≥ {minimum:.2f}× | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def write_csv(path: str, results: Dict[str, Dict], args) -> None:
    fields = ["function", "sublayers"] + [f"{job}_{what}" for job in JOBS for what in ("seconds", "per_second", "ratio")]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields + ["device", "arch", "batch_size", "single_sentences", "decode_len",
                                                       "beam", "repeats", "threads"])
        writer.writeheader()
        for row, r in results.items():
            writer.writerow({"function": row, **{k: r[k] for k in fields[1:]}, "device": args.device, "arch": args.arch,
                             "batch_size": args.batch_size, "single_sentences": args.single_sentences,
                             "decode_len": args.decode_len, "beam": args.beam, "repeats": args.repeats,
                             "threads": torch.get_num_threads()})


if __name__ == "__main__":
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO,
                        stream=sys.stdout, force=True)
    main()
