#!/usr/bin/env python
"""Train-step and beam-search decode throughput of each attention function and of L0Drop, as ratios to stock fairseq and to softmax.

One run builds one model per row, all with the same architecture and seed, and times
three jobs per row on the same sentences:

* train: one training step (forward + backward + Adam step) on the large batch;
  throughput in target tokens per second;
* decode, batch 1: beam search over ``--single-sentences`` sentences, one at a time;
* decode, large batch: beam search over ``--batch-size`` sentences in one batch;
* with ``--long-lengths L ...``: one training step on ``--long-batch-size`` random
  sequences of exactly L source and L target tokens (document-level lengths), per L.

Decoding is forced to ``--decode-len`` steps (min_len = max_len), so an untrained model's
early EOS cannot shorten the work and every row decodes the same number of steps. The
measurements run one after the other (decode batch 1, decode large batch, train, then
the long train steps), and within each the rows are interleaved: one untimed warm-up each, then ``--repeats``
rounds whose order rotates every round; the median time is reported. Machine noise thus
hits every row alike, and each ratio (reference time / row time; > 1 is faster than the
reference) compares times measured in the same run. Every row is reported against two
references: ``fairseq`` and ``softmax``. (The kinds are not mixed in one round
because the job after a train step runs slower, its large allocations just freed: with
all jobs in one rotated cycle, one row's decode would always follow a train step.)

Rows: ``fairseq`` is stock fairseq's own ``transformer`` model of the same sizes (e.g.
transformer_iwslt_de_en for transformer_sparse_iwslt_de_en), with stock
``MultiheadAttention`` (which takes PyTorch's fused ``F.multi_head_attention_forward`` path
whenever it has no incremental state) and the weights of the ``softmax`` row. Both are
always measured. Before the timings the script prints whether the two give the same
outputs: the max abs difference of their logits on the large batch (eval mode) and whether
their beam hypotheses are identical. Attention functions run where their paper puts them
(hard retrieval: decoder self- and cross-attention; self-attention-only patterns: encoder
and decoder self-attention; everything else: all three sublayers). The ``l0drop`` row is the softmax model with
L0Drop gates whose bias is set so that ``--sparsity`` of the large batch's source
encodings are pruned; it decodes from the compressed memory (Algorithm 1). Its train
row samples the gates (the fraction pruned in training is whatever the sampled gates
give) and adds the expected-L0 penalty; its decode jobs run on an untrained copy, so the
pruned fraction stays the one set.

    python -m fairseq_sparse.bench.run                                     # CPU, default rows
    python -m fairseq_sparse.bench.run --device cuda --arch transformer_sparse --batch-size 128
    python -m fairseq_sparse.bench.run --data data/iwslt14.de-en/bin --functions softmax topk hard
    python -m fairseq_sparse.bench.run --csv speed.csv
    python -m fairseq_sparse.bench.run --device cuda --long-lengths 512 1024

Timings are not tests: this script asserts nothing.
"""

import argparse
import copy
import csv
import functools
import logging
import math
import sys
import warnings
from typing import Dict, List, Optional

import torch
from fairseq.data import Dictionary

import fairseq_sparse  # noqa: F401
from fairseq_sparse.attention import attention_names
from fairseq_sparse.bench.common import (FAIRSEQ, L0DROP, STOCK_ARCHITECTURES, build_row, build_stock_reference,
                                         compare_models, describe_stock_architecture, forced_length_decoder,
                                         interleaved_medians, load_binarised_pairs, long_batch, make_batch,
                                         random_sentences, row_sublayers, synthetic_dictionary)

logger = logging.getLogger("fairseq_sparse.bench.run")

# Every registered function that is not a structured pattern (structured.py) or one of
# ReLA's Table 1 ablations 8-10 (rela_g_layernorm, rela_g_gelu, rela_g_leaky_relu; pass
# them, or any registered name, with --functions), then the L0Drop row. The fairseq and
# softmax rows are always measured: they are the references.
DEFAULT_FUNCTIONS = ["softmax", "topk", "hard", "rela_g", "rela_i", "relu", "relu_rmsnorm",
                     "sparsemax", "entmax15", "entmax_alpha", L0DROP]
REFERENCES = (FAIRSEQ, "softmax")
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

# Stock fairseq's decoder self-attention passes a float causal mask with a bool padding mask
# to F.multi_head_attention_forward, which warns once about the mixed types; the warning
# says nothing about the benchmark.
warnings.filterwarnings("ignore", message="Support for mismatched key_padding_mask and attn_mask is deprecated")


