"""The numbers the CPU study's pages quote, read from the committed records, and the noise floors its
verdicts are read against.

Convention of ``results/study/README.md`` and ``docs/study.md``: a quoted number that comes from a
record is followed by an HTML comment naming it, invisible on the rendered page::

    −1.94<!-- study_de_en_faithful/topk/delta/mean -->

``resolve`` turns the reference into the record's value and ``check_page`` compares every tagged number
of a page with it at the decimals the page quotes (tests/experiments/test_study_numbers.py). References:

- ``TABLE/ROW/COLUMN/SEED``: one seed's cell of ``TABLE.seeds.csv`` (COLUMN as in that file: ``bleu``,
  ``delta``, ``dbleu``, ``pruned``, ``valid_10``, ...);
- ``TABLE/ROW/COLUMN/mean`` and ``.../std``: the mean and standard deviation over the recorded seeds;
- ``TABLE/ROW/COLUMN-BASE/SEED`` (or ``/mean``): the cell minus row BASE's same cell, seed by seed;
- ``TABLE/ROW/valid@EPOCH/SEED[/RUN]``: validation loss (base 2) after EPOCH in ``TABLE.curves.csv``
  (RUN: which run of that seed; default the last, the one on record);
- ``TABLE/ROW/gap@EPOCH/SEED[/RUN]``: that loss minus softmax's (``full`` in ``study_documents``) of
  the same seed after the same epoch (softmax's run on record unless ``SOFTMAX_RUN`` is given as
  ``.../gap@EPOCH/SEED/RUN/SOFTMAX_RUN``); ``ROW:BASE`` in place of ROW: minus row BASE's loss;
- runs: where a seed was trained more than once the last run is on record, except study_diagnosis's
  softmax seed 1, whose first run is the table's (``RUN_ON_RECORD``);
- ``oow_mass/LABEL/SUBLAYER/LAYER/COLUMN``: a row of ``study_documents_oow_mass.csv``
  (``fairseq_sparse.analysis.oow_mass``), ``topk_mass/...`` the same of ``study_de_en_topk_mass.csv``;
- ``oow_decodes/LABEL/COLUMN``: a row of ``study_documents_oow_decodes.csv`` (a kept Top-k (OOW) model
  decoded and validated as trained and with its picks removed);
- ``floor/NAME/FIELD``: a noise floor of ``floors`` (``sd``, ``df``, ``t``, ``one``, ``mean2``, ``mean3``, ``change``).

``python -m fairseq_sparse.experiments.study_numbers [RECORD]`` prints the floors.
"""

from __future__ import annotations

import csv
import math
import re
import statistics
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

# two-sided 95% quantiles of Student's t, t_{0.975}(df)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        11: 2.201, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}

BASELINE = {"study_documents": "full"}
MASS_FILES = {"oow_mass": "study_documents_oow_mass.csv", "topk_mass": "study_de_en_topk_mass.csv"}
# runs a page reads by default where a seed was trained more than once: study_diagnosis's softmax, seed 1,
# was trained three times and the table's cells are its first run's; elsewhere the last run is on record
RUN_ON_RECORD = {("study_diagnosis", "softmax", 1): 1}
TAG = re.compile(r"([−+-]?\d+(?:\.\d+)?)(%?)(?:\s|\*\*)*<!--\s*([\w@./-]+)\s*-->")


