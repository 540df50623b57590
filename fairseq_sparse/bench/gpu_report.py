#!/usr/bin/env python
"""One-command GPU report: half-precision training, CUDA vs CPU outputs, speed and memory, in one Markdown file.

On a machine with a CUDA device it runs, in this order:

1. environment: the device (``torch.cuda.get_device_name``), torch, CUDA, fairseq,
   fairseq-sparse, numpy and Python versions;
2. data: a tiny synthetic copy-task bitext, binarised with ``fairseq-preprocess``
   (``python -m fairseq_cli.preprocess``);
3. train: for every registered attention function (placed where its paper puts it, as
   ``AttentionSpec.sublayers`` in the registry says), for L0Drop and for L0Drop with
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
    bash scripts/gpu-report.sh --profile speed --budget 540   # the users' regime in bf16 -> results/bench/gpu_<device>_bf16.md

The plan is ``gpu_plan``, running a step ``gpu_steps``, the training check ``gpu_checks`` and the
Markdown ``gpu_markdown``; this module runs the steps in order and parses the command line.
"""

import argparse
import concurrent.futures
import datetime
import os
import re
import shutil
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import List, Optional

import torch

from fairseq_sparse.bench.gpu_checks import check_training
from fairseq_sparse.bench.gpu_markdown import write_report
from fairseq_sparse.bench.common import DTYPES
from fairseq_sparse.bench.gpu_plan import GROUPS, PROFILES, ReportStep, build_plan, format_plan, side_file
from fairseq_sparse.bench.gpu_steps import environment, run_step, write_data


class Progress:
    """Prints each step as it finishes and rewrites the report: a run cut short still leaves one.
    Training steps finish in several threads at once, hence the lock."""

    def __init__(self, steps: List[ReportStep], args: argparse.Namespace):
        self.steps, self.args = steps, args
        self.started = datetime.datetime.now()
        self.count = 0
        self.lock = threading.Lock()

    def report(self, finished: bool) -> None:
        write_report(self.args.out, self.steps, self.started, finished, self.args.train_updates, self.args.work_dir)

    def __call__(self, step: ReportStep) -> None:
        with self.lock:
            self.count += 1
            print(f"[{self.count}/{len(self.steps)}] {step.name}: {step.status} ({step.seconds:.1f} s)"
                  + (f" {step.note}" if step.note else ""), flush=True)
            self.report(finished=False)


def prepare(steps: List[ReportStep], args: argparse.Namespace, done: Progress) -> bool:
    """The environment and data steps; whether the data step (if any) passed."""
    data_ok = True
    for step in [s for s in steps if s.group in ("environment", "data")]:
        if step.group == "environment":
            environment(step)
        else:
            write_data(args.work_dir, args.train_pairs)
            run_step(step, args.work_dir / "logs")
            data_ok = step.status == "ok"
        done(step)
    return data_ok


LAST_WORDS_S = 15.0  # of a --budget, kept for packing the logs and writing the report
SHORTEST_STEP_S = 20.0  # a step with less of the budget left is not started


def within_budget(step: ReportStep, args: argparse.Namespace, started: float) -> bool:
    """Whether ``step`` may start under ``--budget`` (whole seconds of the run); its time limit is cut to what
    is left, so the report is written before a machine lent for a fixed time is taken back."""
    if args.budget is None:
        return True
    left = args.budget - (time.monotonic() - started) - LAST_WORDS_S
    if left < SHORTEST_STEP_S:
        step.status, step.note = "not run", f"the --budget of {args.budget:.0f} s was spent"
        return False
    step.timeout = min(step.timeout, left)
    return True


def train(steps: List[ReportStep], args: argparse.Namespace, data_ok: bool, done: Progress, started: float) -> None:
    """The training steps, ``--jobs`` at a time; none without the data they train on."""
    train_steps = [s for s in steps if s.group == "train"]
    data = args.work_dir / "data" / "bin"
    missing = ("not run: the data step failed" if not data_ok else
               f"not run: no data in {data} (run the data step)"
               if not any(s.group == "data" for s in steps) and not data.is_dir() else "")
    if missing:
        for step in train_steps:
            step.status, step.note = "FAILED", missing
            done(step)
        return

    def train_one(step: ReportStep) -> None:
        if not within_budget(step, args, started):  # each run cut to what is left when it starts
            done(step)
            return
        run_step(step, args.work_dir / "logs")
        check_training(step)
        done(step)

    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(train_one, train_steps))