def long_job(length: int) -> str:
    return f"long{length}"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--functions", nargs="+", default=DEFAULT_FUNCTIONS,
                        help=f"rows: registered attention functions and/or '{L0DROP}' (default: %(default)s); "
                             f"'{FAIRSEQ}' (stock fairseq) and softmax are always measured, as the references")
    parser.add_argument("--arch", default="transformer_sparse_iwslt_de_en",
                        help=f"a transformer_sparse architecture with a stock fairseq counterpart: "
                             f"{', '.join(sorted(STOCK_ARCHITECTURES))} (default: %(default)s)")
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
    parser.add_argument("--skip-train", action="store_true", help="time decoding only (the long train steps too are skipped)")
    parser.add_argument("--long-lengths", nargs="*", type=int, default=[], metavar="L",
                        help="also time a train step on --long-batch-size random sequences of exactly L source and "
                             "L target tokens, per L (e.g. 512 1024; default: none)")
    parser.add_argument("--long-batch-size", type=int, default=2, help="sequences in each long train batch")
    parser.add_argument("--data", help="binarised fairseq data dir with a joined dictionary (default: random tokens)")
    parser.add_argument("--pair", default="de-en", help="language pair of --data")
    parser.add_argument("--split", default="test")
    parser.add_argument("--vocab", type=int, default=8000, help="vocabulary size of random data")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--csv", metavar="FILE", help="also write one row per function to this CSV file")
    args = parser.parse_args(argv)
    for name in args.functions:
        if name not in (L0DROP, FAIRSEQ) and name not in attention_names():
            parser.error(f"unknown row {name!r}; valid choices: {FAIRSEQ}, {L0DROP}, {', '.join(attention_names())}")
    if args.arch not in STOCK_ARCHITECTURES:
        parser.error(f"--arch {args.arch}: no stock fairseq counterpart is known; choose one of "
                     f"{', '.join(sorted(STOCK_ARCHITECTURES))}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device")
    if args.single_sentences < 1 or args.batch_size < 1 or args.repeats < 1 or args.long_batch_size < 1:
        parser.error("--batch-size, --single-sentences, --long-batch-size and --repeats must be positive")
    if any(length < 2 for length in args.long_lengths):
        parser.error("--long-lengths: every length must be at least 2 (EOS included)")
    args.long_lengths = list(dict.fromkeys(args.long_lengths))
    return args


def load_sentences(args, dictionary: Dictionary):
    count = max(args.batch_size, args.single_sentences)
    if not args.data:
        sources = random_sentences(dictionary, count, args.src_len, args.seed)
        return sources, sources
    pairs = load_binarised_pairs(args.data, args.pair, args.split, count, dictionary)
    if pairs is None:
        sys.exit(f"python -m fairseq_sparse.bench.run: error: no binarised {args.split}.{args.pair} split in {args.data}")
    return pairs


def describe(row: str, achieved_sparsity: Optional[float], args) -> str:
    if row == FAIRSEQ:
        return f"encoder+decoder+cross (stock fairseq {describe_stock_architecture(args.arch)})"
    sublayers = "+".join(row_sublayers(row))
    if row == L0DROP:
        return f"{sublayers} (softmax), L0Drop {achieved_sparsity:.0%} pruned, compressed memory"
    return sublayers


def format_equivalence(check: Dict, args, n_large: int) -> str:
    same = check["hypotheses_differ"] == 0
    hyps = ("identical in all " if same else f"DIFFERENT in {check['hypotheses_differ']} of ") + f"{check['sentences']} sentences"
    return "\n".join([
        "",
        f"## Plugin softmax vs stock fairseq ({args.arch} vs {describe_stock_architecture(args.arch)}, same weights, "
        f"eval mode, {args.device})",
        "",
        f"* max |logits difference|, large batch ({n_large} sentences, teacher forcing): {check['max_abs_logit_diff']:.2e}",
        f"* beam hypotheses (beam {args.beam}, {args.decode_len} forced steps, large batch): {hyps}"
        + (f"; max |score difference| {check['max_abs_score_diff']:.2e}" if same else ""),
        "",
    ])


