"""The table runner on a Slurm cluster (``--launcher slurm``): every step of the queue one job, submitted
through submitit with ``afterok`` dependencies that follow the plan, then followed until the table is done.

The same truths as the local runner (``runner``): a step's completion marker is the only proof that it is
done, and the job runs the step exactly as the local runner does (``runner.run_step``: its lock, its log,
the marker written after the command exited 0 and its output is there). A job's id is kept beside the
step's marker (``.MARKER.slurm-job``, where two tables sharing a model both find it) and listed in the
table's folder (``OUT/slurm/jobs.tsv``), so launching the same command again submits only the steps that
are neither done nor queued or running, and depends on the ones that are. Slurm cancels the dependents of
a failed step (``--kill-on-invalid-dep=yes``) instead of leaving them pending forever.

Trainings are requeueable: submitit asks Slurm for a signal before the time limit (and receives the one a
preemption sends), requeues the job and exits; the requeued job runs the same step, and fairseq goes on
from its ``checkpoint_last.pt``. A training killed that way never wrote its marker, so it is never taken
for a finished one. A timed decode (a column reads its running time) runs on a node of its own
(``--exclusive``) and its log names the node, which the report quotes.

Why submitit: it is FAIR's Slurm library (fairseq's Hydra launcher uses it), it writes the ``sbatch``
script, parses the job id, runs a pickled Python call on the node with this environment's interpreter
and implements the signal-and-requeue protocol; this module adds only what the table runner means by a
step (dependencies, markers, job files) and reads job states with ``squeue``/``scontrol``
(``processes.slurm``), since submitit's own reader needs Slurm's accounting database.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Dict, List, Optional

import submitit
from submitit.helpers import Checkpointable

from fairseq_sparse.experiments.arguments import merge_args, parse_flags
from fairseq_sparse.experiments.errors import ConfigError, StepError
from fairseq_sparse.experiments.outputs import TIMED_ON_NODE_MARK
from fairseq_sparse.experiments.plan import Step
from fairseq_sparse.experiments.resources import KINDS, Resources
from fairseq_sparse.experiments.runner import PROGRESS, Queue, TableRun, build_queue, progress_text, run_step
from fairseq_sparse.experiments.status import job_file, recorded_job, state_of
from fairseq_sparse.files import write_atomically
from fairseq_sparse.processes import slurm
from fairseq_sparse.processes.command import run_command

# submitit asks for its signal this long before a training's time limit: time to requeue
SIGNAL_BEFORE_LIMIT_S = 120
# a training goes back to the queue at most this often at its time limit (a week-long run in 2-day slots
# needs 4; preemptions do not count)
MAX_REQUEUES_AT_LIMIT = 50


def kind_of(step: Step) -> str:
    """Which resources a step asks for (``resources.KINDS``)."""
    if step.kind in ("prep", "train"):
        return step.kind
    return "timed" if step.runs_alone else "finish"


def _ignore_preemption_signal() -> None:
    """In the step's command: Slurm signals every process of the job before its time limit and at a
    preemption; the job's Python requeues it, the command must not die of it first."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


class StepJob(Checkpointable):
    """What a job runs: one step, as the local runner runs it. Checkpointable: at its time limit or a
    preemption submitit requeues the same call, and fairseq resumes from the last checkpoint."""

    def __init__(self, step: Step, index: int, total: int):
        self.step, self.index, self.total = step, index, total

    def __call__(self) -> str:
        node = int(os.environ.get("SLURM_NODEID", "0"))
        if node > 0:  # a training's other nodes: their fairseq processes join node 0's, which writes the marker
            log = self.step.log.with_name(f"{self.step.log.stem}.node{node}.log")
            finished = run_command(self.step.argv, log, append=True, child_setup=_ignore_preemption_signal)
            if finished.returncode != 0:
                raise StepError(f"{self.step.label}: node {node} failed (exit status {finished.returncode}); log: {log}")
            return "ok"
        header = ""
        if self.step.runs_alone:
            header = f"{TIMED_ON_NODE_MARK} {socket.gethostname()} (Slurm job {os.environ.get('SLURM_JOB_ID', '?')}, --exclusive)\n"
        run_step(self.step, self.index, self.total, child_setup=_ignore_preemption_signal, header=header)
        return "ok"


