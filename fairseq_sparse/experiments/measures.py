"""What a table's column measures: a registry of measures, each one object.

A measure names the source object whose output it reads (``sources.py``: a decode, two decodes timed
in turn, the attention analysis, the L0Drop sparsity count, or the training log; the plan asks it for
a cell's commands) and a function giving one seed's value. A new measure is one function and one ``register`` line; ``configs/README.md``
lists them for table authors. Reading the outputs is ``outputs.py``.

A relative measure compares a row with the column's baseline row of the same seed. Where the
comparison is a function of one number per row (a BLEU difference, a ratio of training speeds),
the measure gives the row's own number and ``combine`` the comparison: each row's number is then
measured, and recorded, from its own commands alone, so a later sitting that has the baseline's
number recorded need not have (or train again) the baseline's model. A comparison measured in one
run (decode speeds timed in turn) needs both models.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Callable, Dict, Optional

from fairseq_sparse.experiments.outputs import (alignment_error_rate, zero_weights, best_valid_loss, bleu,
                                                encoder_outputs_pruned, null_rate, trained_epochs, trained_params,
                                                train_words_per_second, training_seconds, valid_loss_per_epoch)

from fairseq_sparse.bench.decode_speed import decode_speeds
from fairseq_sparse.evaluate import decode_seconds
from fairseq_sparse.experiments.plan_view import PlanView
from fairseq_sparse.experiments.sources import ALIGNMENT, ATTENTION, GENERATE, PRUNED, SPEED, SOURCES, TRAIN_LOG, Source
from fairseq_sparse.experiments.table import Column, Dataset, Row

EPOCH_MEASURES = ("valid_loss_at", "valid_gap_at")  # their columns name an epoch (``epoch:``)
Value = Callable[[PlanView, Dataset, Row, Column, int, Dict[str, str]], Optional[float]]


@dataclass(frozen=True)
class Measure:
    name: str
    source: Source  # the kind of command whose output it reads (``sources.py``)
    value: Value  # one seed's value (None: does not apply to this row); may record a BLEU signature per column
    relative: bool = False  # against the column's ``baseline`` row
    digits: int = 2
    signed: bool = False  # printed with its sign (a difference)
    timed: bool = False  # read from the training's clock: a run beside others (--jobs) changes it
    clocks_command: bool = False  # read from the running time of the command it reads: --jobs runs that one alone
    # relative measures only: the value from the row's own number and the baseline's (``value`` gives one
    # row's number); None: ``value`` compares the two itself, from commands that read both models
    combine: Optional[Callable[[float, float], float]] = None

    def reads_baseline_model(self) -> bool:
        """Whether one seed's value needs the baseline row's model (not only its recorded number)."""
        return self.relative and self.combine is None


MEASURES: Dict[str, Measure] = {}


def register(name: str, source: Source, relative: bool = False, digits: int = 2, signed: bool = False, timed: bool = False,
             combine: Optional[Callable[[float, float], float]] = None, clocks_command: bool = False):
    """Decorator: register ``fn`` as the measure ``name``."""
    if not any(source is known for known in SOURCES):
        raise ValueError(f"measure {name}: source must be one of sources.SOURCES, got {source!r}")

    def add(fn: Value) -> Value:
        MEASURES[name] = Measure(name, source, fn, relative, digits, signed, timed, clocks_command, combine)
        return fn

    return add




@register("bleu_delta", GENERATE, relative=True, signed=True, combine=operator.sub)  # minus the baseline's, same seed
@register("bleu", GENERATE)
def bleu_score(plan, ds, row, col, seed, signatures):
    value, signatures[col.id] = bleu(plan, ds, col, GENERATE.output(plan, ds, row, col, seed))
    return value


@register("decode_time", GENERATE, digits=1, clocks_command=True)
def decode_time(plan, ds, row, col, seed, signatures):
    return decode_seconds(GENERATE.output(plan, ds, row, col, seed))


def _speed_ratio(plan: PlanView, ds, row, col, seed: int, field: str) -> float:
    """This row's median ``field`` over the baseline row's, the two decoded in turn in one run."""
    if row.id == col.baseline:
        return 1.0
    medians = decode_speeds(SPEED.output(plan, ds, row, col, seed), field)
    return medians[row.id] / max(medians[col.baseline], 1e-9)


@register("decode_speedup", SPEED, relative=True, clocks_command=True)
def decode_speedup(plan, ds, row, col, seed, signatures):
    """The baseline row's decoding seconds over this row's (> 1: faster)."""
    return 1.0 / max(_speed_ratio(plan, ds, row, col, seed, "seconds"), 1e-9)


@register("decode_token_speedup", SPEED, relative=True, clocks_command=True)
def decode_token_speedup(plan, ds, row, col, seed, signatures):
    """Generated tokens/s over the baseline row's: fair when the models' outputs differ in length."""
    return _speed_ratio(plan, ds, row, col, seed, "tokens_per_second")


@register("train_speedup", TRAIN_LOG, relative=True, timed=True, combine=operator.truediv)  # over the baseline's
def train_words(plan, ds, row, col, seed, signatures):
    """Median training words/s of the row's run."""
    return train_words_per_second(TRAIN_LOG.output(plan, ds, row, col, seed))


