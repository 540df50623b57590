"""``fairseq_sparse.bench.run --long-lengths L ...``: a training step on ``--long-batch-size`` random
sequences of exactly L source and L target tokens (document-level lengths) per L, timed with the other
jobs, and its table."""

import argparse
import functools
from typing import Callable, Dict, List, Sequence

from fairseq.data import Dictionary

from fairseq_sparse.bench.common import long_batch


def long_job(length: int) -> str:
    """The name of the job (and of its CSV columns' prefix) at length ``length``."""
    return f"long{length}"


def add_long_jobs(jobs: Dict[str, Callable], units: Dict[str, int], train_step: Callable, dictionary: Dictionary,
                  args: argparse.Namespace) -> None:
    """Add one train-step job per length to ``jobs``, with the target tokens it counts to ``units``."""
    for length in args.long_lengths:
        batch, batch_target = long_batch(dictionary, args.long_batch_size, length, args.seed, args.device)
        jobs[long_job(length)] = functools.partial(train_step, batch=batch, batch_target=batch_target)
        units[long_job(length)] = int(batch_target.ne(dictionary.pad()).sum())


def long_table(results: Dict[str, Dict], lengths: List[int], batch_size: int, units: Dict[str, int],
               cells: Callable[[Dict, str], str], references: Sequence[str]) -> List[str]:
    """The Markdown table of the long train steps (``cells``: a row's ratios for a job), then the
    ``references``' absolute throughput."""
    header = " | ".join(f"L={n} ×fairseq | L={n} ×softmax" for n in lengths)
    lines = [
        "",
        f"## Long sequences: train step on {batch_size} sequences of L source and L target tokens (random tokens)",
        "",
        f"| function | {header} |",
        "|---|" + "---:|---:|" * len(lengths),
    ]
    for row, r in results.items():
        lines.append(f"| {row} | " + " | ".join(cells(r, long_job(n)) for n in lengths) + " |")
    lines.append("")
    for reference in references:
        r = results[reference]
        lines.append(f"{reference}, absolute: " + "; ".join(
            f"L={n} {r[f'{long_job(n)}_per_second']:,.0f} target tok/s ({r[f'{long_job(n)}_seconds']:.3f} s per step "
            f"of {units[long_job(n)]} target tokens)" for n in lengths))
    return lines
