"""Every cell of a table, one number per seed, averaged over seeds: measured from the commands'
outputs, or read from the record of finished cells (``record.py``) when measured from the same commands."""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Tuple

from fairseq_sparse.experiments.errors import StepError
from fairseq_sparse.experiments.measures import MEASURES
from fairseq_sparse.experiments.outputs import trained_side_by_side
from fairseq_sparse.experiments.plan import Plan
from fairseq_sparse.experiments.record import Cell, Record, Recorded, cell_keys, cell_steps
from fairseq_sparse.experiments.completion import done
from fairseq_sparse.experiments.table import Column, Dataset, Row

logger = logging.getLogger("fairseq_sparse.experiments")


@dataclass(frozen=True)
class Value:
    """One seed's value of a cell, its state said: measured (``number``), not applicable (the measure does
    not apply to the row: no number, no failure), or failed (``failure`` says why)."""

    number: Optional[float] = None
    failure: str = ""

    @property
    def measured(self) -> bool:
        return self.number is not None and not self.failure

    @property
    def failed(self) -> bool:
        return bool(self.failure)


NOT_APPLICABLE = Value()


@dataclass
class Results:
    """Per (row id, column id): the mean over seeds of measured cells, (std, number of seeds), the reason
    of each failed cell, and the signatures per column. A cell in neither is not applicable or not measured."""

    means: Dict[Tuple[str, str], float] = field(default_factory=dict)
    spreads: Dict[Tuple[str, str], Tuple[float, int]] = field(default_factory=dict)
    failures: Dict[Tuple[str, str], str] = field(default_factory=dict)
    signatures: Dict[str, str] = field(default_factory=dict)
    seeds_done: Dict[str, List[int]] = field(default_factory=dict)  # per row: seeds with every cell measured

    def get(self, key: Tuple[str, str]) -> Optional[float]:
        """The cell's mean if it was measured, else None (see ``failures``)."""
        return self.means.get(key)

    def failed_rows(self) -> List[str]:
        return sorted({row for row, _ in self.failures})


@dataclass(frozen=True)
class Number:
    """One seed's number of one cell (for a measure with ``combine``: the row's own number)."""

    value: Value
    finished: bool  # recorded, or every command it reads has run
    cell: Cell
    key: str  # its commands' identity in the record


@dataclass
class Collection:
    """What every cell of one ``collect`` shares: the plan, the models that failed to train, the record,
    whether unfinished seeds are left out (``finished_only``) and which outputs this run was to make
    (``ran``), and the results the numbers go into (their signatures)."""

    plan: Plan
    results: Results
    failed: set = frozenset()
    record: Optional[Record] = None
    finished_only: bool = False
    ran: Optional[set] = None

    def number(self, ds: Dataset, row: Row, col: Column, seed: int) -> Number:
        """One seed's number of one cell: from the record if measured from the same commands, else measured
        (and recorded once its commands have run and it did not fail: a failure is tried again next time);
        not measured while commands are missing if ``finished_only``, or if some were not to run (``ran``)."""
        plan, results, record = self.plan, self.results, self.record
        steps = cell_steps(plan, ds, row, col, seed)
        cell, (key, earlier) = (ds.id, row.id, col.id, seed), cell_keys(plan, steps)
        combine = MEASURES[col.measure].combine
        recorded = record.get(cell, key, earlier) if record else None
        # a combined cell with a value and no own number was written before own numbers were: measure again
        if recorded and not (combine and recorded.own is None and recorded.value is not None):
            if recorded.signature:
                results.signatures.setdefault(col.id, recorded.signature)
            return Number(Value(recorded.own if combine else recorded.value), True, cell, key)
        missing = {s.output for s in steps if not done(s)}
        if missing and (self.finished_only or (self.ran is not None and not missing <= self.ran)):
            return Number(NOT_APPLICABLE, False, cell, key)
        finished = not missing
        models = {step.model for step in steps if step.model}
        value = measure(plan, ds, row, col, seed, results, models & self.failed)
        if record and finished and not value.failed:  # a failure is not recorded: it is tried again next time
            shared = MEASURES[col.measure].timed and trained_side_by_side(plan.run_dir(ds, row, seed) / "train.log")
            signature = results.signatures.get(col.id, "")
            record.put(cell, Recorded(key, None if combine else value.number, signature, shared,
                                      value.number if combine else None))
        return Number(value, finished, cell, key)