@register("params_m", TRAIN_LOG, digits=1)
def params_m(plan, ds, row, col, seed, signatures):
    return trained_params(TRAIN_LOG.output(plan, ds, row, col, seed)) / 1e6


@register("epochs", TRAIN_LOG, digits=1)
def epochs(plan, ds, row, col, seed, signatures):
    return trained_epochs(TRAIN_LOG.output(plan, ds, row, col, seed))


@register("train_minutes", TRAIN_LOG, digits=0, timed=True)
def train_minutes(plan, ds, row, col, seed, signatures):
    return training_seconds(TRAIN_LOG.output(plan, ds, row, col, seed)) / 60


@register("best_valid_loss", TRAIN_LOG, digits=3)
def valid_loss(plan, ds, row, col, seed, signatures):
    if "--disable-validation" in plan.train_argv(ds, row, seed):
        return None  # not measured: the row trains without validation (a fixed fine-tuning budget)
    return best_valid_loss(TRAIN_LOG.output(plan, ds, row, col, seed))


@register("valid_gap_at", TRAIN_LOG, relative=True, digits=3, signed=True, combine=operator.sub)
@register("valid_loss_at", TRAIN_LOG, digits=3)
def valid_loss_at_epoch(plan, ds, row, col, seed, signatures):
    """The validation loss after epoch ``col.epoch``: curves compared at fixed epochs (``valid_gap_at``:
    minus the baseline's). Not measured (None) where the row trains without validation, to fewer epochs
    (its ``--max-epoch``), or stopped early (``--patience``) before the epoch; a run that should have
    reached the epoch and did not is an error."""
    argv = plan.train_argv(ds, row, seed)
    if not validates_epoch(argv, col.epoch):
        return None
    log = TRAIN_LOG.output(plan, ds, row, col, seed)
    losses = valid_loss_per_epoch(log)
    if col.epoch not in losses and "--patience" in argv and losses and max(losses) < col.epoch:
        return None  # early stopping ended the run first (the measure runs once the training finished)
    if col.epoch not in losses:
        raise ValueError(f"{log}: no validation loss after epoch {col.epoch} (validated epochs: {sorted(losses)})")
    return losses[col.epoch]


def validates_epoch(train_argv, epoch: int) -> bool:
    """Whether a training validates after ``epoch`` if it runs that long (the last --max-epoch counts, as in
    fairseq's parser: a row's arguments come after its setting's)."""
    planned = [int(train_argv[i + 1]) for i, word in enumerate(train_argv[:-1]) if word == "--max-epoch"]
    return "--disable-validation" not in train_argv and not (planned and planned[-1] < epoch)


@register("pruned", PRUNED)
def pruned_percent(plan, ds, row, col, seed, signatures):
    if not plan.prunes(ds, row):
        return 0.0  # nothing can be pruned: the paper's 0.00% of the baseline
    return encoder_outputs_pruned(PRUNED.output(plan, ds, row, col, seed))


@register("zero_weights", ATTENTION)
def zero_weights_percent(plan, ds, row, col, seed, signatures):
    return zero_weights(ATTENTION.output(plan, ds, row, col, seed))


@register("null_rate", ATTENTION)
def null_queries(plan, ds, row, col, seed, signatures):
    return null_rate(ATTENTION.output(plan, ds, row, col, seed))


@register("aer", ALIGNMENT, digits=2)
def alignment_error(plan, ds, row, col, seed, signatures):
    """AER (%) of the row's cross-attention, averaged over decoder layers: of each layer's mean attention
    (AoL) or of its best head (AoH), normal or shifted attention (ReLA, Table 5)."""
    return alignment_error_rate(ALIGNMENT.output(plan, ds, row, col, seed), col.aer_attention, col.aer_over)
