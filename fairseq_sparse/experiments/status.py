"""Where a table stands (``python -m fairseq_sparse.tables NAME --status``), for either launcher: each
step done, queued, running, failed, stopped, cancelled or not started, read from its completion marker,
the job recorded beside it (on a Slurm cluster) or the local runner's lock and log. Runs nothing."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from fairseq_sparse.experiments.completion import completion_marker, done, locked
from fairseq_sparse.experiments.runner import PROGRESS, TableRun, progress_text
from fairseq_sparse.experiments.step import Step
from fairseq_sparse.processes import slurm


def job_file(step: Step) -> Path:
    """Where the id of the job that runs ``step`` is kept: beside its completion marker."""
    marker = completion_marker(step)
    return marker.with_name(f".{marker.name}.slurm-job")


def recorded_job(step: Step) -> Optional[str]:
    path = job_file(step)
    if not path.is_file():
        return None
    return path.read_text(encoding="utf-8").strip() or None


@dataclass
class StepState:
    """Where a step stands: done, queued, running, failed, cancelled (never ran: a step it needs did not
    finish), stopped (cut short: cancelled while it ran; locally, a run cut short or failed) or not
    started; with its job, node and Slurm's reason where a cluster runs it."""

    state: str
    job: Optional[str] = None
    node: str = ""
    reason: str = ""

    @property
    def ended(self) -> bool:
        return self.state not in ("queued", "running")


def state_of(step: Step, job: Optional[str], states: Dict[str, slurm.JobState], folder: Optional[Path] = None) -> StepState:
    if done(step):
        return StepState("done", job)
    if job and job in states:
        js = states[job]
        if js.state in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "RESV_DEL_HOLD"):
            return StepState("queued", job, js.node, js.reason)
        if js.active:
            return StepState("running", job, js.node)
        started = folder is not None and any((folder / job).glob("*_log.out"))
        if js.state == "CANCELLED":  # by scancel while it ran (cut short), or by Slurm before: what it needs failed
            return (StepState("stopped", job, js.node, "cancelled while it ran") if started else
                    StepState("cancelled", job, js.node, js.reason or "a step it needs did not finish"))
        if js.state == "UNKNOWN":
            return StepState("failed" if started else "cancelled", job, "", "Slurm no longer remembers the job")
        return StepState("failed", job, js.node, js.state.lower() + (f": {js.reason}" if js.reason else ""))
    if locked(step):  # the local runner's lock
        return StepState("running")
    if step.log.is_file():
        return StepState("stopped")
    return StepState("not started")


def last_progress(log: Path) -> str:
    """The last progress line of a log (epochs, validation, decoding), as the local runner prints them."""
    if not log.is_file():
        return ""
    lines = [line for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if PROGRESS.search(line)]
    return progress_text(lines[-1]) if lines else ""


def print_status(tables: List[TableRun]) -> int:
    """``--status``: each step of the tables as done, queued, running, failed (with its log), cancelled,
    stopped or not started, a running step's last progress line, and how many are left. Reads the
    cluster where a step has a job, the local runner's locks and logs otherwise; runs nothing."""
    rows = []
    for run in tables:
        steps = run.steps if run.needed is None else run.needed
        jobs = {s.output: recorded_job(s) for s in steps}
        ids = [j for j in jobs.values() if j]
        states: Dict[str, slurm.JobState] = {}
        if ids:
            try:
                states = slurm.job_states(ids)
            except slurm.SlurmError as e:
                print(f"tables: warning: the cluster does not answer ({e}); job states unknown", file=sys.stderr)
        folder = run.plan.out / "slurm"
        print(f"{run.plan.table.name} ({run.plan.table.profile}):")
        left = 0
        for i, step in enumerate(steps, 1):
            st = state_of(step, jobs[step.output], states, folder)
            left += st.state != "done"
            on = f" on {st.node}" if st.node and st.state == "running" else ""
            where = f" (job {st.job}{on})" if st.job else ""
            detail = ""
            if st.state in ("failed", "stopped"):
                detail = f"; log: {step.log}" + (f" ({st.reason})" if st.reason else "")
            elif st.state == "cancelled":
                detail = f" ({st.reason})"
            elif st.state == "queued" and st.reason:
                detail = f" ({st.reason})"
            elif st.state == "running":
                progress = last_progress(step.log)
                detail = f": {progress}" if progress else ""
            print(f"  {f'[{i}/{len(steps)}]':<9} {st.state:<11} {step.label}{where}{detail}")
            rows.append(st.state)
        print(f"  {left} of {len(steps)} steps left")
    return 0