@lru_cache(maxsize=None)
def _seeds(record: Path, table: str) -> Dict[Tuple[str, str], Dict[int, float]]:
    cells: Dict[Tuple[str, str], Dict[int, float]] = {}
    with open(record / f"{table}.seeds.csv", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if row["value"]:  # a cell measured as nothing (e.g. a gap of a run without that epoch)
                cells.setdefault((row["row"], row["column"]), {})[int(row["seed"])] = float(row["value"])
    return cells


@lru_cache(maxsize=None)
def _curves(record: Path, table: str) -> Dict[Tuple[str, int, int], Dict[int, float]]:
    curves: Dict[Tuple[str, int, int], Dict[int, float]] = {}
    with open(record / f"{table}.curves.csv", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if row["valid_loss"]:
                curves.setdefault((row["row"], int(row["seed"]), int(row["run"])), {})[int(row["epoch"])] = float(row["valid_loss"])
    return curves


def seed_values(record: Path, table: str, row: str, column: str) -> Dict[int, float]:
    """Each recorded seed's value of one cell (``TABLE.seeds.csv``)."""
    values = _seeds(Path(record), table).get((row, column))
    if not values:
        raise KeyError(f"{table}.seeds.csv has no {row}/{column}")
    return values


def valid_loss(record: Path, table: str, row: str, seed: int, epoch: int, run: int = 0) -> float:
    """Validation loss after ``epoch`` of a row's seed; ``run`` 0: the last run recorded (the one on record)."""
    curves = _curves(Path(record), table)
    runs = sorted(r for (name, s, r) in curves if name == row and s == seed)
    if not runs:
        raise KeyError(f"{table}.curves.csv has no curve of {row}, seed {seed}")
    run = run or RUN_ON_RECORD.get((table, row, seed), runs[-1])
    curve = curves[(row, seed, run)]
    if epoch not in curve:
        raise KeyError(f"{table}.curves.csv: {row}, seed {seed}, run {run} has no epoch {epoch}")
    return curve[epoch]


def valid_gap(record: Path, table: str, row: str, seed: int, epoch: int, run: int = 0, softmax_run: int = 0) -> float:
    """A row's validation loss minus its softmax's, same seed and epoch; ``ROW:BASE`` names the softmax row
    (study_diagnosis's one-change pairs: ``rela_g_lr:softmax_lr``)."""
    row, _, baseline = row.partition(":")
    baseline = baseline or BASELINE.get(table, "softmax")
    return valid_loss(record, table, row, seed, epoch, run) - valid_loss(record, table, baseline, seed, epoch, softmax_run)


def pooled_sd(groups: Sequence[Sequence[float]]) -> Tuple[float, int]:
    """Standard deviation pooled over groups, each about its own mean, and its degrees of freedom."""
    squares = sum(sum((x - statistics.fmean(g)) ** 2 for x in g) for g in groups if len(g) > 1)
    df = sum(len(g) - 1 for g in groups)
    return math.sqrt(squares / df), df


@dataclass(frozen=True)
class Floor:
    """A noise floor: the sd of one run's value, its degrees of freedom, and the 95% lines it gives."""

    what: str
    sd: float
    df: int

    @property
    def t(self) -> float:
        return T975[self.df]

    @property
    def one(self) -> float:
        """Line for the difference of two single runs (one seed's Δ against its own softmax): t·√2·sd."""
        return self.t * math.sqrt(2) * self.sd

    @property
    def mean2(self) -> float:
        """Line for the mean of two seeds' Δs: t·sd."""
        return self.t * self.sd

    @property
    def mean3(self) -> float:
        """Line for the mean of three seeds' Δs: t·√(2/3)·sd."""
        return self.t * math.sqrt(2 / 3) * self.sd

    @property
    def change(self) -> float:
        """Line for the change of one-seed quantities between two experiments (two independent values): t·√2·sd."""
        return self.one

    @property
    def delta_change(self) -> float:
        """Line for the difference of two one-seed Δs (each a run against its own control, four runs): t·2·sd."""
        return self.t * 2 * self.sd


def floors(record: Path) -> Dict[str, Floor]:
    """The study's noise floors, each measured from the committed records it names."""
    record = Path(record)

    def per_row(table: str, column: str, rows: Sequence[str]) -> List[List[float]]:
        """Each row's recorded seeds of one cell: the groups ``pooled_sd`` pools."""
        return [list(seed_values(record, table, row, column).values()) for row in rows]

    bleu = [list(seed_values(record, "study_de_en_faithful", "softmax", "bleu").values()),
            list(seed_values(record, "study_de_en", "softmax", "bleu").values())]
    dbleu = per_row("study_documents", "dbleu", ("full", "topk_oow", "window"))
    doc_valid = per_row("study_documents", "valid_10", ("full", "topk_oow", "window"))
    # BLEU after a fixed 10 epochs (study_diagnosis's recipe, with and without attention + activation
    # dropout): the rows trained with more than one seed
    bleu10 = per_row("study_diagnosis", "bleu", ("softmax_drop", "topk_drop", "softmax", "topk"))
    # a validation-loss gap after epoch 10 of the diagnosis recipe's learning rate and warm-up (the first
    # recipe's first 10 epochs), two seeds of each method: how much a gap itself moves with the seed
    gap10 = [[valid_gap(record, "study_de_en", row, seed, 10) for seed in (1, 2)] for row in ("topk", "hard", "rela_g", "entmax15")]
    # one command trained three times (seed 1 of study_diagnosis's softmax): rerun noise after epoch 10
    reruns = [[valid_loss(record, "study_diagnosis", "softmax", 1, 10, run) for run in (1, 2, 3)]]
    # BLEU of a continuation (cpu_continue: 1,500 updates from a 10-epoch softmax run, last checkpoint):
    # softmax_cont and hard_cont (2+2 layers) and L0Drop's 6+2 pair at λ = 0.3 and 0, two seeds each, each
    # about its own mean; the two rows of one seed share their base, the two seeds do not
    continued = per_row("study_diagnosis", "bleu", ("softmax_cont", "hard_cont", "l0drop_e6_cont", "l0drop_e6_cont_lambda0"))
    # one pair's gap trained twice: study_diagnosis's softmax / top-k and study_de_en's first 10 epochs train
    # alike (same recipe, seed, data order; only the epoch cap and early stopping differ, which act later),
    # per seed; each seed's two gaps about their own mean
    gap_reruns = [[valid_gap(record, "study_diagnosis", "topk", seed, 10), valid_gap(record, "study_de_en", "topk", seed, 10)]
                  for seed in (1, 2)]
    # one pair's gap over independent seeds: study_diagnosis's softmax / top-k, seeds 1-3, about their mean
    gap_seeds = [[valid_gap(record, "study_diagnosis", "topk", seed, 10) for seed in (1, 2, 3)]]
    return {
        "bleu": Floor("BLEU of a softmax model, sentence level: its three seeds of the papers' recipe and two of the "
                      "first, each recipe about its own mean", *pooled_sd(bleu)),
        "bleu10": Floor("BLEU of a model trained a fixed 10 epochs: study_diagnosis's softmax_drop and topk_drop "
                        "(two seeds each), softmax and topk (three each)", *pooled_sd(bleu10)),
        "dbleu": Floor("d-BLEU of a document model: two seeds each of full attention, Top-k (OOW) and window",
                       *pooled_sd(dbleu)),
        "doc_valid10": Floor("validation loss after epoch 10 of a document model: the same three pairs", *pooled_sd(doc_valid)),
        "gap10": Floor("a validation-loss gap to softmax after epoch 10 (2e-3 after 400 warm-up updates): two seeds "
                       "each of top-k, hard retrieval, ReLA-g and 1.5-entmax in study_de_en", *pooled_sd(gap10)),
        "rerun10": Floor("validation loss after epoch 10 of one command trained three times (study_diagnosis's "
                         "softmax, seed 1)", *pooled_sd(reruns)),
        "cont": Floor("BLEU of a continued model: two seeds each of study_diagnosis's softmax_cont, hard_cont, "
                      "l0drop_e6_cont and l0drop_e6_cont_lambda0", *pooled_sd(continued)),
        "gap_rerun10": Floor("a validation-loss gap after epoch 10 when the pair is trained again: top-k's gap to "
                             "softmax in study_diagnosis and in study_de_en's first 10 epochs, seeds 1 and 2",
                             *pooled_sd(gap_reruns)),
        "gap_seed10": Floor("a validation-loss gap after epoch 10 over seeds: top-k's gap to softmax in study_diagnosis, "
                            "seeds 1-3", *pooled_sd(gap_seeds)),
    }


def resolve(record: Path, reference: str) -> float:
    """The value a page's tag names (see the module's docstring)."""
    parts = reference.split("/")
    if parts[0] == "floor":
        return float(getattr(floors(record)[parts[1]], parts[2]))
    if parts[0] in MASS_FILES:  # PREFIX/LABEL/SUBLAYER/LAYER/COLUMN of an attention-mass CSV
        label, sublayer, layer, column = parts[1:]
        return float(_csv_row(record, MASS_FILES[parts[0]], label=label, sublayer=sublayer, layer=layer)[column])
    if parts[0] == "oow_decodes":
        label, column = parts[1:]
        return float(_csv_row(record, "study_documents_oow_decodes.csv", label=label)[column])
    table, row, column, *rest = parts
    if "@" in column:
        measure, epoch = column.split("@")
        seed, *runs = (int(x) for x in rest)
        if measure == "valid":
            return valid_loss(record, table, row, seed, int(epoch), *runs[:1])
        if measure == "gap":
            return valid_gap(record, table, row, seed, int(epoch), *runs[:2])
        raise KeyError(f"unknown measure {measure!r} in {reference!r}")
    column, _, base = column.partition("-")
    values = seed_values(record, table, row, column)
    if base:  # a cell minus the same cell of row BASE, seed by seed
        baseline = seed_values(record, table, base, column)
        values = {seed: value - baseline[seed] for seed, value in values.items() if seed in baseline}
    which = rest[0] if rest else "mean"
    if which == "mean":
        return statistics.fmean(values.values())
    if which == "std":
        return statistics.stdev(values.values()) if len(values) > 1 else 0.0
    return values[int(which)]


def _csv_row(record: Path, name: str, **keys: str) -> Dict[str, str]:
    """The row of the committed CSV ``name`` whose columns have the values ``keys``."""
    with open(Path(record) / name, encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if all(row[key] == value for key, value in keys.items()):
                return row
    raise KeyError(f"{name} has no {'/'.join(keys.values())}")


def quoted(text: str) -> List[Tuple[str, str]]:
    """(number as written, reference) of every tagged number of a page."""
    return [(number + percent, reference) for number, percent, reference in TAG.findall(text)]


def check_page(record: Path, text: str) -> List[str]:
    """One line per tagged number that differs from its record at the decimals quoted (or names nothing)."""
    problems = []
    for written, reference in quoted(text):
        number = written.rstrip("%").replace("−", "-")
        decimals = len(number.split(".")[1]) if "." in number else 0
        try:
            value = resolve(record, reference)
        except (KeyError, OSError, ValueError, IndexError) as error:
            problems.append(f"{written} <!-- {reference} -->: {error}")
            continue
        if f"{abs(float(number)):.{decimals}f}" != f"{abs(value):.{decimals}f}" or (float(number) < 0) != (round(value, decimals) < 0):
            problems.append(f"{written} <!-- {reference} -->: the record says {value:.{decimals + 2}f}")
    return problems


def main(argv: Sequence[str] = ()) -> int:
    record = Path(argv[0]) if argv else Path("results/study")
    print("| floor | sd | df | t | line, one seed's Δ (t·√2·sd) | line, mean of two seeds' Δs (t·sd) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, floor in floors(record).items():
        print(f"| {name}: {floor.what} | {floor.sd:.4f} | {floor.df} | {floor.t:.3f} | {floor.one:.3f} | {floor.mean2:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
