#!/usr/bin/env python
"""One-command GPU report: half-precision training, CUDA vs CPU outputs, speed and memory, in one Markdown file.

On a machine with a CUDA device it runs, in this order:

1. environment: the device (``torch.cuda.get_device_name``), torch, CUDA, fairseq,
   fairseq-sparse, numpy and Python versions;
2. data: a tiny synthetic copy-task bitext, binarised with ``fairseq-preprocess``
   (``python -m fairseq_cli.preprocess``);
3. train: for every registered attention function (placed where its paper puts it, as
   ``fairseq_sparse.bench.common.placement`` says), for L0Drop and for L0Drop with
   ``--l0drop-every-layer``, a few updates of real ``fairseq-train``
   (``python -m fairseq_cli.train``) with ``--fp16`` and with ``--bf16``; a run passes if it
   exits 0, every logged training loss is finite and the last logged loss is below the
   first. These runs go ``--jobs`` at a time (tiny models share the GPU);
4. equality: ``fairseq_sparse.bench.cuda_equality``: CPU vs CUDA logits of the same weights per
   function (eval mode, float32);
5. operations: ``fairseq_sparse.bench.operations --device cuda`` (Hard Retrieval, Table 2);
6. memory: ``fairseq_sparse.bench.memory --device cuda --lengths 512 1024 2048 4096``, bidirectional and
   ``--causal``, every registered function and stock fairseq;
7. run: ``fairseq_sparse.bench.run --device cuda`` at the papers' decoding settings (beam 4;
   batch 1 and batch 128) with ``--long-lengths 512 1024 2048 4096``, its CSV beside the report.

It writes ONE Markdown report (``--out``, default runs/gpu-report/REPORT.md), rewritten
after every step so that a run cut short still leaves one, plus ``speed.csv`` (run.py's
CSV) and ``logs.tar.gz`` (every step's full output) beside it. A failed step is recorded
in the report and the run goes on; the exit status is 1 if any step failed.

Without a CUDA device it says so, prints the plan (every command it would run) and exits
0. ``--dry-run`` prints the plan on any machine.

    bash scripts/gpu-report.sh                       # = python -m fairseq_sparse.bench.gpu_report
    bash scripts/gpu-report.sh --dry-run
    bash scripts/gpu-report.sh --out $OUT/REPORT.md --only environment data train
"""

import argparse
import concurrent.futures
import datetime
import json
import math
import os
import platform
import random
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import torch

import fairseq_sparse
from fairseq_sparse.attention import attention_names, get_attention
from fairseq_sparse.bench.common import placement

# the directory holding this package (a checkout or site-packages): every step imports the same plugin
PACKAGE_PARENT = Path(fairseq_sparse.__file__).resolve().parents[1]

GROUPS = ("environment", "data", "train", "equality", "operations", "memory", "run")
PRECISIONS = ("fp16", "bf16")
# The L0Drop rows of the training check: (row, fairseq-train options). Both train with the L0 criterion.
L0DROP_ROWS = {
    "l0drop": ["--l0drop", "--criterion", "label_smoothed_cross_entropy_l0drop", "--label-smoothing", "0.1",
               "--l0-lambda", "0.3"],
    "l0drop_every_layer": ["--l0drop", "--l0drop-every-layer", "--criterion", "label_smoothed_cross_entropy_l0drop",
                           "--label-smoothing", "0.1", "--l0-lambda", "0.3"],
}
TINY_MODEL = ["--arch", "transformer_sparse_mini", "--encoder-embed-dim", "64", "--decoder-embed-dim", "64",
              "--encoder-ffn-embed-dim", "128", "--decoder-ffn-embed-dim", "128", "--encoder-attention-heads", "4",
              "--decoder-attention-heads", "4", "--share-all-embeddings"]
# The papers' decoding settings: beam 4, batch 1 (run.py's decode1 job) and batch 128.
RUN_OPTIONS = ["--device", "cuda", "--arch", "transformer_sparse", "--beam", "4", "--batch-size", "128",
               "--long-lengths", "512", "1024", "2048", "4096"]
