"""The record of finished cells (``--record DIR``): every seed's measured value kept beside the
committed results, so a table run over many sittings survives a machine that does not keep ``runs/``.

A long study (the CPU study: days of a 2-core machine) runs in sittings, and a sitting may start on a
fresh machine whose trained models, decodes and logs are gone. Its results must not go with them:
the record holds one line per (dataset, row, column, seed) with the value the report measured and
the identity of the commands that produced it (their outputs' paths, which carry the digests of the
training and decoding arguments). The report reads a cell from the record when the commands are the
same, and the runner runs only the commands of cells not recorded, so a new sitting goes on with the
seeds still missing instead of training finished ones again. Changing a row's arguments changes its
commands' identity: its recorded values no longer match, and it runs again. Deleting a line runs its
cell again.

A relative cell whose value is a function of one number per row (a BLEU difference: the measure's
``combine``) records the row's own number (``own``) from the row's own commands, and its value is
computed again from the baseline's recorded number: a later sitting needs neither model again.

``DIR/NAME.seeds.csv`` holds the cells; ``DIR/NAME.curves.csv`` (which the report writes) the
validation loss per epoch of models whose training logs this machine no longer has, which also
answers a column of a validation loss at an epoch added after those logs were lost.
"""

from __future__ import annotations

import csv
import hashlib
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Iterable, List, Optional, Tuple

from fairseq_sparse.experiments.errors import RecordError
from fairseq_sparse.experiments.heatmap import HEATMAP
from fairseq_sparse.experiments.measures import EPOCH_MEASURES, MEASURES, validates_epoch

if TYPE_CHECKING:
    from fairseq_sparse.experiments.plan import Plan, Step
    from fairseq_sparse.experiments.table import Column, Dataset, Row

Cell = Tuple[str, str, str, int]  # dataset, row, column, seed
FIELDS = ["dataset", "row", "column", "seed", "commands", "value", "signature", "side_by_side", "own"]


@dataclass(frozen=True)
class Recorded:
    commands: str  # digest of the cell's commands' outputs (see ``commands_key``)
    value: Optional[float]  # None: the measure does not apply to the row
    signature: str  # the BLEU signature of the column, if it has one
    side_by_side: bool  # its training shared the machine (the report's note on training times)
    own: Optional[float] = None  # a measure with ``combine``: the row's own number (value: the two combined, once known)


def cell_steps(plan: "Plan", ds: "Dataset", row: "Row", col: "Column", seed: int) -> List["Step"]:
    """The commands one cell of one seed needs: its models' training and its measurement (of a measure
    with ``combine``, the row's own: the baseline's number is the baseline's own cell)."""
    rows = [row] + ([plan.table.row(col.baseline)] if MEASURES[col.measure].reads_baseline_model() else [])
    steps = [step for r in rows for step in plan.train_steps(ds, plan.trained_row(r), seed)]
    return steps + plan.measure_steps(ds, row, col, seed)


# Output files renamed since records were written (current name -> earlier name): the same commands,
# so a cell recorded under the earlier name still answers (and is recorded again under the current one).
RENAMED_OUTPUTS = {"/zero_weights.csv": "/sparsity.csv", "/l0drop-pruned.": "/l0drop-sparsity."}


def commands_key(plan: "Plan", steps: Iterable["Step"], renamed: bool = False) -> str:
    """Digest of the steps' outputs relative to the plan's output and models directories: what the
    commands are (digests of their arguments are in those paths), not where this checkout keeps them.
    ``renamed``: the digest under the outputs' earlier names (``RENAMED_OUTPUTS``)."""
    names = []
    for step in steps:
        for root, name in ((plan.models_root, "models"), (plan.out, "out")):
            if step.output.is_relative_to(root):
                names.append(f"{name}/{step.output.relative_to(root)}")
                break
        else:
            names.append(str(step.output))
    for current, earlier in RENAMED_OUTPUTS.items() if renamed else ():
        names = [n.replace(current, earlier) for n in names]
    return hashlib.sha1("\n".join(sorted(names)).encode()).hexdigest()[:16]


def cell_keys(plan: "Plan", steps: List["Step"]) -> Tuple[str, str]:
    """A cell's commands key and the key its commands had before outputs were renamed (for ``Record.get``)."""
    return commands_key(plan, steps), commands_key(plan, steps, renamed=True)


