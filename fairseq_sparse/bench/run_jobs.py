"""What ``fairseq_sparse.bench.run`` times: one model per row (stock fairseq's with the softmax row's
weights), a training step and beam-search decodes per row, each timed in interleaved rounds, and each
row's throughput and ratios to the two references."""

import argparse
import copy
import functools
import logging
import math
import sys
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from fairseq.data import Dictionary

from fairseq_sparse.bench.common import (DTYPES, FAIRSEQ, build_row, build_stock_reference, forced_length_decoder,
                                         interleaved_medians)
from fairseq_sparse.bench.long_lengths import add_long_jobs

logger = logging.getLogger("fairseq_sparse.bench.run")  # its lines are those of python -m fairseq_sparse.bench.run

REFERENCES = (FAIRSEQ, "softmax")  # always measured: every row's ratios are to these
L0_LAMBDA = 0.3  # the penalty weight of the L0Drop train step (label_smoothed_cross_entropy_l0drop's default)
JOBS = ("train", "decode1", "decodeN")
Batch = Dict[str, torch.Tensor]
Job = Callable[[str], None]  # one timed run of a job, for the row named


@dataclass
class Models:
    """Each row's model to train and to decode with (in the rows' order), and what the l0drop row prunes."""

    train: Dict[str, torch.nn.Module]
    decode: Dict[str, torch.nn.Module]
    achieved: Optional[float]


def build_models(rows: Sequence[str], args: argparse.Namespace, dictionary: Dictionary, large: Batch) -> Models:
    """One model per row, all of the same architecture and seed; the fairseq row gets the softmax row's weights."""
    train, decode, achieved = {}, {}, None
    for row in rows:
        if row == FAIRSEQ:
            continue  # built from the softmax row's weights, below
        model, pruned = build_row(row, args.arch, dictionary, args.seed, args.device, args.k, large, args.pruned,
                                  args.attn_impl)
        train[row] = model
        # training moves the L0Drop gates: the l0drop row decodes with an untrained copy, at the share set
        decode[row] = model if pruned is None else copy.deepcopy(model)
        achieved = pruned if pruned is not None else achieved
    try:
        stock = build_stock_reference(args.arch, train["softmax"], dictionary, args.seed, args.device)
    except (RuntimeError, ValueError) as err:
        sys.exit(f"python -m fairseq_sparse.bench.run: error: {err}")
    train[FAIRSEQ] = decode[FAIRSEQ] = stock
    dtype = DTYPES[args.dtype]  # cast after building: the L0Drop gates and the stock copy are set in float32
    for model in list(train.values()) + list(decode.values()):
        model.to(dtype)
    return Models({row: train[row] for row in rows}, decode, achieved)


class TrainStep:
    """One training step of a row's model: forward, cross entropy (plus L0Drop's penalty), backward, Adam step."""

    def __init__(self, models: Dict[str, torch.nn.Module], pad: int):
        self.models, self.pad = models, pad
        self.optimizers = {row: torch.optim.Adam(m.parameters(), lr=1e-4) for row, m in models.items()}

    def __call__(self, row: str, batch: Batch, batch_target: torch.Tensor) -> None:
        model = self.models[row].train()
        self.optimizers[row].zero_grad()
        logits, extra = model(**batch)
        # in float32, as fairseq's criteria take log_softmax(logits.float())
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)), batch_target.view(-1),
                                                 ignore_index=self.pad)
        if "l0drop_expected_l0" in extra:  # L0Drop eq. 12, normalised as label_smoothed_cross_entropy_l0drop does
            src_tokens = batch["src_tokens"].ne(self.pad).sum()
            loss = loss + L0_LAMBDA * extra["l0drop_expected_l0"][0].float().sum() / src_tokens
        loss.backward()
        self.optimizers[row].step()


def timed_jobs(models: Models, args: argparse.Namespace, dictionary: Dictionary, large: Batch,
               target: torch.Tensor, singles: List[Batch]) -> Tuple[Dict[str, Job], Dict[str, int]]:
    """Each job in the order it is measured, and the units its throughput counts (sentences or target tokens)."""
    train_step = TrainStep(models.train, dictionary.pad())
    decoders = {row: forced_length_decoder(m, dictionary, args.beam, args.decode_len) for row, m in models.decode.items()}

    def decode_singles(row: str) -> None:
        for batch in singles:
            decoders[row](batch)

    jobs: Dict[str, Job] = {}
    if not getattr(args, "skip_decode", False):
        jobs.update(decode1=decode_singles, decodeN=lambda row: decoders[row](large))
    units = {"train": int(target.ne(dictionary.pad()).sum()), "decode1": len(singles), "decodeN": len(large["src_tokens"])}
    if not args.skip_train:
        jobs["train"] = functools.partial(train_step, batch=large, batch_target=target)
        add_long_jobs(jobs, units, train_step, dictionary, args)
    return jobs, units


def measure(jobs: Dict[str, Job], rows: Sequence[str], repeats: int, device: str) -> Dict[Tuple[str, str], float]:
    """Median seconds of each (row, job). One job at a time, its rows interleaved: the job after a train
    step runs slower (its large allocations just freed), so kinds are not mixed in one round."""
    seconds = {}
    for kind, job in jobs.items():
        runs = {(row, kind): functools.partial(job, row) for row in rows}
        seconds.update(interleaved_medians(runs, repeats, device, log=lambda m, kind=kind: logger.info(f"{kind}: {m}")))
    return seconds


def throughput(sublayers: Dict[str, str], seconds: Dict[Tuple[str, str], float], units: Dict[str, int],
               jobs: Sequence[str]) -> Dict[str, Dict]:
    """Per row: its sublayers, then per job its seconds, units per second and ratios (reference time / row
    time) to softmax (``JOB_ratio``) and to stock fairseq (``JOB_ratio_fairseq``); NaN where not measured."""
    results = {}
    for row, where in sublayers.items():
        results[row] = {"sublayers": where}
        for job in jobs:
            time = seconds.get((row, job), math.nan)
            results[row][f"{job}_seconds"] = time
            results[row][f"{job}_per_second"] = units.get(job, math.nan) / time
            results[row][f"{job}_ratio"] = seconds.get(("softmax", job), math.nan) / time
            results[row][f"{job}_ratio_fairseq"] = seconds.get((FAIRSEQ, job), math.nan) / time
    return results


def ratio_cells(result: Dict, job: str) -> str:
    """A row's two ratios for ``job`` as table cells: ×fairseq | ×softmax."""
    if math.isnan(result[f"{job}_ratio"]):  # e.g. the train step with --skip-train
        return "not measured | not measured"
    return f"{result[f'{job}_ratio_fairseq']:.2f}× | {result[f'{job}_ratio']:.2f}×"