# Document lengths: where top-k and the patterns gather their keys (modules/gathered_attention.py).
MEMORY_LENGTHS = ["512", "1024", "2048", "4096"]
# Lines of the scripts' logging (kept in the logs, left out of the report).
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d|USDT:|INFO:|WARNING:|Please install tensorboardX)")


@dataclass
class Step:
    name: str
    group: str
    describe: str
    command: Optional[List[str]] = None
    timeout: float = 600.0
    env: Dict[str, str] = field(default_factory=dict)
    row: str = ""
    precision: str = ""
    status: str = "not run"  # ok | FAILED | not run
    seconds: float = 0.0
    returncode: Optional[int] = None
    stdout: str = ""
    stderr: str = ""
    note: str = ""
    losses: List[float] = field(default_factory=list)

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", self.name)


def train_rows() -> Dict[str, List[str]]:
    """fairseq-train options choosing each row's attention: every registered function, then the L0Drop rows."""
    rows = {}
    for fn in attention_names():
        spec = get_attention(fn)
        options = [f"--{sublayer}-attn-fn={fn}" for sublayer in placement(fn, spec.self_attention_only)]
        rows[fn] = options + ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]
    rows.update(L0DROP_ROWS)
    return rows


def row_placement(row: str) -> str:
    if row in L0DROP_ROWS:
        return "softmax everywhere, " + ("gates after every encoder layer" if "every" in row else "gates on encoder outputs")
    return "+".join(placement(row, get_attention(row).self_attention_only))


def build_plan(args, work: Path, report_dir: Path) -> List[Step]:
    python = sys.executable
    data = work / "data"
    steps = [Step("environment", "environment",
                  "(in-process) torch.cuda.get_device_name(0); torch, CUDA, cuDNN, fairseq, fairseq-sparse, numpy and "
                  "Python versions")]
    steps.append(Step("data", "data",
                      f"(in-process) write a synthetic copy-task bitext ({args.train_pairs} train / 40 valid pairs, "
                      f"40 word types) to {data}/raw, then:",
                      command=[python, "-m", "fairseq_cli.preprocess", "--source-lang", "src", "--target-lang", "tgt",
                               "--trainpref", str(data / "raw" / "train"), "--validpref", str(data / "raw" / "valid"),
                               "--destdir", str(data / "bin"), "--joined-dictionary", "--workers", "1"]))
    for row, options in train_rows().items():
        for precision in PRECISIONS:
            # fairseq 0.12's own entry point reads --bf16 as "on a TPU": bfloat16 runs go through the plugin's
            trainer = "fairseq_sparse.train" if precision == "bf16" else "fairseq_cli.train"
            command = [python, "-m", trainer, str(data / "bin"), "--user-dir", str(PACKAGE_PARENT / "fairseq_sparse"),
                       *TINY_MODEL, *options, "--optimizer", "adam", "--lr", "0.002", "--max-tokens", "1000",
                       "--max-update", str(args.train_updates), "--no-save", "--disable-validation",
                       "--log-format", "json", "--log-interval", "1", "--seed", "1", "--num-workers", "0",
                       f"--{precision}"]
            steps.append(Step(f"train {row} {precision}", "train", f"fairseq-train, {row}, --{precision}:",
                              command=command, timeout=args.step_timeout, env={"OMP_NUM_THREADS": "1"},
                              row=row, precision=precision))
    steps.append(Step("equality", "equality", "CPU vs CUDA logits of the same weights, per function:",
                      command=[python, "-m", "fairseq_sparse.bench.cuda_equality", "--device", "cuda"],
                      timeout=args.step_timeout))
    steps.append(Step("operations", "operations", "Hard Retrieval Table 2, per-operation times:",
                      command=[python, "-m", "fairseq_sparse.bench.operations", "--device", "cuda"], timeout=args.step_timeout))
    for causal in (False, True):
        steps.append(Step("memory causal" if causal else "memory", "memory",
                          f"peak memory, {'decoder (causal)' if causal else 'encoder'} self-attention:",
                          command=[python, "-m", "fairseq_sparse.bench.memory", "--device", "cuda", "--lengths", *MEMORY_LENGTHS,
                                   "--functions", *attention_names()] + (["--causal"] if causal else []),
                          timeout=args.step_timeout))
    steps.append(Step("run", "run", "train / decode throughput vs stock fairseq and softmax:",
                      command=[python, "-m", "fairseq_sparse.bench.run", *RUN_OPTIONS, "--csv", str(report_dir / "speed.csv")],
                      timeout=args.run_timeout))
    return [s for s in steps if s.group in args.only or s.group == "environment"]  # the report always names the device


