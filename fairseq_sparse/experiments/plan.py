"""Every command of a table, in order, with where its output goes (nothing is run here)."""

from __future__ import annotations

import hashlib
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from fairseq_sparse.experiments.arguments import merge_args
from fairseq_sparse.experiments.errors import ConfigError
from fairseq_sparse.experiments.heatmap import HEATMAP
from fairseq_sparse.experiments.measures import MEASURES
from fairseq_sparse.experiments.table import Column, Dataset, Row, Table
from fairseq_sparse.experiments.step import Step
from fairseq_sparse.core.models.options import SparseModelOptions

BIN = Path(sys.executable).parent
USER_DIR = str(Path(__file__).resolve().parent.parent)  # the installed package: fairseq-train --user-dir


def tool(name: str) -> List[str]:
    """argv prefix of a pipeline tool: a module of this package, a fairseq console script, or a script path."""
    if name.endswith(".py"):  # a script of the user's (a path)
        return [sys.executable, name]
    if name.startswith("fairseq_sparse."):
        return [sys.executable, "-m", name]
    if name.startswith("fairseq-"):
        return [str(BIN / name)]
    raise ConfigError(f"unknown tool {name!r} in a prep command (expected a fairseq_sparse. module, "
                      "a fairseq- command or a .py script)")