def main(argv=None) -> Dict[str, Dict[str, float]]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = list(REFERENCES) + [fn for fn in dict.fromkeys(args.functions) if fn not in REFERENCES]

    dictionary = Dictionary.load(f"{args.data}/dict.{args.pair.split('-')[0]}.txt") if args.data else synthetic_dictionary(args.vocab)
    sources, targets = load_sentences(args, dictionary)
    large, target = make_batch(sources[:args.batch_size], targets[:args.batch_size], dictionary, args.device)
    singles = [make_batch([s], [s], dictionary, args.device)[0] for s in sources[:args.single_sentences]]
    ntokens = int(target.ne(dictionary.pad()).sum())
    n_large, n_single = len(large["src_tokens"]), len(singles)
    logger.info(f"{args.arch}, large batch {n_large} sentences ({int(large['src_tokens'].ne(dictionary.pad()).sum())} "
                f"source / {ntokens} target tokens), {n_single} sentences at batch 1, {args.decode_len} forced steps, "
                f"beam {args.beam}, device {args.device}, torch threads {torch.get_num_threads()}, "
                f"{'data ' + args.data if args.data else 'random tokens'}")

    train_models, decode_models, achieved = {}, {}, None
    for row in rows:
        if row == FAIRSEQ:
            continue  # built from the softmax row's weights, below
        model, pruned = build_row(row, args.arch, dictionary, args.seed, args.device, args.k, large, args.sparsity)
        train_models[row] = model
        # training moves the L0Drop gates: the l0drop row decodes with an untrained copy, at the sparsity set
        decode_models[row] = model if pruned is None else copy.deepcopy(model)
        achieved = pruned if pruned is not None else achieved
    try:
        stock = build_stock_reference(args.arch, train_models["softmax"], dictionary, args.seed, args.device)
    except (RuntimeError, ValueError) as err:
        sys.exit(f"python -m fairseq_sparse.bench.run: error: {err}")
    train_models[FAIRSEQ] = decode_models[FAIRSEQ] = stock
    train_models = {row: train_models[row] for row in rows}
    if achieved is not None:
        logger.info(f"{L0DROP}: {achieved:.1%} of the large batch's source encodings pruned")
    equivalence = compare_models(train_models["softmax"], stock, large, dictionary, args.beam, args.decode_len)
    print(format_equivalence(equivalence, args, n_large), flush=True)
    optimizers = {row: torch.optim.Adam(m.parameters(), lr=1e-4) for row, m in train_models.items()}

    def train_step(row, batch, batch_target):
        model = train_models[row].train()
        optimizers[row].zero_grad()
        logits, extra = model(**batch)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), batch_target.view(-1),
                                                 ignore_index=dictionary.pad())
        if "l0drop_expected_l0" in extra:  # L0Drop eq. 12, normalised as label_smoothed_cross_entropy_l0drop does
            src_tokens = batch["src_tokens"].ne(dictionary.pad()).sum()
            loss = loss + L0_LAMBDA * extra["l0drop_expected_l0"].sum() / src_tokens
        loss.backward()
        optimizers[row].step()

    decoders = {row: forced_length_decoder(decode_models[row], dictionary, args.beam, args.decode_len) for row in rows}

    def decode_singles(row):
        for batch in singles:
            decoders[row](batch)

    kinds = {"decode1": decode_singles, "decodeN": lambda row: decoders[row](large)}
    units = {"train": ntokens, "decode1": n_single, "decodeN": n_large}
    if not args.skip_train:
        kinds["train"] = functools.partial(train_step, batch=large, batch_target=target)
        for length in args.long_lengths:
            batch, batch_target = long_batch(dictionary, args.long_batch_size, length, args.seed, args.device)
            kinds[long_job(length)] = functools.partial(train_step, batch=batch, batch_target=batch_target)
            units[long_job(length)] = int(batch_target.ne(dictionary.pad()).sum())
    seconds = {}
    for kind, job in kinds.items():
        jobs = {(row, kind): functools.partial(job, row) for row in rows}
        seconds.update(interleaved_medians(jobs, args.repeats, args.device, log=lambda m, kind=kind: logger.info(f"{kind}: {m}")))

    jobs = list(JOBS) + [long_job(length) for length in args.long_lengths]
    results = {}
    for row in rows:
        results[row] = {"sublayers": describe(row, achieved, args)}
        for job in jobs:
            time = seconds.get((row, job), math.nan)
            results[row][f"{job}_seconds"] = time
            results[row][f"{job}_per_second"] = units.get(job, math.nan) / time
            results[row][f"{job}_ratio"] = seconds.get(("softmax", job), math.nan) / time
            results[row][f"{job}_ratio_fairseq"] = seconds.get((FAIRSEQ, job), math.nan) / time
    print(format_report(results, args, n_single, n_large, ntokens, achieved, units))
    if args.csv:
        write_csv(args.csv, results, args, jobs, equivalence)
    return results