def format_plan(steps: List[Step], work: Path, out: Path) -> str:
    lines = [f"plan: {len(steps)} steps, plugin from {PACKAGE_PARENT}; report {out}; data and logs under {work}"]
    for i, step in enumerate(steps, 1):
        lines.append(f"{i:3d}. [{step.group}] {step.name}: {step.describe}")
        if step.command:
            env = "".join(f"{k}={v} " for k, v in step.env.items())
            lines.append(f"       {env}{shlex.join(step.command)}")
    return "\n".join(lines)


# ---------------------------------------------------------------- running


def subprocess_env(step: Step) -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_PARENT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["PYTHONUNBUFFERED"] = "1"
    env.update(step.env)
    return env


def run_command(step: Step, logs: Path) -> None:
    start = time.perf_counter()
    try:
        result = subprocess.run(step.command, env=subprocess_env(step), capture_output=True, text=True,
                                timeout=step.timeout)
        step.returncode, step.stdout, step.stderr = result.returncode, result.stdout, result.stderr
    except subprocess.TimeoutExpired as err:
        step.returncode = None
        step.stdout = err.stdout.decode(errors="replace") if isinstance(err.stdout, bytes) else (err.stdout or "")
        step.stderr = err.stderr.decode(errors="replace") if isinstance(err.stderr, bytes) else (err.stderr or "")
        step.note = f"timed out after {step.timeout:.0f} s"
    except OSError as err:
        step.returncode, step.stderr = None, str(err)
    step.seconds += time.perf_counter() - start
    (logs / f"{step.slug}.log").write_text(f"$ {shlex.join(step.command)}\n\n--- stdout ---\n{step.stdout}\n"
                                           f"--- stderr ---\n{step.stderr}\n")
    step.status = "ok" if step.returncode == 0 else "FAILED"
    if step.returncode not in (0, None) and not step.note:
        step.note = f"exit {step.returncode}: {last_error(step)}"


def last_error(step: Step) -> str:
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


def check_training(step: Step) -> None:
    step.losses = logged_losses(step.stdout + "\n" + step.stderr)
    output = step.stdout + step.stderr
    if step.status == "ok":
        if len(step.losses) < 2:
            step.status, step.note = "FAILED", f"{len(step.losses)} training loss(es) logged, need 2"
        elif not all(math.isfinite(x) for x in step.losses):
            step.status, step.note = "FAILED", "a logged loss is not finite"
        elif not step.losses[-1] < step.losses[0]:
            step.status, step.note = "FAILED", f"loss did not fall ({step.losses[0]:.3f} -> {step.losses[-1]:.3f})"
    if step.status != "ok" and ("get_tpu_device" in output or "torch_xla" in output):
        step.note += ("; fairseq 0.12.3's options.py turns --bf16 into --tpu, so fairseq-train --bf16 looks for "
                      "torch_xla instead of using the GPU")