def distributed_argv(argv: List[str], world_size: int) -> List[str]:
    """A training's command for ``world_size`` processes (GPUs on every node): the tokens per update kept as
    the setting wrote them. A setting's ``--update-freq`` is written for the GPU count its
    ``--distributed-world-size`` gives (one without it: docs/gpus.md), so the update frequency becomes
    ``update_freq × written / world_size``; refused where that is no whole number."""
    flags = dict(parse_flags(argv))
    written = int(flags.get("--distributed-world-size", ["1"])[0])
    if world_size == written == 1:
        return argv
    update_freq = int(flags.get("--update-freq", ["1"])[0])
    if (update_freq * written) % world_size:
        raise ConfigError(f"--update-freq {update_freq} is written for {written} GPU(s); {world_size} GPUs cannot keep its "
                          f"tokens per update ({update_freq * written} GPU-batches); ask for a GPU count dividing "
                          f"{update_freq * written}")
    # a port of its own per model, so two trainings sharing a node do not meet
    port = 10000 + int.from_bytes(str(argv).encode()[-8:].ljust(8, b"\0"), "little") % 20000
    return merge_args(argv, ["--update-freq", str(update_freq * written // world_size),
                             "--distributed-world-size", str(world_size), "--distributed-port", str(port)])


@dataclass
class Entry:
    """One step of the queue on the cluster: its position, its job (once known) and what was last said of it."""

    index: int
    step: Step
    job: Optional[str] = None
    folder: Optional[Path] = None  # submitit's folder of the table: OUT/slurm
    said: str = ""
    log_offset: Optional[int] = None
    deps: List[str] = field(default_factory=list)


@dataclass
class Launch:
    """What the command line asks of the cluster: resources per kind of step, how often to look at the
    queue, whether to wait for the jobs."""

    resources: List[Dict[str, Resources]]  # per table (its YAML may ask for other resources)
    poll_seconds: float = 30.0
    detach: bool = False
    report_argv: Optional[List[str]] = None  # the command that writes the tables' reports (a job when detached)


def check_cluster(requests: Dict[tuple, Resources]) -> None:
    """Everything the cluster would refuse, before anything is submitted: Slurm's commands, each
    partition asked for, and each request (``sbatch --test-only``), keyed by (table, kind of step)."""
    slurm.require_commands()
    known = slurm.partitions()
    for (table, kind), res in requests.items():
        if res.partition and res.partition not in known:
            raise slurm.SlurmError(f"--partition {res.partition} ({kind} steps of {table}): no such partition on this "
                                   f"cluster (partitions: {', '.join(known)})")
    checked = set()
    for (table, kind), res in requests.items():
        flags = res.flags(exclusive=kind == "timed")
        if tuple(flags) not in checked:
            slurm.check_request(flags, f"request for {kind} steps of {table}")
            checked.add(tuple(flags))


def _executor(folder: Path, res: Resources, kind: str, label: str, deps: List[str]) -> submitit.SlurmExecutor:
    executor = submitit.SlurmExecutor(folder=folder / "%j", max_num_timeout=MAX_REQUEUES_AT_LIMIT)
    params = res.executor_parameters()
    extra = dict(params.pop("additional_parameters"))
    if deps:
        extra["dependency"] = "afterok:" + ":".join(deps)
        extra["kill-on-invalid-dep"] = "yes"
    if kind == "train":
        extra["requeue"] = True
    if kind == "timed":
        extra["exclusive"] = True
    executor.update_parameters(job_name=label[:100], signal_delay_s=SIGNAL_BEFORE_LIMIT_S,
                               additional_parameters=extra, **params)
    return executor


@contextlib.contextmanager
def _launch_lock(models_root: Path):
    """Two launches at once must not both submit one step: they take turns."""
    models_root.mkdir(parents=True, exist_ok=True)
    with open(models_root / ".slurm-launch.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _prerequisites(queue: List[Step], position: int) -> List[int]:
    """The queue positions whose steps must end well before the step at ``position`` starts: the data
    preparations, and the steps that train or average a model it reads (the local runner's ``ready``)."""
    step = queue[position]
    if step.kind == "prep":
        return [i for i in range(position) if queue[i].kind == "prep"]
    return [i for i, other in enumerate(queue)
            if i != position and (other.kind == "prep" or (other.model and other.model in step.needs))]


def submit(tables: List[TableRun], built: Queue, launch: Launch) -> List[Entry]:
    """One job per step of the queue not done, not queued and not running; returns every entry with its job."""
    queue = built.steps
    entries = [Entry(i, step, folder=tables[built.owners[step.output][0]].plan.out / "slurm")
               for i, step in enumerate(queue, 1)]
    recorded = {e.index: recorded_job(e.step) for e in entries}
    states = slurm.job_states([j for j in recorded.values() if j])
    submitted: List[str] = []
    try:
        waiting = list(range(len(entries)))
        while waiting:  # in the queue's order, each once the jobs of what it needs are known
            position = next(p for p in waiting if all(entries[i].job for i in _prerequisites(queue, p)))
            waiting.remove(position)
            entry = entries[position]
            step, job = entry.step, recorded[entry.index]
            if job and states[job].active:
                entry.job = job
                print(f"[{entry.index}/{len(entries)}] {step.label}: already {states[job].state.lower()} as job {job}",
                      flush=True)
                continue
            deps = [entries[i].job for i in _prerequisites(queue, position)]
            kind = kind_of(step)
            res = launch.resources[built.owners[step.output][0]][kind]
            run = step
            if kind == "train":
                run = replace(step, argv=distributed_argv(step.argv, res.world_size))
            step.log.parent.mkdir(parents=True, exist_ok=True)
            executor = _executor(entry.folder, res, kind, step.label, deps)
            job = executor.submit(StepJob(run, entry.index, len(entries))).job_id
            submitted.append(job)
            entry.job, entry.deps = job, deps
            job_file(step).parent.mkdir(parents=True, exist_ok=True)
            write_atomically(job_file(step), job + "\n")
            with open(entry.folder / "jobs.tsv", "a", encoding="utf-8") as listing:
                listing.write(f"{job}\t{kind}\t{step.label}\t{step.log}\n")
            after = f" after {', '.join(deps)}" if deps else ""
            print(f"[{entry.index}/{len(entries)}] {step.label}: submitted as job {job}{after}", flush=True)
    except (submitit.core.utils.FailedJobError, slurm.SlurmError, OSError) as e:
        slurm.cancel(submitted)  # a launch that could not submit everything leaves nothing queued
        message = str(e).strip().splitlines()
        raise slurm.SlurmError(f"submitting to Slurm failed, nothing left queued: "
                               f"{next((m for m in message if 'error' in m.lower()), message[-1] if message else e)}") from e
    return entries


def follow(entries: List[Entry], poll_seconds: float, finished: Callable[[Step], None]) -> List[Entry]:
    """Print each step's changes and its progress lines until no job of the launch is queued or running;
    call ``finished`` for each step that ends done. Returns the entries that did not end done."""
    total = len(entries)
    while True:
        states = slurm.job_states([e.job for e in entries if e.job])
        active = 0
        for e in entries:
            st = state_of(e.step, e.job, states, e.folder)
            if st.state == "running":
                _show_progress(e)
            said = st.state + (f" on {st.node}" if st.state == "running" and st.node else "")
            if said != e.said:
                e.said = said
                if st.state == "done":
                    print(f"[{e.index}/{total}] {e.step.label}: done (job {e.job})", flush=True)
                    finished(e.step)
                elif st.state in ("failed", "stopped"):
                    print(f"[{e.index}/{total}] {e.step.label}: {st.state.upper()} (job {e.job}, {st.reason}); "
                          f"log: {e.step.log}", flush=True)
                elif st.state == "cancelled":
                    print(f"[{e.index}/{total}] {e.step.label}: cancelled (job {e.job}: {st.reason})", flush=True)
                else:
                    print(f"[{e.index}/{total}] {e.step.label}: {said} (job {e.job})", flush=True)
            active += not st.ended
        if not active:
            return [e for e in entries if e.said != "done"]
        time.sleep(poll_seconds)


def _show_progress(entry: Entry) -> None:
    """The step's new progress lines since last looked (a training's log is appended over its legs)."""
    log = entry.step.log
    if not log.is_file():
        return
    size = log.stat().st_size
    if entry.log_offset is None or size < entry.log_offset:
        entry.log_offset = size if entry.step.kind == "train" else 0
    with open(log, encoding="utf-8", errors="replace") as f:
        f.seek(entry.log_offset)
        text = f.read()
    complete = text[:text.rfind("\n") + 1]
    entry.log_offset += len(complete.encode("utf-8"))
    for line in complete.splitlines():
        if PROGRESS.search(line):
            print(f"  [{entry.index}] {progress_text(line)}", flush=True)


def failed_models(entries: List[Entry], unfinished: List[Entry]) -> set:
    """The queue's models that did not train (or average), and those whose steps needed one that did not."""
    failed: set = set()
    bad = {id(e) for e in unfinished}
    for e in entries:
        if e.step.model and (id(e) in bad and e.step.kind in ("train", "average") or set(e.step.needs) & failed):
            failed.add(e.step.model)
    return failed


def report_job(folder: Path, launch: Launch, after: List[str]) -> Optional[str]:
    """A detached launch's last job: the tables' reports from whatever finished (``afterany``)."""
    if not launch.report_argv:
        return None
    executor = _executor(folder, launch.resources[0]["report"], "report", "report", [])
    extra = {"dependency": "afterany:" + ":".join(after)} if after else {}
    executor.update_parameters(additional_parameters={**executor.parameters.get("additional_parameters", {}), **extra})
    return executor.submit(submitit.helpers.CommandFunction([sys.executable, "-m", "fairseq_sparse.tables",
                                                             *launch.report_argv])).job_id


def launch_tables(tables: List[TableRun], launch: Launch) -> tuple:
    """Submit the tables' steps to Slurm and (unless detached) follow them to the end. Returns each table's
    failed models (as ``runner.execute_tables``) and the steps that did not finish (label, state, log)."""
    slurm.require_commands()
    with _launch_lock(tables[0].plan.models_root.parent):
        # every request is checked, whatever is left to run: a wrong one is said before it matters
        check_cluster({(run.plan.table.name, kind): launch.resources[t][kind]
                       for t, run in enumerate(tables) for kind in KINDS if kind != "report" or launch.detach})
        built = build_queue(tables)
        entries = submit(tables, built, launch)
    if launch.detach:
        if entries:
            job = report_job(entries[0].folder, launch, [e.job for e in entries if e.job])
            print(f"submitted; the report follows as job {job}. Where the table stands: the same command with --status",
                  flush=True)
        return [set() for _ in tables], []

    def finished(step: Step) -> None:
        for t in built.owners[step.output]:
            tables[t].finished()

    try:
        unfinished = follow(entries, launch.poll_seconds, finished)
    except KeyboardInterrupt:  # the jobs are the cluster's: they go on without the command that follows them
        print("\nstopped following; the jobs go on. Where the table stands: the same command with --status; "
              "the same command again follows them and writes the report", flush=True)
        raise SystemExit(130)
    failures = [(e.step.label, e.said.split(" on ")[0], str(e.step.log)) for e in unfinished]
    return built.failed_models(failed_models(entries, unfinished)), failures
