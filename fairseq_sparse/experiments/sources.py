"""The kinds of command whose output a column reads, one object each: it builds its command for a cell
from what the plan hands it (the owner of the output's path, so of its identity) and says which
commands a cell needs. A measure names its source object; the plan asks the measure's source for a
cell's commands, with no dispatch on names. Reading an output is ``outputs.py``.

Each source is named by the kind of step it makes (``Step.kind``): ``generate`` (fairseq-generate),
``speed`` (two decodes timed in turn), ``attention`` (the attention analysis), ``alignment`` (alignment
error rates against gold alignments), ``pruned`` (the share
of encoder outputs L0Drop prunes) and ``train`` (the training log, which the training step writes).
"""

from __future__ import annotations

import hashlib
import shlex
import sys
from pathlib import Path
from typing import List

from fairseq_sparse.experiments.step import Step

from fairseq_sparse.experiments.plan_view import PlanView
from fairseq_sparse.experiments.table import Column, Dataset, Row


class Source:
    """A kind of command a measure reads the output of."""

    kind = ""

    def step(self, plan: PlanView, ds: Dataset, row: Row, col: Column, seed: int) -> Step:
        """The command whose output the measure of ``col`` reads for ``row`` and ``seed``."""
        raise NotImplementedError

    def output(self, plan: PlanView, ds: Dataset, row: Row, col: Column, seed: int) -> Path:
        return self.step(plan, ds, row, col, seed).output

    def steps(self, plan: PlanView, ds: Dataset, row: Row, col: Column, seed: int,
              reads_baseline_model: bool = False) -> List[Step]:
        """The commands one cell needs (none where the measure needs no command for the row);
        ``reads_baseline_model``: the measure compares the row's model with the baseline row's."""
        return [self.step(plan, ds, row, col, seed)]


class Generate(Source):
    """fairseq-generate of the row's model on the column's split, as the row and column decode."""

    kind = "generate"

    def step(self, plan, ds, row, col, seed):
        args = plan.generate_args(ds, row, col)
        key = hashlib.sha1(" ".join([col.split, *args]).encode()).hexdigest()[:8]
        out = plan.out / "decode" / ds.id / row.id / f"seed{seed}" / f"{col.split}.{key}.txt"
        argv = [*plan.tool("fairseq-generate"), str(plan.data_dir(ds) / "bin"), "--user-dir", plan.user_dir,
                "--path", str(plan.checkpoint(ds, row, seed)), "--gen-subset", col.split, *args,
                "--post-process", ds.post_process]
        return Step(self.kind, argv, out, out, f"decode {row.id} on {ds.id} {col.split} (seed {seed})",
                    needs=(plan.model_key(ds, row, seed),))

    def steps(self, plan, ds, row, col, seed, reads_baseline_model=False):
        rows = [row] + ([plan.table.row(col.baseline)] if reads_baseline_model else [])
        return [self.step(plan, ds, r, col, seed) for r in rows]


class Speed(Source):
    """The row's and the column's baseline row's decodes timed in turn, in one run
    (``fairseq_sparse.bench.decode_speed``): decodes timed hours apart differ by more than the effect."""

    kind = "speed"

    def step(self, plan, ds, row, col, seed):
        pair = [row, plan.table.row(col.baseline)]
        runs = [shlex.join(GENERATE.step(plan, ds, r, col, seed).argv[1:]) for r in pair]
        rounds = 1 if plan.smoke else col.rounds
        # keyed like a decode, by what is decoded and how (not by paths): a checkout elsewhere finds it
        decoded = [rounds, col.split, col.baseline, *(plan.generate_args(ds, r, col) for r in pair)]
        key = hashlib.sha1(repr(decoded).encode()).hexdigest()[:8]
        out = plan.out / "speed" / ds.id / row.id / f"seed{seed}" / f"{col.split}.{key}.csv"
        argv = [sys.executable, "-m", "fairseq_sparse.bench.decode_speed", "--rounds", str(rounds), "--out", str(out),
                "--generate", str(plan.bin / "fairseq-generate")]
        for r, run in zip(pair, runs):
            argv += ["--run", r.id, run]
        return Step(self.kind, argv, out, out.with_suffix(".log"),
                    f"decode speed of {row.id} and {col.baseline} in turn on {ds.id} {col.split} (seed {seed})",
                    needs=tuple(plan.model_key(ds, r, seed) for r in pair))

    def steps(self, plan, ds, row, col, seed, reads_baseline_model=False):
        return [] if row.id == col.baseline else [self.step(plan, ds, row, col, seed)]  # 1 by definition


