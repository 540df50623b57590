"""Regenerate a paper's table: prepare data, train, average checkpoints, decode, score.

    python -m fairseq_sparse.tables NAME [NAME ...] --profile smoke|paper [--dry-run | --report-only]

NAME is a table shipped with the package (``configs/tables/NAME.yaml``; ``--help`` lists them) or
the path of a YAML file. The table names datasets, rows (models) and columns (measures). Every step
is an ordinary command (a ``fairseq_sparse.data`` module, ``fairseq-train``,
``python -m fairseq_sparse.average_checkpoints``, ``fairseq-generate``, ...), run as a subprocess
and written to ``OUT/commands.sh`` so a run can be read and repeated by hand. Finished steps are
skipped when the table is run again. The result is ``OUT/NAME.md`` and ``OUT/NAME.csv`` with our
numbers beside the paper's (and ``OUT/NAME.png`` if the table has a plot). Outputs go under
``runs/`` in the current directory unless ``--out``/``--data-root``/``--models-root`` say otherwise.
Several NAMEs run as one queue (``runner.execute_tables``): with ``--jobs``, the next table's
trainings start while the last ones of the table before still run.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from fairseq_sparse.experiments.errors import ConfigError, RecordError, StepError
from fairseq_sparse.files import describe_os_error
from fairseq_sparse.experiments.plan import Plan
from fairseq_sparse.experiments.record import Record, fill_from_curves, publish, steps_to_run
from fairseq_sparse.experiments.cells import collect
from fairseq_sparse.experiments.report import write_report
from fairseq_sparse.experiments.dry_run import dry_run
from fairseq_sparse.experiments.runner import TableRun, execute_tables
from fairseq_sparse.experiments import cluster
from fairseq_sparse.experiments.status import print_status
from fairseq_sparse.experiments.resources import resources_for
from fairseq_sparse.processes.slurm import SlurmError

# the options only the Slurm launcher takes
CLUSTER_OPTIONS = ("partition", "account", "qos", "time", "nodes", "gpus", "cpus", "mem", "constraint", "sbatch")
from fairseq_sparse.experiments.schema import PROFILES, load_table, resolve_config, table_names


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fairseq_sparse.tables", description=__doc__.split("\n\n")[0])
    p.add_argument("config", nargs="+", metavar="NAME",
                   help="a table's name (one of: " + ", ".join(table_names()) + ") or a YAML file; several run as one "
                        "queue, in this order")
    p.add_argument("--profile", choices=PROFILES, default="smoke")
    p.add_argument("--out", help="output directory of one table (default runs/tables/NAME/PROFILE)")
    p.add_argument("--data-root", default="runs/data", help="prepared datasets (default: %(default)s)")
    p.add_argument("--raw-data", help="directory with one subdirectory of already-downloaded raw files per dataset id "
                                      "(default: $RAW_DATA; without either, data-prep scripts download)")
    p.add_argument("--models-root", default="runs/models",
                   help="trained models, keyed by their training command so tables share them (default: %(default)s)")
    p.add_argument("--seeds", type=int, nargs="+",
                   help="run only these seeds (the report still counts the other seeds that finished: the setting's "
                        "and those --record keeps)")
    p.add_argument("--rows", nargs="+", metavar="ID",
                   help="run only these rows' commands (and the models they need: the baseline's, a fine-tune's base "
                        "model); of several tables, each table's rows named here (none: nothing of it runs); the report "
                        "shows every row that has finished")
    p.add_argument("--record", metavar="DIR",
                   help="keep every seed's measured cells in DIR/NAME.seeds.csv and a copy of the report in DIR, after "
                        "each finished step; cells recorded from the same commands are read from there and their "
                        "commands not run again (a study over sittings on machines that do not keep runs/)")
    p.add_argument("--jobs", type=int, default=1,
                   help="run this many commands at once (trainings, decodes, analyses), the cores and the visible "
                        "GPUs split between them (OMP_NUM_THREADS, CUDA_VISIBLE_DEVICES); a decode whose time a "
                        "column reads (decode speed, decode time) runs alone, the others stopped meanwhile, so its "
                        "speed is an idle machine's. Training times are then those of a shared machine "
                        "(default: %(default)s)")
    p.add_argument("--dry-run", action="store_true", help="build and parse every command, run nothing")
    p.add_argument("--status", action="store_true",
                   help="run nothing; list each step as done, queued, running, failed (with its log), cancelled, stopped "
                        "or not started, a running step's progress, and how many are left (either launcher)")
    p.add_argument("--launcher", choices=("local", "slurm"), default="local",
                   help="local: run the commands on this machine (--jobs at once); slurm: submit every step as a job "
                        "of a Slurm cluster, with dependencies that follow the plan, and follow them (default: %(default)s)")
    cluster = p.add_argument_group(
        "on a Slurm cluster (--launcher slurm)",
        "Resources per kind of step: prep, train, finish (averaging, decodes, analyses), timed (a decode whose time a "
        "column reads: a node of its own), report. Each option takes VALUE (every kind) or KIND=VALUE, and repeats; "
        "they replace the table YAML's slurm: section, which replaces the profile's defaults (docs/tables.md).")
    for name, meta, what in (("partition", "[KIND=]NAME", "partition"), ("account", "[KIND=]NAME", "account to charge"),
                             ("qos", "[KIND=]NAME", "quality of service"),
                             ("time", "[KIND=]TIME", "time limit (HH:MM:SS or D-HH:MM:SS; a training is requeued "
                                                     "from its last checkpoint at its limit)"),
                             ("nodes", "[KIND=]N", "nodes per job (trainings only)"),
                             ("gpus", "[KIND=]N", "GPUs per node; a training on several GPUs runs one fairseq "
                                                  "process per GPU with --update-freq kept at the setting's tokens per "
                                                  "update"),
                             ("cpus", "[KIND=]N", "CPUs per job and node"), ("mem", "[KIND=]SIZE", "memory per node (e.g. 64G)"),
                             ("constraint", "[KIND=]FEATURES", "node features"),
                             ("sbatch", "[KIND=]--OPTION=VALUE", "any other sbatch option, passed as given (write "
                                                                 "--sbatch=--mail-type=END)")):
        cluster.add_argument(f"--{name}", action="append", metavar=meta, help=what)
    cluster.add_argument("--detach", action="store_true",
                         help="submit and return: a last job writes the reports; --status says where the table stands")
    cluster.add_argument("--poll", type=float, default=30.0, metavar="SECONDS",
                         help="how often the launcher looks at the queue while it follows the jobs (default: %(default)s)")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing; write the report from the commands that have finished (cells count the seeds that did)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    raw = args.raw_data or os.environ.get("RAW_DATA")
    try:
        if args.launcher != "slurm":
            given = [f"--{name}" for name in (*CLUSTER_OPTIONS, "detach") if getattr(args, name)]
            if given or args.poll != 30.0:
                raise ConfigError(f"{(given or ['--poll'])[0]} is an option of the Slurm launcher: add --launcher slurm")
        elif args.jobs != 1:
            raise ConfigError("--jobs is the local runner's: on a cluster every step is a job of its own")
        if args.poll <= 0:
            raise ConfigError(f"--poll must be a positive number of seconds, got {args.poll}")
        if args.out and len(args.config) > 1:
            raise ConfigError(f"--out is one table's folder; {len(args.config)} tables were given (leave --out out)")
        if args.record and Path(args.record).exists() and not Path(args.record).is_dir():
            raise ConfigError(f"--record {args.record}: a file, not a folder (the folder the finished cells are kept in)")
        tables = [load_table(resolve_config(config), args.profile) for config in args.config]
        unknown = sorted(set(args.rows or []) - {r.id for table in tables for r in table.rows})
        if unknown:
            known = "; ".join((f"{t.name}: " if len(tables) > 1 else "") + ", ".join(r.id for r in t.rows) for t in tables)
            raise ConfigError(f"--rows: no row {', '.join(map(repr, unknown))} in {', '.join(t.name for t in tables)} (rows: {known})")
        runs = []
        for table in tables:
            out = Path(args.out) if args.out else Path("runs") / "tables" / table.name / args.profile
            # absolute paths: the commands (and the model directories keyed by them) do not depend on where they run
            plan = Plan(table, out.resolve(), Path(args.data_root).resolve(), Path(raw).expanduser().resolve() if raw else None,
                        args.seeds, Path(args.models_root).resolve())
            record = Record(Path(args.record), table.name) if args.record else None
            if record:
                plan.recorded_seeds = record.seeds()
                fill_from_curves(plan, record)
            steps = plan.steps()
            rows = None if args.rows is None else [r.id for r in table.rows if r.id in args.rows]
            needed = steps_to_run(plan, steps, record, rows) if record or rows is not None else steps
            runs.append((plan, record, TableRun(plan, steps, needed, lambda plan=plan, record=record: report_so_far(plan, record),
                                                listed=plan.steps(every_seed=True))))
        if args.dry_run:
            for plan, _, run in runs:
                dry_run(plan, run.steps)
            return 0
        if args.status:
            return print_status([run for _, _, run in runs])
        unfinished = []
        if args.report_only:
            failures = [set() for _ in runs]
        elif args.launcher == "slurm":
            options = {name: getattr(args, name) for name in CLUSTER_OPTIONS}
            launch = cluster.Launch([resources_for(args.profile, plan.table.slurm, str(plan.table.path), options)
                                     for plan, _, _ in runs], args.poll, args.detach, report_argv(args))
            failures, unfinished = cluster.launch_tables([run for _, _, run in runs], launch)
            if args.detach:
                return 0
        else:
            failures = execute_tables([run for _, _, run in runs], args.jobs)
        reports = []
        for (plan, record, run), failed in zip(runs, failures):
            plan.out.mkdir(parents=True, exist_ok=True)
            results = (collect(plan, finished_only=True, record=record) if args.report_only else
                       collect(plan, failed, record=record, ran={step.output for step in run.needed}))
            reports.append((plan.table, results, write_report(plan, results, record)))
            if record:
                record.save()
                publish(plan, record)
    except (ConfigError, RecordError, StepError, SlurmError) as e:
        print(f"tables: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:   # a full disk, a read-only folder: the path and the system's words, no traceback
        print(f"tables: error: {describe_os_error(e)}", file=sys.stderr)
        return 1
    status = 0
    for label, state, log in unfinished:
        print(f"tables: error: {label}: {state}" + (f"; log: {log}" if state in ("failed", "stopped") else ""),
              file=sys.stderr)
        status = 1
    for table, results, md in reports:
        print()
        print(md.read_text(encoding="utf-8"))
        print(f"written: {md}, {md.with_suffix('.csv')}" + (f", {md.with_suffix('.png')}" if table.plot else ""))
        unexpected = sorted(set(results.failed_rows()) - {r.id for r in table.rows if r.may_fail})
        if unexpected:
            print(f"tables: error: these rows of {table.name} failed: {', '.join(unexpected)} (logs above)", file=sys.stderr)
            status = 1
    return status


def report_argv(args: argparse.Namespace) -> List[str]:
    """The command line that writes the same tables' reports from what finished (a detached launch's last job)."""
    argv = [*args.config, "--profile", args.profile, "--data-root", str(Path(args.data_root).resolve()),
            "--models-root", str(Path(args.models_root).resolve()), "--report-only"]
    if args.out:
        argv += ["--out", str(Path(args.out).resolve())]
    if args.record:
        argv += ["--record", str(Path(args.record).resolve())]
    if args.raw_data or os.environ.get("RAW_DATA"):
        argv += ["--raw-data", str(Path(args.raw_data or os.environ["RAW_DATA"]).expanduser().resolve())]
    if args.rows:
        argv += ["--rows", *args.rows]
    if args.seeds:
        argv += ["--seeds", *map(str, args.seeds)]
    return argv


def report_so_far(plan: Plan, record: Optional[Record]) -> None:
    """The report (and the record) of the steps finished so far: a long run cut short keeps them."""
    if record:
        try:
            write_report(plan, collect(plan, finished_only=True, record=record), record)
            record.save()
            publish(plan, record)
        except (StepError, OSError, ValueError) as e:  # the run goes on; the final report says what is wrong
            print(f"tables: warning: no report of the steps so far: {e}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