def _absolute(name: str, r: Dict, ntokens: int, n_single: int, n_large: int) -> str:
    return (f"{name}, absolute: train {r['train_per_second']:,.0f} target tok/s ({r['train_seconds']:.3f} s per step of "
            f"{ntokens} target tokens); decode batch 1 {r['decode1_per_second']:.2f} sent/s ({r['decode1_seconds']:.3f} s "
            f"for {n_single} sentences); decode batch {n_large} {r['decodeN_per_second']:.2f} sent/s "
            f"({r['decodeN_seconds']:.3f} s)")


def format_report(results, args, n_single: int, n_large: int, ntokens: int, achieved: Optional[float],
                  units: Dict[str, int]) -> str:
    def cells(r, job):
        if math.isnan(r[f"{job}_ratio"]):  # e.g. the train step with --skip-train
            return "not measured | not measured"
        return f"{r[f'{job}_ratio_fairseq']:.2f}× | {r[f'{job}_ratio']:.2f}×"

    lines = [
        "",
        f"## Throughput vs stock fairseq and vs softmax ({args.arch}, {args.device}, torch threads {torch.get_num_threads()})",
        "",
        f"| function | sublayers | train ×fairseq | train ×softmax | decode batch 1 ×fairseq | decode batch 1 ×softmax "
        f"| decode batch {n_large} ×fairseq | decode batch {n_large} ×softmax |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row, r in results.items():
        lines.append(f"| {row} | {r['sublayers']} | {cells(r, 'train')} | {cells(r, 'decode1')} | {cells(r, 'decodeN')} |")
    lines += [
        "",
        _absolute(FAIRSEQ, results[FAIRSEQ], ntokens, n_single, n_large),
        _absolute("softmax", results["softmax"], ntokens, n_single, n_large),
        f"ratio = reference time / row time (> 1 is faster than the reference: {FAIRSEQ} = stock fairseq "
        f"{describe_stock_architecture(args.arch)}); median of {args.repeats} interleaved repetitions per measurement, "
        f"order rotated every repetition; decoding: beam {args.beam}, {args.decode_len} forced steps"
        + ("" if achieved is None else f"; {L0DROP}: {achieved:.1%} of source encodings pruned"),
    ]
    lengths = [length for length in args.long_lengths if not args.skip_train]
    if lengths:
        header = " | ".join(f"L={n} ×fairseq | L={n} ×softmax" for n in lengths)
        lines += [
            "",
            f"## Long sequences: train step on {args.long_batch_size} sequences of L source and L target tokens "
            f"(random tokens)",
            "",
            f"| function | {header} |",
            "|---|" + "---:|---:|" * len(lengths),
        ]
        for row, r in results.items():
            lines.append(f"| {row} | " + " | ".join(cells(r, long_job(n)) for n in lengths) + " |")
        lines.append("")
        for reference in REFERENCES:
            r = results[reference]
            lines.append(f"{reference}, absolute: " + "; ".join(
                f"L={n} {r[f'{long_job(n)}_per_second']:,.0f} target tok/s ({r[f'{long_job(n)}_seconds']:.3f} s per step "
                f"of {units[long_job(n)]} target tokens)" for n in lengths))
    lines += [
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
        ratios = []
        for job in ("decode1", "decodeN"):
            ratio = results[reference][f"{job}_seconds"] / results[row][f"{job}_seconds"]
            ratios.append(f"{ratio:.2f}× {'met' if ratio >= minimum else 'MISSED'}")
        lines.append(f"| {label} | ≥ {minimum:.2f}× | {ratios[0]} | {ratios[1]} |")
    return "\n".join(lines)


def write_csv(path: str, results: Dict[str, Dict], args, jobs: List[str], equivalence: Dict) -> None:
    """One row per benchmark row: ``JOB_ratio`` is against softmax, ``JOB_ratio_fairseq`` against stock fairseq."""
    fields = ["function", "sublayers"] + [f"{job}_{what}" for job in jobs
                                          for what in ("seconds", "per_second", "ratio", "ratio_fairseq")]
    settings = {"device": args.device, "arch": args.arch, "fairseq_arch": describe_stock_architecture(args.arch),
                "batch_size": args.batch_size, "single_sentences": args.single_sentences, "decode_len": args.decode_len,
                "beam": args.beam, "repeats": args.repeats, "threads": torch.get_num_threads(),
                "long_batch_size": args.long_batch_size,
                "softmax_vs_fairseq_max_abs_logit_diff": equivalence["max_abs_logit_diff"],
                "softmax_vs_fairseq_hypotheses_differ": equivalence["hypotheses_differ"]}
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields + list(settings))
        writer.writeheader()
        for row, r in results.items():
            writer.writerow({"function": row, **{k: r[k] for k in fields[1:]}, **settings})


if __name__ == "__main__":
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO,
                        stream=sys.stdout, force=True)
    main()