def write_data(step: Step, work: Path, pairs: int) -> None:
    raw = work / "data" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    rng = random.Random(1)
    words = [f"w{i}" for i in range(40)]
    for split, count in (("train", pairs), ("valid", 40)):
        sentences = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 15))) for _ in range(count)]
        for lang in ("src", "tgt"):  # a copy task: the loss falls within a few updates
            (raw / f"{split}.{lang}").write_text("\n".join(sentences) + "\n")


def environment(step: Step) -> None:
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


# ---------------------------------------------------------------- report


def report_output(text: str) -> str:
    """A script's stdout without its logging lines, its headings one level down (under the report's)."""
    kept = ["#" + line if line.startswith("#") else line for line in text.splitlines() if not LOG_LINE.match(line)]
    return "\n".join(kept).strip()


def training_table(steps: List[Step], updates: int) -> List[str]:
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
        cells = []
        for p in precisions:
            s = by_key.get((row, p))
            if s is None:
                cells.append("- | -")
                continue
            losses = f"{s.losses[0]:.3f} → {s.losses[-1]:.3f}" if len(s.losses) >= 2 else "-"
            verdict = "ok" if s.status == "ok" else f"**{s.status}** {s.note}".strip()
            cells.append(f"{losses} | {verdict.replace('|', '/')}")
        lines.append(f"| {row} | {row_placement(row)} | " + " | ".join(cells) + " |")
    return lines + [""]


SECTIONS = {
    "equality": "## CUDA vs CPU outputs (fairseq_sparse.bench.cuda_equality)",
    "operations": "## Hard Retrieval Table 2: one decoding step's operations (fairseq_sparse.bench.operations)",
    "memory": "## Peak memory of one self-attention sublayer (fairseq_sparse.bench.memory)",
    "run": "## Throughput vs stock fairseq and softmax (fairseq_sparse.bench.run)",
}


