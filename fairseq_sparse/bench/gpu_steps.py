"""Running the GPU report's steps: the two done in-process (the environment, the synthetic data) and
every command, through the runner the table runner uses too (``processes.command``). A step never
raises: how it went is recorded on it, and the report goes on."""

import os
import platform
import random
import shlex
from pathlib import Path
from typing import Dict, List

import torch

import fairseq_sparse
from fairseq_sparse.bench.gpu_checks import last_error
from fairseq_sparse.bench.gpu_plan import PACKAGE_PARENT, VALID_PAIRS, ReportStep
from fairseq_sparse.processes.command import run_command

WORDS = 40  # word types of the synthetic copy task


def subprocess_env(step: ReportStep) -> Dict[str, str]:
    """This process's environment, the plugin first on PYTHONPATH, output unbuffered, then the step's own."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_PARENT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["PYTHONUNBUFFERED"] = "1"
    env.update(step.env)
    return env


def run_step(step: ReportStep, logs: Path) -> None:
    """Run the step's command: its output in ``logs``/SLUG.log (error output in SLUG.stderr.log) and on the step."""
    stdout: List[str] = []
    stderr_log = logs / f"{step.slug}.stderr.log"
    try:
        finished = run_command(step.command, logs / f"{step.slug}.log", env=subprocess_env(step), stderr_log=stderr_log,
                               timeout=step.timeout, header=f"$ {shlex.join(step.command)}\n\n", on_line=stdout.append)
    except OSError as err:  # e.g. no such interpreter: the step failed, the report goes on
        step.returncode = None
        stderr_log.write_text(str(err), encoding="utf-8")
    else:
        step.returncode = finished.returncode
        step.seconds += finished.seconds
        if finished.timed_out:
            step.note = f"timed out after {step.timeout:.0f} s"
    step.stdout = "".join(stdout)
    step.stderr = stderr_log.read_text(encoding="utf-8", errors="replace")
    step.status = "ok" if step.returncode == 0 else "FAILED"
    if step.returncode not in (0, None) and not step.note:
        step.note = f"exit {step.returncode}: {last_error(step)}"


def write_data(work: Path, pairs: int) -> None:
    """A synthetic copy-task bitext (raw text) under ``work``/data/raw."""
    raw = work / "data" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    rng = random.Random(1)
    words = [f"w{i}" for i in range(WORDS)]
    for split, count in (("train", pairs), ("valid", VALID_PAIRS)):
        sentences = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 15))) for _ in range(count)]
        for lang in ("src", "tgt"):  # a copy task: the loss falls within a few updates
            (raw / f"{split}.{lang}").write_text("\n".join(sentences) + "\n")


def environment(step: ReportStep) -> None:
    """Record the device and the versions, as a Markdown list in the step's output."""
    import fairseq
    import numpy

    cuda = torch.cuda.is_available()
    info = {
        "device": torch.cuda.get_device_name(0) if cuda else "no CUDA device",
        "compute capability": ".".join(map(str, torch.cuda.get_device_capability(0))) if cuda else "-",
        "CUDA devices": str(torch.cuda.device_count()),
        "torch": torch.__version__,
        "CUDA (torch build)": str(torch.version.cuda),
        "cuDNN": str(torch.backends.cudnn.version()),
        "fairseq": getattr(fairseq, "__version__", "?"),
        "fairseq-sparse": fairseq_sparse.__version__,
        "numpy": numpy.__version__,
        "Python": platform.python_version(),
        "platform": platform.platform(),
        "CPU cores": str(os.cpu_count()),
    }
    step.stdout = "\n".join(f"* {k}: {v}" for k, v in info.items())
    step.status = "ok"