class AnalysisOfModel(Source):
    """A sub-command of ``python -m fairseq_sparse.analysis`` on the row's model, decoded as the row decodes
    (its ``--model-overrides``), into a folder per split and overrides."""

    subcommand = folder = produced = what = ""

    def extra_args(self, plan: PlanView, ds: Dataset, col: Column) -> List[str]:
        return []

    def step(self, plan, ds, row, col, seed):
        base = plan.out / "analysis" / ds.id / row.id / f"seed{seed}"
        overrides = plan.model_overrides(ds, row)
        tag = "" if overrides == "{}" else "." + hashlib.sha1(overrides.encode()).hexdigest()[:8]
        out = base / f"{self.folder}-{col.split}{tag}"
        argv = [sys.executable, "-m", "fairseq_sparse.analysis", self.subcommand, str(plan.data_dir(ds) / "bin"),
                "--path", str(plan.checkpoint(ds, row, seed)), "--split", col.split, *self.extra_args(plan, ds, col),
                "--out", str(out), "--model-overrides", overrides, *(["--cpu"] if plan.smoke else [])]
        return Step(self.kind, argv, out / self.produced, base / f"{self.folder}-{col.split}{tag}.log",
                    f"{self.what} of {row.id} on {ds.id} (seed {seed})", needs=(plan.model_key(ds, row, seed),))


class Attention(AnalysisOfModel):
    """Attention statistics (zero weights, null queries) of the row's model."""

    kind, subcommand, folder, produced, what = "attention", "zero-weights", "attention", "zero_weights.csv", "zero attention weights"


class Alignment(AnalysisOfModel):
    """Alignment error rates of the row's cross-attention against the dataset's gold alignments (split
    ``align``, ``fairseq_sparse.data.gold_alignments``), per layer and head, normal and shifted."""

    kind, subcommand, folder, produced, what = "alignment", "aer", "aer", "aer.csv", "alignment error rates"

    def extra_args(self, plan, ds, col):
        return ["--gold", str(plan.data_dir(ds) / f"{col.split}.gold")]


class Pruned(Source):
    """The share of encoder outputs the row's gates or pattern prune on the column's split."""

    kind = "pruned"

    def step(self, plan, ds, row, col, seed):
        out = plan.out / "analysis" / ds.id / row.id / f"seed{seed}" / f"l0drop-pruned.{col.split}.txt"
        argv = [sys.executable, "-m", "fairseq_sparse.l0drop_pruned", str(plan.data_dir(ds) / "bin"),
                "--path", str(plan.checkpoint(ds, row, seed)), "--split", col.split, *(["--cpu"] if plan.smoke else [])]
        return Step(self.kind, argv, out, out, f"encoder outputs L0Drop prunes in {row.id} on {ds.id} (seed {seed})",
                    needs=(plan.model_key(ds, row, seed),))

    def steps(self, plan, ds, row, col, seed, reads_baseline_model=False):
        # a model without gates or a pattern prunes nothing: no command, its value is 0
        return [self.step(plan, ds, row, col, seed)] if plan.prunes(ds, row) else []


class TrainLog(Source):
    """The row's training log, which its training step writes: no command of its own."""

    kind = "train"

    def output(self, plan, ds, row, col, seed):
        return plan.run_dir(ds, row, seed) / "train.log"

    def steps(self, plan, ds, row, col, seed, reads_baseline_model=False):
        return []


GENERATE, SPEED, ATTENTION, ALIGNMENT, PRUNED, TRAIN_LOG = Generate(), Speed(), Attention(), Alignment(), Pruned(), TrainLog()
SOURCES = (GENERATE, SPEED, ATTENTION, ALIGNMENT, PRUNED, TRAIN_LOG)