def write_report(path: Path, steps: List[Step], args, started: datetime.datetime, finished: bool) -> None:
    env = next((s for s in steps if s.group == "environment"), None)
    failed = [s for s in steps if s.status == "FAILED"]
    done = [s for s in steps if s.status != "not run"]
    state = ("all {} steps passed".format(len(steps)) if finished and not failed else
             f"{len(failed)} of {len(steps)} steps FAILED" if finished else
             f"IN PROGRESS or cut short: {len(done)} of {len(steps)} steps done, {len(failed)} failed")
    lines = [
        "# fairseq-sparse GPU report",
        "",
        f"* generated: {started:%Y-%m-%d %H:%M:%S} (UTC{started.astimezone().strftime('%z')}), "
        f"{(datetime.datetime.now() - started).total_seconds():.0f} s",
        f"* command: `{shlex.join([sys.executable, *sys.argv])}`",
        f"* result: {state}",
    ]
    if env is not None and env.stdout:
        lines.append(env.stdout)
    lines += ["", "## Steps", "", "| step | status | seconds | note |", "|---|---|---:|---|"]
    for s in steps:
        lines.append(f"| {s.name} | {s.status if s.status != 'FAILED' else '**FAILED**'} | {s.seconds:.1f} | "
                     f"{s.note.replace('|', '/')} |")
    lines.append("")
    lines += training_table(steps, args.train_updates)
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
    if failed:
        lines += ["## Failures: the end of each failed step's output", ""]
        for s in failed:
            tail = "\n".join((s.stdout + "\n" + s.stderr).strip().splitlines()[-30:])
            lines += [f"### {s.name}", "", f"{s.note}", "", "```", tail.replace("```", "'''"), "```", ""]
    lines += ["## Plan", "", "```", format_plan(steps, args.work_dir, path), "```", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("\n".join(lines))
    tmp.replace(path)


def execute(steps: List[Step], args, out: Path) -> int:
    work, logs = args.work_dir, args.work_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now()
    lock = threading.Lock()
    total = len(steps)
    counter = [0]

    def finish(step: Step) -> None:
        with lock:
            counter[0] += 1
            print(f"[{counter[0]}/{total}] {step.name}: {step.status} ({step.seconds:.1f} s)"
                  + (f" {step.note}" if step.note else ""), flush=True)
            write_report(out, steps, args, started, finished=False)

    data_ok = True
    for step in [s for s in steps if s.group in ("environment", "data")]:
        if step.group == "environment":
            environment(step)
        else:
            write_data(step, work, args.train_pairs)
            run_command(step, logs)
            data_ok = step.status == "ok"
        finish(step)

    train = [s for s in steps if s.group == "train"]
    if train and not data_ok:
        for step in train:
            step.status, step.note = "FAILED", "not run: the data step failed"
            finish(step)
    elif train:
        if not any(s.group == "data" for s in steps) and not (work / "data" / "bin").is_dir():
            for step in train:
                step.status, step.note = "FAILED", f"not run: no data in {work / 'data' / 'bin'} (run the data step)"
                finish(step)
        else:
            def train_one(step: Step) -> None:
                run_command(step, logs)
                check_training(step)
                finish(step)

            with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
                list(pool.map(train_one, train))

    for step in [s for s in steps if s.group not in ("environment", "data", "train")]:
        run_command(step, logs)
        finish(step)

    write_report(out, steps, args, started, finished=True)
    with tarfile.open(out.parent / "logs.tar.gz", "w:gz") as tar:
        tar.add(logs, arcname="logs")
    if args.temporary_work_dir:
        shutil.rmtree(work, ignore_errors=True)
    failed = [s.name for s in steps if s.status != "ok"]
    print(f"\nreport: {out}" + (f"\n{len(failed)} step(s) failed: {', '.join(failed)}" if failed else "\nall steps passed"))
    return 1 if failed else 0


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs") / "gpu-report" / "REPORT.md",
                        help="the Markdown report; speed.csv and logs.tar.gz go beside it (default: %(default)s)")
    parser.add_argument("--work-dir", type=Path,
                        help="data set and logs, kept (default: a new folder under the system's temporary directory, "
                             "removed at the end)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan (every command) and exit")
    parser.add_argument("--only", nargs="+", choices=GROUPS, default=list(GROUPS), metavar="GROUP",
                        help=f"run only these groups of steps: {', '.join(GROUPS)} (default: all; the environment "
                             "is always recorded)")
    parser.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1),
                        help="fairseq-train runs at a time (default: %(default)s)")
    parser.add_argument("--train-updates", type=int, default=30, help="updates per fairseq-train run (default: %(default)s)")
    parser.add_argument("--train-pairs", type=int, default=400, help="sentence pairs of the synthetic training set")
    parser.add_argument("--step-timeout", type=float, default=600, help="seconds before a step is stopped (default: %(default)s)")
    parser.add_argument("--run-timeout", type=float, default=1800, help="seconds before run.py is stopped (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.train_updates < 2:
        parser.error("--jobs must be positive and --train-updates at least 2")
    args.out = args.out.resolve()
    args.temporary_work_dir = args.work_dir is None  # removed at the end (the logs are packed beside the report)
    if args.work_dir is None:
        args.work_dir = Path(tempfile.gettempdir()) / f"fairseq-sparse-gpu-report-{os.getpid()}"
    args.work_dir = args.work_dir.resolve()
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    steps = build_plan(args, args.work_dir, args.out.parent)
    if args.dry_run:
        print(format_plan(steps, args.work_dir, args.out))
        return 0
    if not torch.cuda.is_available():
        print(f"gpu-report: no CUDA device is present (torch {torch.__version__}, CUDA build "
              f"{torch.version.cuda or 'none'}): nothing was run and no report was written. "
              f"On a machine with a CUDA device this would run:\n")
        print(format_plan(steps, args.work_dir, args.out))
        return 0
    if args.work_dir.exists() and any(s.group == "data" for s in steps):
        shutil.rmtree(args.work_dir / "data", ignore_errors=True)
    return execute(steps, args, args.out)


if __name__ == "__main__":
    sys.exit(main())
