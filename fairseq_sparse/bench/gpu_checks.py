"""What the GPU report reads in a step's output: the error that ended it, and whether a training run trained."""

import json
import math
import re
from typing import List

from fairseq_sparse.bench.gpu_plan import ReportStep

MIN_LOSSES = 2  # a falling loss needs a first and a last


def last_error(step: ReportStep) -> str:
    """The last line naming an error (a traceback's last line), else the last line of output."""
    lines = [line.strip() for line in (step.stderr or step.stdout).splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", line)]
    return (errors or lines or ["no output"])[-1][:300]


def logged_losses(output: str) -> List[float]:
    """The training losses fairseq-train logged (--log-format json), in order."""
    losses = []
    for line in output.splitlines():
        if "| train_inner |" in line:
            try:
                losses.append(float(json.loads(line.split("| train_inner |", 1)[1])["loss"]))
            except (ValueError, KeyError):
                continue
    return losses


def training_problem(losses: List[float]) -> str:
    """Why these logged losses do not show a run that trained ("" if they do)."""
    if len(losses) < MIN_LOSSES:
        return f"{len(losses)} training loss(es) logged, need {MIN_LOSSES}"
    if not all(math.isfinite(x) for x in losses):
        return "a logged loss is not finite"
    if not losses[-1] < losses[0]:
        return f"loss did not fall ({losses[0]:.3f} -> {losses[-1]:.3f})"
    return ""


def check_training(step: ReportStep) -> None:
    """A training step that exited 0 passes only if every logged loss is finite and the last is below the first."""
    output = step.stdout + "\n" + step.stderr
    step.losses = logged_losses(output)
    problem = training_problem(step.losses) if step.status == "ok" else ""
    if problem:
        step.status, step.note = "FAILED", problem
    if step.status != "ok" and ("get_tpu_device" in output or "torch_xla" in output):
        step.note += ("; fairseq 0.12.3's options.py turns --bf16 into --tpu, so fairseq-train --bf16 looks for "
                      "torch_xla instead of using the GPU")
