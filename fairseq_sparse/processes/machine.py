"""The machine the table runner's ``--jobs`` share: each job's cores and GPUs, commands stopped while
a measured step runs alone, and nothing left behind when the runner is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from contextlib import contextmanager
from typing import Dict, List


def visible_gpus() -> List[str]:
    """The GPUs jobs may be given: those CUDA_VISIBLE_DEVICES names if set, else every one torch sees."""
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        return [d.strip() for d in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


class SharedMachine:
    """The commands running side by side (``--jobs``), stopped while a measured step has the machine.

    Each job slot gets its share of the cores (OMP_NUM_THREADS: two 2-thread trainings on 2 cores run
    ~7x slower each) and of the GPUs, a contiguous block of them (CUDA_VISIBLE_DEVICES; with more
    jobs than GPUs, jobs share one)."""

    def __init__(self, jobs: int):
        self.threads = max(1, len(os.sched_getaffinity(0)) // jobs)
        gpus = visible_gpus()
        self._free: List[dict] = []  # one environment per job slot not in use
        for slot in range(jobs):
            env = {**os.environ, "OMP_NUM_THREADS": str(self.threads), "MKL_NUM_THREADS": str(self.threads)}
            if gpus:
                block = gpus[slot * len(gpus) // jobs:(slot + 1) * len(gpus) // jobs] or [gpus[slot % len(gpus)]]
                env["CUDA_VISIBLE_DEVICES"] = ",".join(block)
            self._free.append(env)
        self._running: Dict[subprocess.Popen, dict] = {}
        self._paused = False
        self._resumed = threading.Condition()

    def launch(self, argv: List[str]) -> subprocess.Popen:
        with self._resumed:
            # nothing starts while a measured step runs; a slot is free (the pool runs at most `jobs`)
            self._resumed.wait_for(lambda: not self._paused and self._free)
            env = self._free.pop(0)
            try:
                proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
            except BaseException:
                self._free.append(env)
                raise
            self._running[proc] = env
            return proc

    def finished(self, proc: subprocess.Popen) -> None:
        with self._resumed:
            self._free.append(self._running.pop(proc))
            self._resumed.notify_all()

    @contextmanager
    def alone(self):
        """Stop every running command (SIGSTOP) for the duration: a decode's tokens/s and an
        analysis are measured on an otherwise idle machine, as in a run of one job."""
        with self._resumed:
            self._paused = True
            for proc in self._running:
                proc.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            with self._resumed:
                for proc in self._running:
                    proc.send_signal(signal.SIGCONT)
                self._paused = False
                self._resumed.notify_all()

    def stop_all(self) -> None:
        """End every running command, stopped ones included (they would otherwise outlive the runner)."""
        with self._resumed:
            for proc in self._running:
                proc.send_signal(signal.SIGCONT)
                proc.terminate()


@contextmanager
def sigterm_as_exit():
    """`kill RUNNER` unwinds like Ctrl-C, so the commands it started end with it instead of running on
    (or staying stopped) without it."""
    def exit_(signum, frame):
        raise SystemExit(128 + signum)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, exit_)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