def execute(steps: List[ReportStep], args: argparse.Namespace) -> int:
    """Run every step, the report rewritten after each; 1 if any failed."""
    started = time.monotonic()
    logs = args.work_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    done = Progress(steps, args)
    train(steps, args, prepare(steps, args, done), done, started)
    for step in [s for s in steps if s.group not in ("environment", "data", "train")]:
        if within_budget(step, args, started):
            run_step(step, logs)
        done(step)
    done.report(finished=True)
    with tarfile.open(args.out.parent / side_file(args, "logs.tar.gz"), "w:gz") as tar:
        tar.add(logs, arcname="logs")
    if args.temporary_work_dir:
        shutil.rmtree(args.work_dir, ignore_errors=True)
    failed = [s.name for s in steps if s.status != "ok"]
    print(f"\nreport: {args.out}" + (f"\n{len(failed)} step(s) failed or not run: {', '.join(failed)}" if failed else "\nall steps passed"))
    return 1 if failed else 0


def device_slug() -> str:
    """The GPU's name for file names: 'NVIDIA H200' -> 'h200'; 'nogpu' without one."""
    if not torch.cuda.is_available():
        return "nogpu"
    name = torch.cuda.get_device_name(0).lower().replace("nvidia", "").strip()
    return re.sub(r"[^a-z0-9]+", "_", name.split()[0] if name else "gpu").strip("_") or "gpu"


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path,
                        help="the Markdown report; speed.csv and logs.tar.gz go beside it; {device} in it is the GPU's "
                             "name, e.g. h200 (default: runs/gpu-report/REPORT.md; with --profile speed: "
                             "results/bench/gpu_{device}_DTYPE.md)")
    parser.add_argument("--profile", choices=PROFILES, default="full",
                        help="full: every step below; speed: the users' regime only (the kernels against the reference in "
                             "float32 and --dtype, training at 512-8,192 tokens vs stock fairseq, decoding vs softmax, "
                             "peak memory; sized for one 10-minute call with --budget 540), written to results/bench "
                             "(default: %(default)s)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16",
                        help="precision of the memory and run benchmarks (default: %(default)s; the training check "
                             "always runs both --fp16 and --bf16)")
    parser.add_argument("--work-dir", type=Path,
                        help="data set and logs, kept (default: a new folder under the system's temporary directory, "
                             "removed at the end)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan (every command) and exit")
    parser.add_argument("--only", nargs="+", choices=GROUPS, metavar="GROUP",
                        help=f"run only these groups of steps: {', '.join(GROUPS)} (default: all; the environment "
                             "is always recorded)")
    parser.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1),
                        help="fairseq-train runs at a time (default: %(default)s)")
    parser.add_argument("--train-updates", type=int, default=30, help="updates per fairseq-train run (default: %(default)s)")
    parser.add_argument("--train-pairs", type=int, default=400, help="sentence pairs of the synthetic training set")
    parser.add_argument("--step-timeout", type=float, default=600, help="seconds before a step is stopped (default: %(default)s)")
    parser.add_argument("--run-timeout", type=float, default=1800, help="seconds before run.py is stopped (default: %(default)s)")
    parser.add_argument("--budget", type=float,
                        help="seconds the whole report may take (a lent machine's time): each step's limit is cut to what is "
                             "left, a step is not started with less than 20 s left, and the report is written within it")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.train_updates < 2:
        parser.error("--jobs must be positive and --train-updates at least 2")
    if args.only is None:
        # the speed profile checks first that the device's paths (kernels, FlexAttention) equal the CPU's
        args.only = ["equality", "memory", "run"] if args.profile == "speed" else list(GROUPS)
    if args.out is None:
        args.out = (Path("results") / "bench" / f"gpu_{{device}}_{args.dtype}.md" if args.profile == "speed"
                    else Path("runs") / "gpu-report" / "REPORT.md")
    args.out = Path(str(args.out).replace("{device}", device_slug())).resolve()
    args.temporary_work_dir = args.work_dir is None  # removed at the end (the logs are packed beside the report)
    if args.work_dir is None:
        args.work_dir = Path(tempfile.gettempdir()) / f"fairseq-sparse-gpu-report-{os.getpid()}"
    args.work_dir = args.work_dir.resolve()
    return args


def main(argv: Optional[List[str]] = None) -> int:
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
    return execute(steps, args)


if __name__ == "__main__":
    sys.exit(main())