def collect(plan: Plan, failed: set = frozenset(), finished_only: bool = False, record: Optional[Record] = None,
            ran: Optional[set] = None) -> Results:
    """Measure every cell, averaged over seeds. ``finished_only``: seeds whose commands have not all
    run yet are left out of a cell (a study completed over several sittings); otherwise they count as
    failed, except, given ``ran`` (the outputs of the commands this run was to run), seeds whose missing
    commands were not among them (rows not chosen by --rows). ``record``: a seed recorded from the same
    commands is read from it, and one measured here is added to it (the caller writes it: ``Record.save``).
    A cell with a failed seed is failed."""
    table, results = plan.table, Results()
    collection = Collection(plan, results, failed, record, finished_only, ran)
    numbers: Dict[Tuple[str, str, int], Number] = {}
    for col in table.columns:
        ds = table.datasets[col.dataset]
        for row in [r for r in table.rows if plan.applies(ds, r)]:
            for seed in plan.column_seeds(ds, col):
                numbers[row.id, col.id, seed] = collection.number(ds, row, col, seed)
    for row in table.rows:
        complete: Optional[set] = None
        for col in table.columns:
            ds = table.datasets[col.dataset]
            if not plan.applies(ds, row):
                continue
            combine, values, seeds = MEASURES[col.measure].combine, [], []
            for seed in plan.column_seeds(ds, col):
                ours = numbers[row.id, col.id, seed]
                value, finished = ours.value, ours.finished
                if combine:  # against the baseline row's own number of the same seed
                    base = numbers.get((col.baseline, col.id, seed))
                    finished = finished and base is not None and base.finished
                    value = combined(combine, value, base.value if base else NOT_APPLICABLE)
                    recorded = record.get(ours.cell, ours.key) if record else None
                    if recorded and finished and value.measured:  # the record shows the value beside the row's own number
                        record.put(ours.cell, replace(recorded, value=value.number))
                if not finished and (finished_only or value == NOT_APPLICABLE):  # not measured (yet)
                    continue
                seeds.append(seed)
                values.append(value)
            not_measured = set(plan.seeds(ds)) - set(plan.column_seeds(ds, col))  # a first_seeds column
            complete = (set(seeds) | not_measured) if complete is None else complete & (set(seeds) | not_measured)
            failures = [v.failure for v in values if v.failed]
            if failures:  # a mean over the seeds that finished would hide the failure
                results.failures[row.id, col.id] = failures[0]
                continue
            summary = summarise([v.number for v in values if v.measured])
            if summary:
                results.means[row.id, col.id] = summary[0]
                if summary[1] is not None:
                    results.spreads[row.id, col.id] = summary[1]
        results.seeds_done[row.id] = sorted(complete or ())
    return results


def combined(combine, ours: Value, base: Value) -> Value:
    """A relative cell's value from the row's own number and the baseline row's."""
    if ours.failed or base.failed:
        return ours if ours.failed else Value(failure=f"its baseline: {base.failure}")
    if not (ours.measured and base.measured):
        return NOT_APPLICABLE
    return Value(combine(ours.number, base.number))


def summarise(values: List[float]) -> Optional[Tuple[float, Tuple[float, int]]]:
    """One cell's measured seeds as (mean, (std, number of seeds)); None if no seed was measured."""
    if not values:
        return None
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0, len(values))


def measure(plan: Plan, ds: Dataset, row: Row, col: Column, seed: int, results: Results, failed_models: set) -> Value:
    """One seed's value of one cell: failed if a model it needs failed or its output cannot be read (with
    why), not applicable if the measure does not apply to the row."""
    if failed_models:
        return Value(failure="its model did not train: " + ", ".join(sorted(str(m[1]) for m in failed_models)))
    try:
        number = MEASURES[col.measure].value(plan, ds, row, col, seed, results.signatures)
    except (StepError, OSError, ValueError) as e:  # its decode or analysis failed (reported when it ran)
        logger.warning("%s / %s: %s", row.id, col.id, e)
        return Value(failure=str(e).splitlines()[0] if str(e) else type(e).__name__)
    return NOT_APPLICABLE if number is None else Value(number)
