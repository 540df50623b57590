"""Running one command: its output streamed into a log file, its exit status and wall time reported.

The one place where commands are started, for both runners: the table runner (``runner``) adds its
locks and completion markers on top, the GPU report (``fairseq_sparse.bench.gpu_report``) records a
failed step and goes on. Commands side by side share a ``SharedMachine``: each runs in one of its job
slots (its share of the cores and GPUs) and is stopped while a measured step has the machine.
"""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional

from fairseq_sparse.processes.machine import SharedMachine


@dataclass
class Finished:
    """How a command ended: its exit status (None: stopped at its time limit) and its wall time."""

    returncode: Optional[int]
    seconds: float

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


def _ignore(line: str) -> None:
    """The default of ``on_line``: a line only goes to the log."""


def start(argv: List[str], env: Optional[Dict[str, str]], stderr_log: Optional[Path],
          child_setup: Optional[Callable[[], None]] = None) -> subprocess.Popen:
    """Start ``argv`` with its output on a pipe: its error output too, or into ``stderr_log``;
    ``child_setup`` runs in the child before the command (e.g. a signal it must ignore)."""
    if stderr_log is None:
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                preexec_fn=child_setup)
    stderr_log.parent.mkdir(parents=True, exist_ok=True)
    with open(stderr_log, "w", encoding="utf-8") as errors:  # the command keeps its own copy of the file
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errors, text=True, env=env, preexec_fn=child_setup)


def run_command(argv: List[str], log: Path, *, env: Optional[Dict[str, str]] = None, stderr_log: Optional[Path] = None,
                timeout: Optional[float] = None, append: bool = False, header: str = "",
                on_line: Callable[[str], None] = _ignore, machine: Optional[SharedMachine] = None,
                child_setup: Optional[Callable[[], None]] = None) -> Finished:
    """Run ``argv`` to its end: ``header``, then each line of its output as it comes, written to ``log``
    (appended to it with ``append``) and handed to ``on_line``.

    Its error output goes into the same log unless ``stderr_log`` is given. It runs with ``env`` (default:
    this process's environment), or in a job slot of ``machine`` (its output always into the one log).
    ``child_setup`` runs in the child before the command. Past ``timeout`` seconds it is killed. Interrupted (Ctrl-C, kill), it ends the command before
    raising. A command that cannot start raises OSError.
    """
    started = time.perf_counter()
    log.parent.mkdir(parents=True, exist_ok=True)
    # line-buffered: a command killed with the machine (the study between sittings) otherwise loses its
    # log's last few kB, e.g. an epoch's validation line
    with open(log, "a" if append else "w", buffering=1, encoding="utf-8") as out:
        out.write(header)
        proc = machine.launch(argv) if machine else start(argv, env, stderr_log, child_setup)
        expired = threading.Event()
        timer = threading.Timer(timeout, lambda: (expired.set(), proc.kill())) if timeout else None
        try:
            if timer:
                timer.start()
            for line in proc.stdout:
                out.write(line)
                on_line(line)
            status = proc.wait()
        except BaseException:  # the runner interrupted: leave no command behind
            proc.terminate()
            raise
        finally:
            if timer:
                timer.cancel()
            proc.stdout.close()
            if machine:
                machine.finished(proc)
    # one that ended by itself just as its time ran out keeps its exit status
    return Finished(None if expired.is_set() and status != 0 else status, time.perf_counter() - started)