class Plan:
    """Every command of a table, in order, with where its output goes."""

    def __init__(self, table: Table, out: Path, data_root: Path, raw_data: Optional[Path], seeds: Optional[List[int]] = None,
                 models_root: Optional[Path] = None):
        self.table, self.out, self.data_root, self.raw_data = table, out, data_root, raw_data
        # models are keyed by their full training command, so tables that train the same model share it
        self.models_root = (models_root or out / "models") / table.profile
        self.smoke = table.profile == "smoke"
        self.seeds_override = seeds
        # per dataset id, the seeds a --record folder holds cells of (set by the runner): a seed trained in an
        # earlier sitting with --seeds is reported and listed with the others, not only while it runs
        self.recorded_seeds: Dict[str, List[int]] = {}
        self._prunes: Dict[Tuple[str, str], bool] = {}
    # the tools and the plugin the commands run (sources build their commands with these)
    tool = staticmethod(tool)
    user_dir = USER_DIR
    bin = BIN

    # -- per dataset
    def data_dir(self, ds: Dataset) -> Path:
        if self.smoke:  # smoke recipes are shared between datasets and tables: key by the commands
            digest = hashlib.sha1("\n".join(ds.prep).encode()).hexdigest()[:10]
            return self.data_root / "smoke" / digest
        return self.data_root / self.table.profile / ds.id

    def prep_steps(self, ds: Dataset) -> List[Step]:
        out = self.data_dir(ds)
        source = f"--raw {shlex.quote(str(self.raw_data / ds.id))}" if self.raw_data else "--download"
        steps = []
        for i, template in enumerate(ds.prep):
            words = shlex.split(template.replace("{source}", source).replace("{out}", str(out)))
            # tables add different steps after a dataset's own (length groups, gold alignments) in one
            # folder: those are named by their command, so one table's step never passes for another's
            name = f"prep{i}" if i == 0 else f"prep{i}.{hashlib.sha1(template.encode()).hexdigest()[:8]}"
            # a marker written after the command succeeded (fairseq-preprocess writes its dictionary first)
            steps.append(Step("prep", tool(words[0]) + words[1:], out / f".{name}.done",
                              out / f"{name}.log", f"prepare {ds.id} ({i + 1}/{len(ds.prep)})"))
        return steps

    def configured_seeds(self, ds: Dataset) -> List[int]:
        return list((self.table.smoke if self.smoke else ds.setting).get("seeds", ds.setting.get("seeds", [1])))

    def seeds(self, ds: Dataset) -> List[int]:
        """The seeds the table reports: the configured ones, those the record holds and any that --seeds
        adds. A sitting that trains only some seeds still reports (and keeps the curves of) the others
        that finished, in this sitting or an earlier one."""
        recorded = sorted(self.recorded_seeds.get(ds.id, []))
        return list(dict.fromkeys([*self.configured_seeds(ds), *recorded, *(self.seeds_override or [])]))

    def seeds_to_run(self, ds: Dataset) -> List[int]:
        """The seeds whose commands this sitting runs: --seeds, or the configured ones (a seed only the
        record holds runs when --seeds names it: a row added later is not trained for every earlier seed)."""
        return list(self.seeds_override or self.configured_seeds(ds))

    def column_seeds(self, ds: Dataset, col: Column) -> List[int]:
        """The seeds the column is measured on: the dataset's, or its first ``first_seeds`` of them."""
        return self.seeds(ds)[:col.first_seeds]

    def setting(self, ds: Dataset, row: Row) -> dict:
        row = self.trained_row(row)
        return self.table.settings[row.setting] if row.setting else ds.setting

    def averaging(self, ds: Dataset, row: Row) -> dict:
        return dict(self.table.smoke.get("average") if self.smoke else self.setting(ds, row).get("average") or {"last": 1})

    # -- per row
    def trained_row(self, row: Row) -> Row:
        return self.table.row(row.reuse) if row.reuse else row

    def model_key(self, ds: Dataset, row: Row, seed: int) -> Tuple[str, str, int]:
        return ds.id, self.trained_row(row).id, seed

    def train_argv(self, ds: Dataset, row: Row, seed: int) -> List[str]:
        row = self.trained_row(row)
        extra = []
        if row.finetune_from:
            # not --restore-file with --reset-*: fairseq would reload that file at every launch, so a
            # fine-tune cut short restarts from update 0. --finetune-from-model loads it (optimizer,
            # schedule, meters and data order reset) only while the run has no checkpoint_last.pt
            extra = ["--finetune-from-model", str(self.checkpoint(ds, self.table.row(row.finetune_from), seed))]
        if row.continue_from:
            # the base run's own last checkpoint: an averaged one carries an optimizer state that is not its weights'
            base = self.run_dir(ds, self.table.row(row.continue_from), seed) / "checkpoints" / "checkpoint_last.pt"
            extra = ["--continue-from", str(base)]
        argv = merge_args(self.setting(ds, row)["train"], ds.train_args, row.args, (row.args_by_dataset or {}).get(ds.id),
                          self.table.smoke.get("train") if self.smoke else None,
                          drop=self.table.smoke.get("drop", []) if self.smoke else [])
        # {data} in a row's arguments: the prepared dataset's folder (a file a preparation step made there)
        argv = [word.replace("{data}", str(self.data_dir(ds))) for word in argv]
        # fairseq-train reads --bf16 as "on a TPU"; this package's trainer means bfloat16 by it
        trainer = "fairseq_sparse.train" if row.continue_from or "--bf16" in argv else "fairseq-train"
        return [*tool(trainer), str(self.data_dir(ds) / "bin"), "--user-dir", USER_DIR,
                *argv, *extra, "--seed", str(seed)]

    def run_dir(self, ds: Dataset, row: Row, seed: int) -> Path:
        # keyed by what defines the model: the data and the arguments, not where this checkout keeps data and
        # models nor where fairseq and the plugin are installed, so another checkout finds the model by name
        argv = self.train_argv(ds, row, seed)[1:]
        at = argv.index("--user-dir")
        digest = hashlib.sha1(" ".join(map(self.portable, argv[:at] + argv[at + 2:])).encode()).hexdigest()[:12]
        return self.models_root / ds.id / f"{self.trained_row(row).id}-{digest}"

    def portable(self, word: str) -> str:
        """``word`` with the data and models roots of this checkout replaced by placeholders."""
        for root, name in ((self.models_root, "{models}"), (self.data_root, "{data}")):
            if word.startswith(f"{root}/"):
                return name + word[len(str(root)):]
        return word

    def checkpoint(self, ds: Dataset, row: Row, seed: int) -> Path:
        run = self.run_dir(ds, row, seed)
        return run / ("checkpoint_avg.pt" if self.averaging(ds, row).get("last", 1) > 1 else "checkpoints/checkpoint_last.pt")

    def train_steps(self, ds: Dataset, row: Row, seed: int) -> List[Step]:
        if row.reuse:
            return []
        run = self.run_dir(ds, row, seed)
        key = self.model_key(ds, row, seed)
        base = row.finetune_from or row.continue_from
        needs = (self.model_key(ds, self.table.row(base), seed),) if base else ()
        argv = [*self.train_argv(ds, row, seed), "--save-dir", str(run / "checkpoints")]
        steps = [Step("train", argv, run / "train.done", run / "train.log", f"train {row.id} on {ds.id} (seed {seed})",
                      model=key, needs=needs, resumes_from=run / "checkpoints" / "checkpoint_last.pt")]
        avg = self.averaging(ds, row)
        if avg.get("last", 1) > 1:
            steps.append(Step("average", [sys.executable, "-m", "fairseq_sparse.average_checkpoints", str(run / "checkpoints"),
                                          "--last", str(avg["last"]), "--by", avg.get("by", "epoch"),
                                          "--output", str(run / "checkpoint_avg.pt")],
                              run / "checkpoint_avg.pt", run / "average.log", f"average {row.id} on {ds.id} (seed {seed})",
                              model=key, needs=(key,)))
        return steps

    def applies(self, ds: Dataset, row: Row) -> bool:
        return row.datasets is None or ds.id in row.datasets

    def prunes(self, ds: Dataset, row: Row) -> bool:
        """Whether the row's model removes encoder outputs (L0Drop gates or a rule-based pattern): read from
        its model options, once per row."""
        key = (ds.id, row.id)
        if key not in self._prunes:
            self._prunes[key] = SparseModelOptions.from_command_line(self.train_argv(ds, row, 1)).uses_gated_encoder
        return self._prunes[key]

    def generate_args(self, ds: Dataset, row: Row, col: Column) -> List[str]:
        # smoke replaces the paper's decoding defaults, not what a table asks of one row or column (e.g. batch 1)
        return merge_args(self.setting(ds, row).get("generate", ""), self.table.smoke.get("generate") if self.smoke else None,
                          ds.generate_args, row.generate_args, col.generate_args,
                          drop=self.table.smoke.get("drop", []) if self.smoke else [])

    def model_overrides(self, ds: Dataset, row: Row) -> str:
        """The row's fairseq-generate --model-overrides (a reused model decoded otherwise), or "{}"."""
        args = merge_args(ds.generate_args, row.generate_args)
        return args[args.index("--model-overrides") + 1] if "--model-overrides" in args[:-1] else "{}"

    def measure_steps(self, ds: Dataset, row: Row, col: Column, seed: int) -> List[Step]:
        """The commands whose output the column reads (none for numbers from the training log)."""
        measure = MEASURES[col.measure]
        steps = measure.source.steps(self, ds, row, col, seed, measure.reads_baseline_model())
        return [replace(step, runs_alone=measure.clocks_command) for step in steps]

    def steps(self, every_seed: bool = False) -> List[Step]:
        """All commands of the seeds to run (of every seed the table reports with ``every_seed``: what
        commands.sh lists), in order, each once (a decode shared by two columns runs once)."""
        steps: List[Step] = []
        seen: Dict[Path, Step] = {}

        def add(step: Step):
            kept = seen.setdefault(step.output, step)  # a decode that two columns read, alone if either times it
            kept.runs_alone |= step.runs_alone
            if kept is step:
                steps.append(step)

        used = [ds for ds in self.table.datasets.values() if any(c.dataset == ds.id for c in self.table.columns)]
        for ds in used:
            for step in self.prep_steps(ds):
                add(step)
        for ds in used:
            columns = [c for c in self.table.columns if c.dataset == ds.id]
            rows = [r for r in self.table.rows if self.applies(ds, r)]
            for seed in (self.seeds(ds) if every_seed else self.seeds_to_run(ds)):
                # each row's measurements as soon as the models they read are trained: a long run
                # (the CPU study) has numbers to report while later rows still train
                trained, waiting = set(), []
                for row in rows:
                    for step in self.train_steps(ds, row, seed):
                        add(step)
                    trained.add(self.model_key(ds, row, seed))
                    waiting += [step for col in columns if seed in self.column_seeds(ds, col)
                                for step in self.measure_steps(ds, row, col, seed)]
                    for step in [s for s in waiting if set(s.needs) <= trained]:
                        add(step)
                    waiting = [s for s in waiting if not set(s.needs) <= trained]
                for step in waiting:
                    add(step)
        if HEATMAP.drawn_by(self, every_seed):
            add(HEATMAP.step(self))
        return steps


