"""Running a plan, or several tables' plans as one queue: each command (``command.run_command``)
with its log in a file, finished ones skipped (``--dry-run``, parsing them instead: ``dry_run``).

A step is finished when its completion marker exists, and runs under a lock of its own
(``completion``): a runner killed at any moment re-runs exactly the step it was in, and two
runners sharing models or data never run one step at once.
"""

from __future__ import annotations

import re
import shlex
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional

from fairseq_sparse.processes.command import run_command
from fairseq_sparse.experiments.completion import completion_marker, done, step_lock
from fairseq_sparse.files import write_atomically
from fairseq_sparse.experiments.errors import StepError
from fairseq_sparse.processes.machine import SharedMachine, sigterm_as_exit
from fairseq_sparse.experiments.outputs import SIDE_BY_SIDE_MARK
from fairseq_sparse.experiments.plan import Plan, Step


def relative_to_cwd(text: str) -> str:
    """``text`` with the working directory's absolute path taken off every path under it: what a
    committed commands.sh or report prints, so it names no machine's directories."""
    return text.replace(str(Path.cwd().resolve()) + "/", "")


def _tail(path: Path, lines: int = 25) -> str:
    if not path.is_file():
        return "(no log)"
    return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])


PROGRESS = re.compile(r"\| (train_inner|train|valid) \||Translated \d|averaged \d|binarised data|pairs|encodings pruned")


def progress_text(line: str) -> str:
    """A progress line of a command's log as the console shows it: fairseq's "date time | INFO | logger |"
    prefix dropped, at most 200 characters."""
    return line.rstrip().split(" | ")[-1][:200]


def _prefix(index: int, machine: Optional[SharedMachine]) -> str:
    """Indent of a step's console lines; its number where lines of steps side by side interleave."""
    return f"  [{index}] " if machine else "      "


def run_step(step: Step, index: int, total: int, machine: Optional[SharedMachine] = None,
             child_setup: Optional[Callable[[], None]] = None, header: str = "") -> float:
    """Run one command, streaming its log to a file and its progress lines to the console
    (prefixed with the step's number when ``machine`` runs it beside others); ``child_setup`` runs in
    the command's process before it starts (a Slurm job's command ignores the job's preemption signal);
    ``header`` goes first into the log (where a timed step ran)."""
    step.log.parent.mkdir(parents=True, exist_ok=True)
    step.output.parent.mkdir(parents=True, exist_ok=True)
    print(f"[{index}/{total}] {step.label}", flush=True)
    prefix = _prefix(index, machine)
    with step_lock(step, prefix):
        if done(step):
            print(f"{prefix}finished meanwhile by another runner", flush=True)
            return 0.0
        return _run_locked(step, prefix, machine, child_setup, header)


def _progress(prefix: str) -> Callable[[str], None]:
    """What prints a command's progress lines (epochs, validation, decoding) to the console."""
    def show(line: str) -> None:
        if PROGRESS.search(line):
            print(f"{prefix}{progress_text(line)}", flush=True)
    return show


def _run_locked(step: Step, prefix: str, machine: Optional[SharedMachine],
                child_setup: Optional[Callable[[], None]] = None, header: str = "") -> float:
    # the report says which training times are a shared machine's
    mark = f"{SIDE_BY_SIDE_MARK} (OMP_NUM_THREADS={machine.threads})\n" if machine and step.kind == "train" else ""
    mark += header
    # a training run cut short resumes from its checkpoint_last.pt (fairseq's default): keep its log's
    # earlier epochs (validation losses, wall time) by appending
    finished = run_command(step.argv, step.log, append=step.kind == "train", header=mark, on_line=_progress(prefix),
                           machine=machine, child_setup=child_setup)
    if finished.returncode != 0:
        raise StepError(f"{step.label} failed (exit status {finished.returncode}); command:\n  {shlex.join(step.argv)}\n"
                        f"last lines of {step.log}:\n{_tail(step.log)}")
    marker = completion_marker(step)
    if marker != step.output and not step.output.exists():
        raise StepError(f"{step.label} finished but {step.output} is missing; log: {step.log}")
    write_atomically(marker, "ok\n")
    print(f"{prefix}done in {finished.seconds:.0f}s" + (f" ({step.label})" if machine else ""), flush=True)
    return finished.seconds


