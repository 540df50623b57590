"""What ``fairseq_sparse.bench.run`` prints and writes: the check that stock fairseq and the plugin's
softmax compute the same function, the throughput table (train step, decode at batch 1 and at the
large batch), the long-length table, the decoding targets, and the CSV."""

import argparse
import csv
import math
from typing import Dict, List, Optional

import torch

from fairseq_sparse.bench.common import FAIRSEQ, L0DROP, describe_stock_architecture, row_sublayers
from fairseq_sparse.bench.long_lengths import long_table
from fairseq_sparse.bench.run_jobs import REFERENCES, ratio_cells

# The targets: (what, faster row, reference row, minimum of reference time / row time), for decoding.
TARGETS = [
    ("hard retrieval vs softmax", "hard", "softmax", 1.5),
    ("top-k vs softmax", "topk", "softmax", 0.95),
    ("ReLA-g vs softmax", "rela_g", "softmax", 0.95),
    ("top-k vs sparsemax", "topk", "sparsemax", 2.0),
    ("top-k vs α-entmax (entmax_alpha)", "topk", "entmax_alpha", 10.0),
]


def describe(row: str, achieved_pruned: Optional[float], arch: str) -> str:
    """The sublayers column: where the row's attention runs (and what the l0drop row prunes)."""
    if row == FAIRSEQ:
        return f"encoder+decoder+cross (stock fairseq {describe_stock_architecture(arch)})"
    sublayers = "+".join(row_sublayers(row))
    if row == L0DROP:
        return f"{sublayers} (softmax), L0Drop {achieved_pruned:.0%} pruned, compressed memory"
    return sublayers


def format_equivalence(check: Dict, args: argparse.Namespace, n_large: int) -> str:
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


def _absolute(name: str, r: Dict, units: Dict[str, int]) -> str:
    # --skip-train leaves the train step unmeasured (NaN): say nothing of it
    train = ("" if math.isnan(r['train_seconds']) else f"train {r['train_per_second']:,.0f} target tok/s "
             f"({r['train_seconds']:.3f} s per step of {units['train']} target tokens); ")
    # --skip-decode leaves the decoding unmeasured: say nothing of it either
    decode = ("" if math.isnan(r['decode1_seconds']) else
              f"decode batch 1 {r['decode1_per_second']:.2f} sent/s ({r['decode1_seconds']:.3f} s for {units['decode1']} "
              f"sentences); decode batch {units['decodeN']} {r['decodeN_per_second']:.2f} sent/s "
              f"({r['decodeN_seconds']:.3f} s)")
    return f"{name}, absolute: {train}{decode}".rstrip("; ")


def throughput_table(results: Dict[str, Dict], args: argparse.Namespace, achieved: Optional[float],
                     units: Dict[str, int]) -> List[str]:
    """Every row's ratios for the train step and the two decodes, then the references' absolute throughput."""
    n_large = units["decodeN"]
    lines = [
        "",
        f"## Throughput vs stock fairseq and vs softmax ({args.arch}, {args.device}, {args.dtype}, "
        f"--attn-impl {args.attn_impl}, "
        f"torch threads {torch.get_num_threads()})",
        "",
        f"| function | sublayers | train ×fairseq | train ×softmax | decode batch 1 ×fairseq | decode batch 1 ×softmax "
        f"| decode batch {n_large} ×fairseq | decode batch {n_large} ×softmax |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row, r in results.items():
        lines.append(f"| {row} | {r['sublayers']} | {ratio_cells(r, 'train')} | {ratio_cells(r, 'decode1')} | "
                     f"{ratio_cells(r, 'decodeN')} |")
    return lines + [
        "",
        *(_absolute(reference, results[reference], units) for reference in REFERENCES),
        f"ratio = reference time / row time (> 1 is faster than the reference: {FAIRSEQ} = stock fairseq "
        f"{describe_stock_architecture(args.arch)}); median of {args.repeats} interleaved repetitions per measurement, "
        f"order rotated every repetition; decoding: beam {args.beam}, {args.decode_len} forced steps"
        + ("" if achieved is None else f"; {L0DROP}: {achieved:.1%} of source encodings pruned"),
    ]


def targets_table(results: Dict[str, Dict], n_large: int) -> List[str]:
    """Whether each decoding target is met, at batch 1 and at the large batch."""
    lines = [
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
            ratios.append("not measured" if math.isnan(ratio) else f"{ratio:.2f}× {'met' if ratio >= minimum else 'MISSED'}")
        lines.append(f"| {label} | ≥ {minimum:.2f}× | {ratios[0]} | {ratios[1]} |")
    return lines


def format_report(results: Dict[str, Dict], args: argparse.Namespace, achieved: Optional[float],
                  units: Dict[str, int]) -> str:
    """The tables printed after the timings."""
    lines = throughput_table(results, args, achieved, units)
    lengths = [length for length in args.long_lengths if not args.skip_train]
    if lengths:
        lines += long_table(results, lengths, args.long_batch_size, units, ratio_cells, REFERENCES)
    return "\n".join(lines + targets_table(results, units["decodeN"]))


def write_csv(path: str, results: Dict[str, Dict], args: argparse.Namespace, jobs: List[str],
              equivalence: Dict) -> None:
    """One row per benchmark row: ``JOB_ratio`` is against softmax, ``JOB_ratio_fairseq`` against stock fairseq."""
    fields = ["function", "sublayers"] + [f"{job}_{what}" for job in jobs
                                          for what in ("seconds", "per_second", "ratio", "ratio_fairseq")]
    settings = {"device": args.device, "dtype": args.dtype, "attn_impl": args.attn_impl, "arch": args.arch, "fairseq_arch": describe_stock_architecture(args.arch),
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
