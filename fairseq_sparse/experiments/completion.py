"""When a step of a plan is finished, and who may run it.

A step is finished when its completion marker exists, written by rename after its command
exited 0 and its output is there. An output alone proves nothing: fairseq-preprocess writes
the dictionary before the binarised data, a killed averaging leaves half a checkpoint, a killed
decode half a file. So a runner killed at any moment re-runs exactly the step it was in. A step
runs under a lock file of its own, so two runners sharing models or data never run it at once:
the second waits for the first and then finds it finished.
"""

import contextlib
import fcntl
from pathlib import Path

from fairseq_sparse.experiments.plan import Step


def completion_marker(step: Step) -> Path:
    """What proves that ``step`` ran to the end: its output if that is a ``.done`` marker itself
    (trainings, data preparation), else ``OUTPUT.done`` beside the output."""
    return step.output if step.output.suffix == ".done" else step.output.with_name(step.output.name + ".done")


@contextlib.contextmanager
def step_lock(step: Step, prefix: str = "      "):
    """Hold ``step``'s lock file (beside its marker) while it runs; wait if another runner holds it."""
    marker = completion_marker(step)
    marker.parent.mkdir(parents=True, exist_ok=True)
    with open(marker.with_name(f".{marker.name}.lock"), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"{prefix}another runner is running this step; waiting for it", flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def done(step: Step) -> bool:
    if not step.output.exists():
        return False
    return completion_marker(step).exists() or proves_its_own_end(step)


def proves_its_own_end(step: Step) -> bool:
    """Steps run before completion markers existed: a decode whose output ends with fairseq-generate's
    summary line, or an averaging whose log has the line printed after its checkpoint was saved, ran to
    the end (their last words are written last). Nothing else is trusted without its marker."""
    if step.kind == "generate":
        return "Translated " in step.output.read_text(encoding="utf-8", errors="replace")
    if step.kind == "average":
        return step.log.is_file() and "averaged " in step.log.read_text(encoding="utf-8", errors="replace")
    return False


def locked(step: Step) -> bool:
    """Whether a runner holds the step's lock now (it runs the step)."""
    marker = completion_marker(step)
    path = marker.with_name(f".{marker.name}.lock")
    if not path.is_file():
        return False
    with open(path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(lock, fcntl.LOCK_UN)
        return False
