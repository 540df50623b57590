"""A Slurm cluster as the table runner's launcher asks it things: whether it is there (``sbatch`` on the
PATH), its partitions, whether it accepts a request before anything is submitted (``sbatch --test-only``),
where its jobs are (``squeue``, then ``scontrol`` for jobs that left the queue) and cancelling them.

Jobs themselves are submitted through submitit (``fairseq_sparse.experiments.cluster``); this module only
reads what Slurm's own commands print in the formats they are asked for, and works without Slurm's
accounting database (``sacct``), which many clusters and the local one-node cluster lack.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from typing import Dict, Iterable, List

# states of a job that will still run or runs (squeue's long names)
ACTIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
                    "RESIZING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "RESV_DEL_HOLD"})


class SlurmError(Exception):
    """What the cluster refuses or cannot answer, in one line."""


@dataclass(frozen=True)
class JobState:
    """Where a job is: Slurm's state (RUNNING, PENDING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ...; UNKNOWN
    once the controller forgot it), the node it ran on and Slurm's reason (why pending, why it ended)."""

    state: str
    node: str = ""
    reason: str = ""

    @property
    def active(self) -> bool:
        return self.state in ACTIVE


def _run(argv: List[str], timeout: float = 60) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as e:
        raise SlurmError(f"{argv[0]} is not on the PATH: Slurm's commands are needed (run on a cluster's login "
                         "node, or start a local cluster: bash scripts/slurm-local.sh start)") from e
    except subprocess.TimeoutExpired as e:
        raise SlurmError(f"{' '.join(argv[:2])} did not answer in {timeout:.0f} s: is the Slurm controller up?") from e


def _first_error(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or ["(no message)"])[-1]


def require_commands() -> None:
    """Refuse at once where Slurm's commands are missing."""
    missing = [name for name in ("sbatch", "squeue", "scontrol", "scancel", "sinfo") if shutil.which(name) is None]
    if missing:
        raise SlurmError(f"--launcher slurm: {', '.join(missing)} not on the PATH (run on a Slurm login node, or start a "
                         "local cluster: bash scripts/slurm-local.sh start)")


def partitions() -> List[str]:
    """The cluster's partitions, the default first."""
    done = _run(["sinfo", "--noheader", "--format=%P"])
    if done.returncode != 0:
        raise SlurmError(f"sinfo: {_first_error(done.stderr or done.stdout)}")
    names = [name.strip() for name in done.stdout.split() if name.strip()]
    default = [name.rstrip("*") for name in names if name.endswith("*")]
    return list(dict.fromkeys(default + [name.rstrip("*") for name in names]))


def check_request(flags: List[str], what: str) -> None:
    """Ask Slurm whether it would accept a job with these ``sbatch`` flags (``--test-only``: nothing is
    submitted); one line naming ``what`` and Slurm's words if not."""
    done = _run(["sbatch", "--test-only", *flags, "--wrap", "true"])
    if done.returncode != 0:
        raise SlurmError(f"Slurm refuses the {what} ({' '.join(flags)}): {_first_error(done.stderr)}")


def job_states(job_ids: Iterable[str]) -> Dict[str, JobState]:
    """The state of each job: from the queue, else from the controller's memory of ended jobs
    (``MinJobAge``), else UNKNOWN."""
    wanted = sorted(set(job_ids))
    if not wanted:
        return {}
    states: Dict[str, JobState] = {}
    queue = _run(["squeue", "--noheader", "--states=all", "--format=%i|%T|%N|%r"])
    if queue.returncode != 0:
        raise SlurmError(f"squeue: {_first_error(queue.stderr)}")
    for line in queue.stdout.splitlines():
        fields = line.strip().split("|")
        if len(fields) == 4 and fields[0] in wanted:
            states[fields[0]] = JobState(fields[1], fields[2], fields[3] if fields[3] != "None" else "")
    for job in wanted:
        if job not in states or not states[job].active:
            states[job] = _remembered(job) or states.get(job) or JobState("UNKNOWN")
    return states


def _remembered(job: str) -> JobState | None:
    shown = _run(["scontrol", "show", "job", "--oneliner", job])
    if shown.returncode != 0:
        return None
    fields = dict(word.split("=", 1) for word in shown.stdout.split() if "=" in word)
    if "JobState" not in fields:
        return None
    node = fields.get("NodeList", "")
    reason = fields.get("Reason", "")
    return JobState(fields["JobState"], "" if node == "(null)" else node, "" if reason == "None" else reason)


def cancel(job_ids: Iterable[str]) -> None:
    ids = sorted(set(job_ids))
    if ids:
        _run(["scancel", *ids])