def execute(plan: Plan, steps: List[Step], jobs: int = 1, finished: Callable[[], None] = lambda: None,
            needed: Optional[List[Step]] = None) -> set:
    """Run the steps not done yet (of ``needed`` if given, e.g. those of cells not recorded; all are
    listed in commands.sh); returns the models (dataset, row, seed) that failed to train.
    ``finished`` is called after each step (the report of what has finished so far).

    A failed data preparation stops everything. A failed training or averaging is reported,
    the steps that need that model are skipped and the other rows go on; a failed decode or
    analysis is reported and shows as "failed" in its cells. ``jobs`` > 1 trains that many models
    at once (see ``run_side_by_side``).
    """
    return execute_tables([TableRun(plan, steps, needed, finished)], jobs)[0]


@dataclass
class TableRun:
    """One table's part of a run: its plan, all its steps of the seeds to run, the steps its cells still
    need (None: all), what to call when one of its steps has finished (the report so far), and the
    commands commands.sh lists (None: ``steps``; a sitting of one seed lists every seed's, so the
    committed file names every command the table's numbers came from)."""

    plan: Plan
    steps: List[Step]
    needed: Optional[List[Step]] = None
    finished: Callable[[], None] = lambda: None
    listed: Optional[List[Step]] = None


@dataclass
class Queue:
    """Several tables' steps not done yet, each once, in the order they run (``queue``); which tables own each
    output (``owners``, so a step that finishes updates each table's report); and per table its name of a
    model -> the queue's (``names``: two tables may give one model two names, or two models one name)."""

    steps: List[Step]
    owners: Dict[Path, List[int]]
    names: List[Dict[tuple, tuple]]

    def failed_models(self, failed: set) -> List[set]:
        """Each table's models (its own names) among the queue's ``failed``."""
        return [{model for model, name in table_names.items() if name in failed} for table_names in self.names]


def build_queue(tables: List[TableRun]) -> Queue:
    """The steps of several tables that are not done, as one queue (both launchers run this): the tables in
    the order given, each in its plan's order; a model two tables share (the same training command, the same
    output) once; trainings cut short by an earlier run first. Writes each table's commands.sh."""
    queue: List[Step] = []
    owners: Dict[Path, List[int]] = {}  # a step's output -> the tables it belongs to
    shared: Dict[Path, tuple] = {}  # a training's output -> the one name its model has in the queue
    names: List[Dict[tuple, tuple]] = []  # per table: its name of a model -> the queue's
    for t, run in enumerate(tables):
        write_commands(run.plan, run.listed or run.steps)
        todo = [s for s in (run.steps if run.needed is None else run.needed) if not done(s)]
        recorded = (f", {len(run.steps) - len(run.needed)} not needed (their cells are recorded, or their rows not chosen)"
                    if run.needed is not None else "")
        print(f"{run.plan.table.name} ({run.plan.table.profile}): {len(run.steps)} steps, {len(todo)} to run{recorded}; "
              f"commands in {run.plan.out / 'commands.sh'}", flush=True)
        # tables name models (dataset, row, seed): the same name may be two models, two names one model
        names.append({s.model: shared.setdefault(s.output, (*s.model, t)) for s in run.steps if s.kind == "train" and s.model})

        def rename(model: tuple, t: int = t) -> tuple:
            return names[t].get(model, (*model, t))

        for s in todo:
            if s.output not in owners:
                queue.append(replace(s, model=s.model and rename(s.model), needs=tuple(map(rename, s.needs))))
            owners.setdefault(s.output, []).append(t)
    # a training a sitting cut short goes on before new ones start: half-trained models finish first
    queue.sort(key=lambda s: s.kind != "prep" and not (s.resumes_from and s.resumes_from.exists()))
    return Queue(queue, owners, names)


def execute_tables(tables: List[TableRun], jobs: int = 1) -> List[set]:
    """Run several tables' steps as one queue (``build_queue``): with ``jobs`` > 1 the next table's
    trainings use the cores that the last trainings of the one before leave idle, and what finishes a
    trained model (``finishing_first``) goes before new trainings. Returns each table's failed models, as
    ``execute`` does."""
    built = build_queue(tables)
    queue = built.steps

    def finished(step: Step) -> None:
        for t in built.owners[step.output]:
            tables[t].finished()

    failed: set = set()
    with sigterm_as_exit():
        if jobs > 1:
            run_side_by_side(queue, jobs, failed, finished)
        else:
            pending = list(enumerate(queue, 1))
            while pending:
                position, (i, step) = next((p, entry) for p, entry in finishing_first(pending)
                                           if ready(pending, p, entry[1]))
                pending.pop(position)
                if not skipped(step, i, len(queue), failed):
                    run_or_record_failure(step, i, len(queue), failed)
                    finished(step)
    return built.failed_models(failed)