class Record:
    """The cells of one table recorded in ``directory`` (a file per table; absent: nothing recorded)."""

    def __init__(self, directory: Path, table: str):
        self.directory = directory
        self.path = directory / f"{table}.seeds.csv"
        self.curves_path = directory / f"{table}.curves.csv"
        self.heatmap_dir = directory / HEATMAP.folder(table)
        self.cells: Dict[Cell, Recorded] = {}
        if self.path.is_file():
            self.cells = read_cells(self.path)

    def get(self, cell: Cell, commands: str, earlier: str = "") -> Optional[Recorded]:
        """The recorded cell if it was measured from the same commands (``commands``, or ``earlier``: their
        key before an output was renamed, answered under ``commands``). Reading changes nothing."""
        found = self.cells.get(cell)
        if found and earlier and found.commands == earlier:
            return replace(found, commands=commands)
        return found if found and found.commands == commands else None

    def seeds(self) -> Dict[str, List[int]]:
        """Per dataset id, the seeds the record holds cells of."""
        found: Dict[str, set] = {}
        for dataset, _, _, seed in self.cells:
            found.setdefault(dataset, set()).add(seed)
        return {dataset: sorted(seeds) for dataset, seeds in found.items()}

    def put(self, cell: Cell, recorded: Recorded) -> None:
        self.cells[cell] = recorded

    def save(self) -> None:
        """Write the file whole, then move it into place: a sitting killed while writing loses nothing."""
        self.directory.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".csv.partial")
        with open(partial, "w", encoding="utf-8", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            writer.writeheader()
            for (dataset, row, column, seed), r in sorted(self.cells.items()):
                writer.writerow({"dataset": dataset, "row": row, "column": column, "seed": seed, "commands": r.commands,
                                 "value": "" if r.value is None else f"{r.value:.6f}", "signature": r.signature,
                                 "side_by_side": int(r.side_by_side), "own": "" if r.own is None else f"{r.own:.6f}"})
        os.replace(partial, self.path)

    def has_heatmap(self) -> bool:
        """Whether the folder keeps the table's attention heatmaps (not drawn again: delete them to redraw)."""
        return any(self.heatmap_dir.glob("*.png"))

    def curves(self) -> List[dict]:
        """The recorded loss curves (``read_curves`` of ``NAME.curves.csv``)."""
        return read_curves(self.curves_path)


CONFLICT_MARKERS = ("<<<<<<<", "=======", ">>>>>>>", "|||||||")
REQUIRED = ("dataset", "row", "column", "seed", "commands", "value", "signature", "side_by_side")


def read_cells(path: Path) -> Dict[Cell, Recorded]:
    """The cells of a record file, refusing (``RecordError``: the file and line) anything a merge or a hand
    edit can leave that would otherwise be read as something else: conflict markers, a cell recorded
    twice (which value is right cannot be known here), a line of the wrong shape or with a value that is
    not a number. Nothing is rewritten."""
    text = path.read_text(encoding="utf-8")
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith(CONFLICT_MARKERS):
            raise RecordError(f"{path}:{number}: a merge conflict marker ({line[:7]}); resolve the conflict "
                              "(keep one line per cell), the record is left as it is")
    cells: Dict[Cell, Recorded] = {}
    first_line: Dict[Cell, int] = {}
    reader = csv.DictReader(text.splitlines())
    missing = [f for f in REQUIRED if f not in (reader.fieldnames or [])]
    if missing:
        raise RecordError(f"{path}:1: the header lacks {', '.join(missing)}; is this a record file (NAME.seeds.csv)?")
    for line in reader:
        number = reader.line_num
        try:
            if None in line or any(line[f] is None for f in REQUIRED):
                fields = sum(v is not None for k, v in line.items() if k is not None) + len(line.get(None) or [])
                raise ValueError(f"{fields} fields where the header has {len(reader.fieldnames)}")
            cell = (line["dataset"], line["row"], line["column"], int(line["seed"]))
            value = None if line["value"] == "" else float(line["value"])
            own = line.get("own") or None  # absent from records written before it existed
            recorded = Recorded(line["commands"], value, line["signature"], line["side_by_side"] == "1",
                                own and float(own))
        except ValueError as e:
            raise RecordError(f"{path}:{number}: not a record line ({e}); mend or delete the line "
                              "(a deleted line's cell runs again)") from None
        if cell in cells:
            raise RecordError(f"{path}:{number}: {', '.join(map(str, cell))} is recorded twice (also line "
                              f"{first_line[cell]}); delete the wrong one (a merge of two sittings can leave both)")
        cells[cell], first_line[cell] = recorded, number
    return cells


def read_curves(path: Path) -> List[dict]:
    """The lines of a table's ``NAME.curves.csv`` (dataset, row, seed, run, model, epoch, valid_loss,
    train_loss: None where the file predates it or the log had none; run 1 where the file predates
    it); none without the file."""
    if not path.is_file():
        return []
    with open(path, encoding="utf-8") as f:
        return [dict(line, seed=int(line["seed"]), run=int(line.get("run") or 1), epoch=int(line["epoch"]),
                     valid_loss=float(line["valid_loss"]),
                     train_loss=float(line["train_loss"]) if line.get("train_loss") else None)
                for line in csv.DictReader(f) if line.get("model")]


def fill_from_curves(plan: "Plan", record: Record) -> int:
    """Record the cells of epoch columns (a validation loss after an epoch) that the record's curves
    answer: a column added after a model's training log was lost is read from the curve kept for that
    model (by its directory's name: the same training arguments) instead of training it again; a row
    that never validates after that epoch (--disable-validation, fewer epochs) has no number there. Only
    an epoch the curve has: a curve may have been kept from a run still training. Of a model trained
    more than once, the latest run answers, whole. Returns how many."""
    runs: Dict[Tuple[str, str], Dict[int, Dict[int, float]]] = {}
    for line in record.curves():
        runs.setdefault((line["dataset"], line["model"]), {}).setdefault(line["run"], {})[line["epoch"]] = line["valid_loss"]
    curves = {model: by_run[max(by_run)] for model, by_run in runs.items()}
    filled = 0
    for col in [c for c in plan.table.columns if c.measure in EPOCH_MEASURES]:
        ds = plan.table.datasets[col.dataset]
        for row in [r for r in plan.table.rows if plan.applies(ds, r)]:
            for seed in plan.column_seeds(ds, col):
                cell, keys = (ds.id, row.id, col.id, seed), cell_keys(plan, cell_steps(plan, ds, row, col, seed))
                loss = curves.get((ds.id, plan.run_dir(ds, row, seed).name), {}).get(col.epoch)
                applies = validates_epoch(plan.train_argv(ds, row, seed), col.epoch)
                if (loss is not None or not applies) and not record.get(cell, *keys):
                    own = MEASURES[col.measure].combine is not None  # None if the row never validates then
                    record.put(cell, Recorded(keys[0], None if own else loss, "", False, loss if own else None))
                    filled += 1
    return filled


def steps_to_run(plan: "Plan", steps: List["Step"], record: Optional[Record], rows: Optional[List[str]] = None) -> List["Step"]:
    """The plan's steps that a cell not yet recorded needs (of ``rows`` only, if given), with the models
    those read in turn (a fine-tune's base model); the data preparation if anything runs; the heatmap
    if the record has none and no rows were chosen."""
    trains: Dict[tuple, List["Step"]] = {}
    for step in steps:
        if step.model:
            trains.setdefault(step.model, []).append(step)
    wanted: set = set()

    def want(step: "Step") -> None:
        if step.output not in wanted:
            wanted.add(step.output)
            for model in step.needs:
                for training in trains.get(model, []):
                    want(training)

    for col in plan.table.columns:
        ds = plan.table.datasets[col.dataset]
        for row in [r for r in plan.table.rows if plan.applies(ds, r) and (rows is None or r.id in rows)]:
            # a combined cell's value also needs the baseline's own number: its cell's steps if not recorded
            cells = [row] + ([plan.table.row(col.baseline)] if MEASURES[col.measure].combine else [])
            running = [seed for seed in plan.column_seeds(ds, col) if seed in plan.seeds_to_run(ds)]
            for seed, r in [(seed, r) for seed in running for r in cells]:
                needed = cell_steps(plan, ds, r, col, seed)
                if not (record and record.get((ds.id, r.id, col.id, seed), *cell_keys(plan, needed))):
                    for step in needed:
                        want(step)
    if HEATMAP.drawn_by(plan) and rows is None and not (record and record.has_heatmap()):
        want(HEATMAP.step(plan))
    return [s for s in steps if s.output in wanted or (s.kind == "prep" and wanted)]


def publish(plan: "Plan", record: Record) -> None:
    """Copy the table's report (Markdown, CSV, plots, commands, heatmaps) into the record's folder."""
    name = plan.table.name
    copies = [(plan.out / f"{name}{suffix}", record.directory / f"{name}{suffix}")
              for suffix in (".md", ".csv", ".png", ".curves.png", ".curves.csv")]
    copies.append((plan.out / "commands.sh", record.directory / f"{name}.commands.sh"))
    drawn = HEATMAP.drawn(plan)
    if drawn:
        copies += [(f, record.heatmap_dir / f.name) for f in drawn.iterdir() if f.suffix in (".png", ".md")]
    for source, target in copies:
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
