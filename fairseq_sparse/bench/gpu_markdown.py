"""The GPU report's Markdown file: the device, a table of the steps, the training check, each benchmark's
tables, the end of each failed step's output and the plan. Written whole after every step."""

import datetime
import re
import shlex
import sys
from pathlib import Path
from typing import List

from fairseq_sparse.bench.gpu_plan import PRECISIONS, TINY_MODEL, ReportStep, format_plan, row_placement

# Lines of the scripts' logging (kept in the logs, left out of the report).
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d|USDT:|INFO:|WARNING:|Please install tensorboardX)")
SECTIONS = {
    "equality": "## CUDA vs CPU outputs (fairseq_sparse.bench.cuda_equality)",
    "operations": "## Hard Retrieval Table 2: one decoding step's operations (fairseq_sparse.bench.operations)",
    "memory": "## Peak memory of one self-attention sublayer (fairseq_sparse.bench.memory)",
    "run": "## Throughput vs stock fairseq and softmax (fairseq_sparse.bench.run)",
}
FAILURE_TAIL = 30  # lines of a failed step's output in the report (all of it is in logs.tar.gz)


def report_output(text: str) -> str:
    """A script's stdout without its logging lines, its headings one level down (under the report's)."""
    kept = ["#" + line if line.startswith("#") else line for line in text.splitlines() if not LOG_LINE.match(line)]
    return "\n".join(kept).strip()


def cell(text: str) -> str:
    """Text in a table cell: a '|' would end the cell."""
    return text.replace("|", "/")


def training_cells(step: ReportStep) -> str:
    """First → last loss and the verdict of one training run."""
    losses = f"{step.losses[0]:.3f} → {step.losses[-1]:.3f}" if len(step.losses) >= 2 else "-"
    verdict = "ok" if step.status == "ok" else f"**{step.status}** {step.note}".strip()
    return f"{losses} | {cell(verdict)}"


def training_table(steps: List[ReportStep], updates: int) -> List[str]:
    """One line per row, one pair of columns per precision: the losses and whether the run passed."""
    train = [s for s in steps if s.group == "train"]
    if not train:
        return []
    rows = list(dict.fromkeys(s.row for s in train))
    precisions = [p for p in PRECISIONS if any(s.precision == p for s in train)]
    by_key = {(s.row, s.precision): s for s in train}
    lines = [
        "## fairseq-train in half precision",
        "",
        f"Real `fairseq-train` (`python -m fairseq_cli.train`), {TINY_MODEL[1]} with d_model 64, a synthetic copy task, "
        f"{updates} updates, loss logged every update. Pass: exit 0, every logged loss finite, last < first.",
        "",
        "| row | attention in | " + " | ".join(f"--{p} first → last loss | --{p}" for p in precisions) + " |",
        "|---|---|" + "---:|---|" * len(precisions),
    ]
    for row in rows:
        cells = [training_cells(by_key[(row, p)]) if (row, p) in by_key else "- | -" for p in precisions]
        lines.append(f"| {row} | {row_placement(row)} | " + " | ".join(cells) + " |")
    return lines + [""]


def summary(steps: List[ReportStep], started: datetime.datetime, finished: bool) -> List[str]:
    """The report's head: when, which command, the result so far and the environment."""
    failed = [s for s in steps if s.status == "FAILED"]
    done = [s for s in steps if s.status != "not run"]
    skipped = len(steps) - len(done)
    state = ("all {} steps passed".format(len(steps)) if finished and not failed and not skipped else
             f"{len(failed)} of {len(steps)} steps FAILED" + (f", {skipped} not run" if skipped else "") if finished else
             f"IN PROGRESS or cut short: {len(done)} of {len(steps)} steps done, {len(failed)} failed")
    lines = [
        "# fairseq-sparse GPU report",
        "",
        f"* generated: {started:%Y-%m-%d %H:%M:%S} (UTC{started.astimezone().strftime('%z')}), "
        f"{(datetime.datetime.now() - started).total_seconds():.0f} s",
        f"* command: `{shlex.join([sys.executable, *sys.argv])}`",
        f"* result: {state}",
    ]
    env = next((s for s in steps if s.group == "environment"), None)
    if env is not None and env.stdout:
        lines.append(env.stdout)
    return lines


def steps_table(steps: List[ReportStep]) -> List[str]:
    lines = ["", "## Steps", "", "| step | status | seconds | note |", "|---|---|---:|---|"]
    for s in steps:
        lines.append(f"| {s.name} | {s.status if s.status != 'FAILED' else '**FAILED**'} | {s.seconds:.1f} | {cell(s.note)} |")
    return lines + [""]


def benchmark_sections(steps: List[ReportStep]) -> List[str]:
    """Each benchmark's command and the tables it printed."""
    lines = []
    for group, title in SECTIONS.items():
        group_steps = [s for s in steps if s.group == group]
        if not group_steps:
            continue
        lines += [title, ""]
        for s in group_steps:
            lines += [f"`python {shlex.join(s.command[1:])}`" if s.command else "", ""]
            output = report_output(s.stdout)
            if s.status == "not run":
                lines += ["not run", ""]
            elif output:
                lines += [output, ""]
            if s.status == "FAILED":
                lines += [f"**FAILED**: {s.note}", ""]
    return lines


def failures(steps: List[ReportStep]) -> List[str]:
    failed = [s for s in steps if s.status == "FAILED"]
    if not failed:
        return []
    lines = ["## Failures: the end of each failed step's output", ""]
    for s in failed:
        tail = "\n".join((s.stdout + "\n" + s.stderr).strip().splitlines()[-FAILURE_TAIL:])
        lines += [f"### {s.name}", "", f"{s.note}", "", "```", tail.replace("```", "'''"), "```", ""]
    return lines


def write_report(path: Path, steps: List[ReportStep], started: datetime.datetime, finished: bool, updates: int,
                 work: Path) -> None:
    """Write the whole report to ``path`` by rename: a reader (or a run cut short) never sees half of it."""
    lines = (summary(steps, started, finished) + steps_table(steps) + training_table(steps, updates)
             + benchmark_sections(steps) + failures(steps)
             + ["## Plan", "", "```", format_plan(steps, work, path), "```", ""])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("\n".join(lines))
    tmp.replace(path)