def write_commands(plan: Plan, steps: List[Step]) -> None:
    """``OUT/commands.sh``: every command of the table, to read or run by hand."""
    plan.out.mkdir(parents=True, exist_ok=True)
    with open(plan.out / "commands.sh", "w", encoding="utf-8") as f:
        f.write("#!/usr/bin/env bash\n# Every command of this table, in order (run from the directory the table ran in: "
                "paths under it are relative).\nset -e\n")
        for step in steps:
            f.write(f"# {step.label}\n{relative_to_cwd(shlex.join(step.argv))} > {shlex.quote(relative_to_cwd(str(step.log)))} 2>&1\n")


def skipped(step: Step, index: int, total: int, failed: set) -> bool:
    """Whether a model the step needs failed to train; then the step's own model counts as failed too."""
    blocked = [m for m in step.needs if m in failed]
    if blocked:
        print(f"[{index}/{total}] skip {step.label}: {blocked[0][1]} failed", flush=True)
        if step.model:  # and what needs this model in turn is skipped
            failed.add(step.model)
    return bool(blocked)


def run_or_record_failure(step: Step, index: int, total: int, failed: set, machine: Optional[SharedMachine] = None) -> None:
    """``run_step``; a failure is printed and its model added to ``failed`` (a failed data preparation
    stops everything)."""
    try:
        run_step(step, index, total, machine)
    except StepError as e:
        if step.kind == "prep":
            raise
        print(f"{_prefix(index, machine)}FAILED: {e}", flush=True)
        if step.model:
            failed.add(step.model)


def ready(pending: List[tuple], position: int, step: Step, running: Iterable[Step] = ()) -> bool:
    """Whether nothing that comes before the step in the plan and is not finished is data it reads
    or a model it needs."""
    earlier = [s for _, s in pending[:position]] + list(running)
    return not any(s.kind == "prep" or (s.model and s.model in step.needs and s is not step) for s in earlier)


def finishing_first(pending: List[tuple]) -> List[tuple]:
    """``enumerate(pending)`` with what finishes a trained model (averaging, decoding, analysis)
    before new trainings: a model that finished (one resumed first, say) is recorded before the next
    training of hours starts, so a sitting cut short keeps its result."""
    return sorted(enumerate(pending), key=lambda entry: entry[1][1].kind == "train")


def run_side_by_side(todo: List[Step], jobs: int, failed: set, finished: Callable[[Step], None] = lambda step: None) -> None:
    """Run up to ``jobs`` steps at once, each with its share of the cores and GPUs, in the plan's
    order as far as their inputs allow (``finishing_first``); a step whose running time is a result
    (``Step.runs_alone``: decode speeds, a decode-time column) runs alone while the others are
    stopped, so what it measures is what a run of one job measures.

    Why: a small model does not use two cores well. On 2 cores, two 1-thread trainings of the study's
    128-d model make 1.45x the updates of one 2-thread training. A decode for BLEU, an analysis or a
    data preparation measures nothing a shared machine changes, so it takes a slot like a training
    (on a lent GPU each half-minute decode used to stop three trainings). Training time itself (the ``train_minutes`` and ``train_speedup`` columns) is then that of a
    shared machine.
    """
    machine = SharedMachine(jobs)
    pending = list(enumerate(todo, 1))
    running: Dict[Future, Step] = {}
    pool = ThreadPoolExecutor(jobs)
    try:
        while pending or running:
            for future in [f for f in running if f.done()]:
                done_step = running.pop(future)
                future.result()  # a failed command was recorded; anything else is a bug: raise it
                finished(done_step)
            started = True
            while started:  # until nothing more can start now
                started = False
                for position, (i, step) in finishing_first(pending):
                    if skipped(step, i, len(todo), failed):
                        pass
                    elif not ready(pending, position, step, running.values()):
                        continue
                    elif step.runs_alone:
                        with machine.alone():
                            run_or_record_failure(step, i, len(todo), failed)
                        finished(step)
                    elif len(running) < jobs:
                        running[pool.submit(run_or_record_failure, step, i, len(todo), failed, machine)] = step
                    else:
                        continue
                    pending.pop(position)
                    started = True
                    break
            if running:
                wait(running, return_when=FIRST_COMPLETED)
    except BaseException:  # interrupted (Ctrl-C, kill: sigterm_as_exit): end what runs beside
        machine.stop_all()
        raise
    finally:
        pool.shutdown()  # after stop_all its threads end as soon as their commands do
