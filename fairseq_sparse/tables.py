"""Regenerate a paper's table: prepare data, train, average checkpoints, decode, score.

    python -m fairseq_sparse.tables configs/tables/NAME.yaml --profile smoke|paper [--dry-run]

The table's YAML (see ``configs/README.md``) names datasets, rows (models) and columns
(measures). Every step is an ordinary command (data-prep script, ``fairseq-train``,
``python -m fairseq_sparse.average_checkpoints``, ``fairseq-generate``, ...), run as a
subprocess and written to ``OUT/commands.sh`` so a run can be read and repeated by hand.
Finished steps are skipped when the table is run again. The result is ``OUT/NAME.md`` and
``OUT/NAME.csv`` with our numbers beside the paper's (and ``OUT/NAME.png`` if the table has
a plot). ``--dry-run`` builds every command and checks that it parses (fairseq's own
parsers, the data-prep scripts' parsers) without running anything.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import importlib
import importlib.util
import logging
import re
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import yaml

logger = logging.getLogger("fairseq_sparse.tables")

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"
BIN = Path(sys.executable).parent
PROFILES = ("paper", "smoke")
MEASURES = ("bleu", "valid_bleu", "bleu_delta", "decode_time", "decode_speedup", "decode_token_speedup", "train_speedup",
            "params_m", "epochs", "best_valid_loss", "sparsity", "attn_sparsity", "null_rate")
RELATIVE = ("decode_speedup", "decode_token_speedup", "train_speedup", "bleu_delta")  # measures against a baseline row
FROM_TRAIN_LOG = ("train_speedup", "params_m", "epochs", "best_valid_loss")
METRICS = ("sacrebleu", "tokenized", "d_bleu")
FINETUNE_RESETS = ["--reset-optimizer", "--reset-dataloader", "--reset-meters", "--reset-lr-scheduler"]


class ConfigError(Exception):
    """A table configuration that cannot be run; the message names the file and the entry."""


class StepError(Exception):
    """A command of the pipeline failed; the message holds the tail of its log."""


# ----------------------------------------------------------------------------- arguments


def parse_flags(args: str | Sequence[str] | None) -> List[Tuple[str, List[str]]]:
    """Split a command line into ``(--flag, values)`` pairs; leading positionals go under ``""``."""
    tokens = shlex.split(args) if isinstance(args, str) else list(args or [])
    pairs: List[Tuple[str, List[str]]] = []
    for token in tokens:
        if token.startswith("--"):
            pairs.append((token, []))
        elif pairs:
            pairs[-1][1].append(token)
        else:
            pairs.append(("", [token]))
    return pairs


def merge_args(*parts: str | Sequence[str] | None, drop: Sequence[str] = ()) -> List[str]:
    """Merge command-line fragments flag by flag: a later ``--flag`` replaces an earlier one."""
    merged: Dict[str, List[str]] = {}  # a replaced flag keeps its first position: same flags, same command
    for part in parts:
        for flag, values in parse_flags(part):
            merged[flag] = values
    return [token for flag, values in merged.items() if flag not in drop for token in ([flag] if flag else []) + values]


# ----------------------------------------------------------------------------- configuration


@dataclass
class Dataset:
    id: str
    label: str
    src: str
    tgt: str
    prep: List[str]
    post_process: str
    documents: bool
    detok: str
    note: str
    setting: dict
    train_args: str = ""
    generate_args: str = ""


@dataclass
class Column:
    id: str
    label: str
    dataset: str
    measure: str
    split: str = "test"
    metric: str = "sacrebleu"
    compound_split: bool = False
    lowercase: bool = False
    sacrebleu_tokenize: str = "13a"
    baseline: Optional[str] = None
    generate_args: str = ""


@dataclass
class Row:
    id: str
    label: str
    args: str = ""
    generate_args: str = ""
    reuse: Optional[str] = None
    finetune_from: Optional[str] = None
    setting: Optional[str] = None  # a paper setting replacing the dataset's for this row (e.g. big vs base)
    datasets: Optional[List[str]] = None  # only these datasets (default: all of the table's)
    args_by_dataset: Dict[str, str] = field(default_factory=dict)  # extra training arguments per dataset
    may_fail: bool = False  # the paper reports that this model fails to train: a failure is a result, not an error
    x: Optional[float] = None
    paper: Dict[str, float] = field(default_factory=dict)


@dataclass
class Table:
    name: str
    title: str
    source: str
    notes: str
    profile: str
    datasets: Dict[str, Dataset]
    columns: List[Column]
    rows: List[Row]
    smoke: dict
    plot: Optional[dict]
    path: Path
    heatmap: Optional[dict] = None
    settings: Dict[str, dict] = field(default_factory=dict)

    def row(self, row_id: str) -> Row:
        return next(r for r in self.rows if r.id == row_id)


def _load_yaml(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"no such configuration file: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data


def _fields(cls, entry: dict, where: str) -> dict:
    known = set(cls.__dataclass_fields__)
    unknown = set(entry) - known
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; known: {sorted(known)}")
    return entry


def load_table(path: Path, profile: str, configs: Path = CONFIGS) -> Table:
    """Read a table configuration with its paper settings and datasets; check every reference."""
    if profile not in PROFILES:
        raise ConfigError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}")
    path = Path(path)
    spec = _load_yaml(path)
    for key in ("name", "title", "paper", "datasets", "columns", "rows"):
        if key not in spec:
            raise ConfigError(f"{path}: missing key {key!r}")
    paper = _load_yaml(configs / "papers" / f"{spec['paper']}.yaml")
    settings = paper.get("settings") or {}
    catalogue = _load_yaml(configs / "datasets.yaml")
    smoke = _load_yaml(configs / "smoke.yaml")

    datasets: Dict[str, Dataset] = {}
    for entry in spec["datasets"]:
        ds_id = entry.get("id")
        if ds_id not in catalogue:
            raise ConfigError(f"{path}: dataset {ds_id!r} is not in {configs / 'datasets.yaml'}")
        if entry.get("setting") not in settings:
            raise ConfigError(f"{path}: dataset {ds_id}: setting {entry.get('setting')!r} is not in "
                              f"papers/{spec['paper']}.yaml (known: {sorted(settings)})")
        info = catalogue[ds_id]
        setting = dict(settings[entry["setting"]])
        if "train" not in setting:
            raise ConfigError(f"papers/{spec['paper']}.yaml: setting {entry['setting']} has no 'train'")
        prep = info["prep"][profile]
        datasets[ds_id] = Dataset(
            id=ds_id, label=info["label"], src=info["src"], tgt=info["tgt"],
            prep=[prep] if isinstance(prep, str) else list(prep),
            post_process=info.get("post_process", "subword_nmt") if profile == "paper" else "subword_nmt",
            documents=bool(info.get("documents", False)),
            detok=info.get("detok", "moses") if profile == "paper" else "moses",
            note=info.get("smoke_note", "") if profile == "smoke" else "",
            setting=setting, train_args=entry.get("train_args", "") or "",
            generate_args=entry.get("generate_args", "") or "")

    columns = [Column(**_fields(Column, c, f"{path}: column {c.get('id')}")) for c in spec["columns"]]
    rows = [Row(**_fields(Row, r, f"{path}: row {r.get('id')}")) for r in spec["rows"]]
    column_ids = [c.id for c in columns]
    row_ids = [r.id for r in rows]
    for ids, what in ((column_ids, "column"), (row_ids, "row")):
        duplicates = {i for i in ids if ids.count(i) > 1}
        if duplicates:
            raise ConfigError(f"{path}: duplicate {what} id(s) {sorted(duplicates)}")
    for c in columns:
        where = f"{path}: column {c.id}"
        if c.dataset not in datasets:
            raise ConfigError(f"{where}: dataset {c.dataset!r} is not among the table's datasets {sorted(datasets)}")
        if c.measure not in MEASURES:
            raise ConfigError(f"{where}: unknown measure {c.measure!r}; known: {', '.join(MEASURES)}")
        if c.measure == "valid_bleu":
            c.measure, c.split = "bleu", "valid"
        if c.metric not in METRICS:
            raise ConfigError(f"{where}: unknown metric {c.metric!r}; known: {', '.join(METRICS)}")
        if c.metric == "d_bleu" and not datasets[c.dataset].documents:
            raise ConfigError(f"{where}: d_bleu needs a document-level dataset, {c.dataset} is not one")
        if c.measure in RELATIVE and c.baseline not in row_ids:
            raise ConfigError(f"{where}: {c.measure} needs 'baseline:' naming a row, got {c.baseline!r}")
    seen: List[str] = []
    for r in rows:
        where = f"{path}: row {r.id}"
        for ref, what in ((r.reuse, "reuse"), (r.finetune_from, "finetune_from")):
            if ref is not None and ref not in seen:
                raise ConfigError(f"{where}: {what} {ref!r} must name an earlier row (earlier: {seen})")
        if r.reuse and r.finetune_from:
            raise ConfigError(f"{where}: a row either reuses or fine-tunes, not both")
        for ds_id in list(r.datasets or []) + list(r.args_by_dataset or {}):
            if ds_id not in datasets:
                raise ConfigError(f"{where}: dataset {ds_id!r} is not among the table's datasets {sorted(datasets)}")
        if r.setting is not None and r.setting not in settings:
            raise ConfigError(f"{where}: setting {r.setting!r} is not in papers/{spec['paper']}.yaml (known: {sorted(settings)})")
        unknown = set(r.paper or {}) - set(column_ids)
        if unknown:
            raise ConfigError(f"{where}: paper numbers for unknown column(s) {sorted(unknown)}")
        seen.append(r.id)
    plot = spec.get("plot")
    if plot:
        lines = plot.get("series") or [{"x": plot.get("x", "row"), "y": y} for y in plot.get("y", [])]
        if not lines:
            raise ConfigError(f"{path}: plot needs 'y' (column ids) or 'series' ([{{x, y, label}}])")
        for line in lines:
            if line.get("y") not in column_ids:
                raise ConfigError(f"{path}: plot y {line.get('y')!r} is not a column")
            if line.get("x", "row") != "row" and line["x"] not in column_ids:
                raise ConfigError(f"{path}: plot x {line['x']!r} is neither 'row' nor a column")
    heatmap = spec.get("heatmap")
    if heatmap:
        unknown = set(heatmap) - {"rows", "dataset", "sentences", "sublayer", "layer", "head", "split"}
        if unknown:
            raise ConfigError(f"{path}: heatmap: unknown key(s) {sorted(unknown)}")
        if heatmap.get("dataset") not in datasets or not heatmap.get("rows") or set(heatmap["rows"]) - set(row_ids):
            raise ConfigError(f"{path}: heatmap needs 'dataset' (one of the table's) and 'rows' (row ids)")
    return Table(name=spec["name"], title=spec["title"], source=spec.get("source", ""), notes=spec.get("notes", "") or "",
                 profile=profile, datasets=datasets, columns=columns, rows=rows, smoke=smoke, plot=plot, path=path,
                 settings=settings, heatmap=heatmap)


# ----------------------------------------------------------------------------- plan


@dataclass
class Step:
    """One command; ``output`` is what proves it already ran."""

    kind: str  # prep | train | average | generate | sparsity | attn_sparsity
    argv: List[str]
    output: Path
    log: Path
    label: str
    model: Optional[Tuple[str, str, int]] = None  # (dataset, row, seed) this step trains
    needs: Tuple[Tuple[str, str, int], ...] = ()  # models whose checkpoints it reads


def _tool(name: str) -> List[str]:
    """argv prefix of a pipeline tool: a script of the repository, a console script, or a module."""
    if name.endswith(".py"):
        return [sys.executable, str(ROOT / name)]
    if name.startswith("fairseq-"):
        return [str(BIN / name)]
    raise ConfigError(f"unknown tool {name!r} in a prep command (expected a .py script or a fairseq- command)")


class Plan:
    """Every command of a table, in order, with where its output goes."""

    def __init__(self, table: Table, out: Path, data_root: Path, raw_data: Optional[Path], seeds: Optional[List[int]] = None,
                 models_root: Optional[Path] = None):
        self.table, self.out, self.data_root, self.raw_data = table, out, data_root, raw_data
        # models are keyed by their full training command, so tables that train the same model share it
        self.models_root = (models_root or out / "models") / table.profile
        self.smoke = table.profile == "smoke"
        self.seeds_override = seeds

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
            last = i == len(ds.prep) - 1
            steps.append(Step("prep", _tool(words[0]) + words[1:], out / "bin" / f"dict.{ds.tgt}.txt" if last else out / f".prep{i}.done",
                              out / f"prep{i}.log", f"prepare {ds.id} ({i + 1}/{len(ds.prep)})"))
        return steps

    def seeds(self, ds: Dataset) -> List[int]:
        if self.seeds_override:
            return self.seeds_override
        return list((self.table.smoke if self.smoke else ds.setting).get("seeds", ds.setting.get("seeds", [1])))

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
            extra = ["--restore-file", str(self.checkpoint(ds, self.table.row(row.finetune_from), seed)), *FINETUNE_RESETS]
        argv = merge_args(self.setting(ds, row)["train"], ds.train_args, row.args, (row.args_by_dataset or {}).get(ds.id),
                          self.table.smoke.get("train") if self.smoke else None,
                          drop=self.table.smoke.get("drop", []) if self.smoke else [])
        return [*_tool("fairseq-train"), str(self.data_dir(ds) / "bin"), "--user-dir", str(ROOT / "fairseq_sparse"),
                *argv, *extra, "--seed", str(seed)]

    def run_dir(self, ds: Dataset, row: Row, seed: int) -> Path:
        # keyed by what defines the model: the data and the arguments, not where fairseq and the plugin are installed
        argv = self.train_argv(ds, row, seed)[1:]
        at = argv.index("--user-dir")
        digest = hashlib.sha1(" ".join(argv[:at] + argv[at + 2:]).encode()).hexdigest()[:12]
        return self.models_root / ds.id / f"{self.trained_row(row).id}-{digest}"

    def checkpoint(self, ds: Dataset, row: Row, seed: int) -> Path:
        run = self.run_dir(ds, row, seed)
        return run / ("checkpoint_avg.pt" if self.averaging(ds, row).get("last", 1) > 1 else "checkpoints/checkpoint_last.pt")

    def train_steps(self, ds: Dataset, row: Row, seed: int) -> List[Step]:
        if row.reuse:
            return []
        run = self.run_dir(ds, row, seed)
        key = self.model_key(ds, row, seed)
        needs = (self.model_key(ds, self.table.row(row.finetune_from), seed),) if row.finetune_from else ()
        argv = [*self.train_argv(ds, row, seed), "--save-dir", str(run / "checkpoints")]
        steps = [Step("train", argv, run / "train.done", run / "train.log", f"train {row.id} on {ds.id} (seed {seed})",
                      model=key, needs=needs)]
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
        """Whether the row's model removes encoder outputs (L0Drop gates or a rule-based pattern)."""
        argv = self.train_argv(ds, row, 1)
        return "--l0drop" in argv or "--encoder-prune-pattern" in argv

    def generate_args(self, ds: Dataset, row: Row, col: Column) -> List[str]:
        # smoke replaces the paper's decoding defaults, not what a table asks of one row or column (e.g. batch 1)
        return merge_args(self.setting(ds, row).get("generate", ""), self.table.smoke.get("generate") if self.smoke else None,
                          ds.generate_args, row.generate_args, col.generate_args,
                          drop=self.table.smoke.get("drop", []) if self.smoke else [])

    def generate_step(self, ds: Dataset, row: Row, col: Column, seed: int) -> Step:
        args = self.generate_args(ds, row, col)
        key = hashlib.sha1(" ".join([col.split, *args]).encode()).hexdigest()[:8]
        out = self.out / "decode" / ds.id / row.id / f"seed{seed}" / f"{col.split}.{key}.txt"
        argv = [*_tool("fairseq-generate"), str(self.data_dir(ds) / "bin"), "--user-dir", str(ROOT / "fairseq_sparse"),
                "--path", str(self.checkpoint(ds, row, seed)), "--gen-subset", col.split, *args,
                "--post-process", ds.post_process]
        return Step("generate", argv, out, out, f"decode {row.id} on {ds.id} {col.split} (seed {seed})",
                    needs=(self.model_key(ds, row, seed),))

    def analysis_step(self, ds: Dataset, row: Row, col: Column, seed: int) -> Step:
        cpu = ["--cpu"] if self.smoke else []
        base = self.out / "analysis" / ds.id / row.id / f"seed{seed}"
        ckpt = str(self.checkpoint(ds, row, seed))
        if col.measure == "sparsity":
            out = base / f"l0drop-sparsity.{col.split}.txt"
            argv = [sys.executable, "-m", "fairseq_sparse.sparsity", str(self.data_dir(ds) / "bin"), "--path", ckpt,
                    "--split", col.split, *cpu]
            return Step("sparsity", argv, out, out, f"L0Drop sparsity of {row.id} on {ds.id} (seed {seed})",
                        needs=(self.model_key(ds, row, seed),))
        overrides = self.model_overrides(ds, row)
        tag = "" if overrides == "{}" else "." + hashlib.sha1(overrides.encode()).hexdigest()[:8]
        out = base / f"attention-{col.split}{tag}"
        argv = [sys.executable, "-m", "fairseq_sparse.analysis", "sparsity", str(self.data_dir(ds) / "bin"), "--path", ckpt,
                "--split", col.split, "--out", str(out), "--model-overrides", overrides, *cpu]
        return Step("attn_sparsity", argv, out / "sparsity.csv", base / f"attention-{col.split}{tag}.log",
                    f"attention sparsity of {row.id} on {ds.id} (seed {seed})", needs=(self.model_key(ds, row, seed),))

    def model_overrides(self, ds: Dataset, row: Row) -> str:
        """The row's fairseq-generate --model-overrides (a reused model decoded otherwise), or "{}"."""
        args = merge_args(ds.generate_args, row.generate_args)
        return args[args.index("--model-overrides") + 1] if "--model-overrides" in args[:-1] else "{}"

    def measure_steps(self, ds: Dataset, row: Row, col: Column, seed: int) -> List[Step]:
        if col.measure in FROM_TRAIN_LOG or (col.measure == "sparsity" and not self.prunes(ds, row)):
            return []  # read from the training log, or nothing to measure (a model without gates prunes nothing)
        if col.measure in ("sparsity", "attn_sparsity", "null_rate"):
            return [self.analysis_step(ds, row, col, seed)]
        steps = [self.generate_step(ds, row, col, seed)]
        if col.measure in ("decode_speedup", "decode_token_speedup", "bleu_delta"):
            steps.append(self.generate_step(ds, self.table.row(col.baseline), col, seed))
        return steps

    def steps(self) -> List[Step]:
        """All commands in order, each once (a decode shared by two columns runs once)."""
        steps: List[Step] = []
        seen = set()

        def add(step: Step):
            if step.output not in seen:
                seen.add(step.output)
                steps.append(step)

        used = [ds for ds in self.table.datasets.values() if any(c.dataset == ds.id for c in self.table.columns)]
        for ds in used:
            for step in self.prep_steps(ds):
                add(step)
        for ds in used:
            columns = [c for c in self.table.columns if c.dataset == ds.id]
            rows = [r for r in self.table.rows if self.applies(ds, r)]
            for seed in self.seeds(ds):
                for row in rows:
                    for step in self.train_steps(ds, row, seed):
                        add(step)
                for row in rows:
                    for col in columns:
                        for step in self.measure_steps(ds, row, col, seed):
                            add(step)
        if self.table.heatmap:
            add(self.heatmap_step())
        return steps

    def heatmap_step(self) -> Step:
        """Attention of chosen sentences, the given rows' models side by side (first seed)."""
        spec = self.table.heatmap
        ds = self.table.datasets[spec["dataset"]]
        rows = [self.table.row(r) for r in spec["rows"]]
        seed = self.seeds(ds)[0]
        out = self.out / "heatmap"
        argv = [sys.executable, "-m", "fairseq_sparse.analysis", "heatmap", str(self.data_dir(ds) / "bin"),
                "--path", *[str(self.checkpoint(ds, r, seed)) for r in rows], "--labels", *[r.label for r in rows],
                "--split", spec.get("split", "test"), "--sentences", *[str(s) for s in spec.get("sentences", [0])],
                "--sublayer", spec.get("sublayer", "cross"), "--layer", str(spec.get("layer", 0)),
                "--head", str(spec.get("head", "mean")), "--out", str(out),
                "--model-overrides", *[self.model_overrides(ds, r) for r in rows]] + (["--cpu"] if self.smoke else [])
        return Step("heatmap", argv, out / "heatmap.md", self.out / "heatmap.log", "attention heatmaps",
                    needs=tuple(self.model_key(ds, r, seed) for r in rows))


# ----------------------------------------------------------------------------- running


def _tail(path: Path, lines: int = 25) -> str:
    if not path.is_file():
        return "(no log)"
    return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])


PROGRESS = re.compile(r"\| (train_inner|train|valid) \||Translated \d|averaged \d|binarised data|pairs|sparsity rate")


def run_step(step: Step, index: int, total: int) -> float:
    """Run one command, streaming its log to a file and its progress lines to the console."""
    step.log.parent.mkdir(parents=True, exist_ok=True)
    step.output.parent.mkdir(parents=True, exist_ok=True)
    print(f"[{index}/{total}] {step.label}", flush=True)
    start = time.time()
    with open(step.log, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(step.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
        for line in proc.stdout:
            log.write(line)
            if PROGRESS.search(line):  # drop fairseq's "date time | INFO | logger |" prefix
                print(f"      {line.rstrip().split(' | ')[-1][:200]}", flush=True)
        status = proc.wait()
    if status != 0:
        raise StepError(f"{step.label} failed (exit status {status}); command:\n  {shlex.join(step.argv)}\n"
                        f"last lines of {step.log}:\n{_tail(step.log)}")
    if step.kind in ("train", "prep") and step.output.suffix == ".done":
        step.output.write_text("ok\n")
    if not step.output.exists():
        raise StepError(f"{step.label} finished but {step.output} is missing; log: {step.log}")
    elapsed = time.time() - start
    print(f"      done in {elapsed:.0f}s", flush=True)
    return elapsed


def _done(step: Step) -> bool:
    if not step.output.exists():
        return False
    if step.kind == "generate":  # a decode cut short has no summary line
        return "Translated " in step.output.read_text(encoding="utf-8", errors="replace")
    return True


def execute(plan: Plan, steps: List[Step]) -> set:
    """Run the steps not done yet; returns the models (dataset, row, seed) that failed to train.

    A failed data preparation stops everything. A failed training or averaging is reported,
    the steps that need that model are skipped and the other rows go on; a failed decode or
    analysis is reported and shows as "failed" in its cells.
    """
    plan.out.mkdir(parents=True, exist_ok=True)
    with open(plan.out / "commands.sh", "w", encoding="utf-8") as f:
        f.write("#!/usr/bin/env bash\n# Every command of this table, in order (run from the repository root).\nset -e\n")
        for step in steps:
            f.write(f"# {step.label}\n{shlex.join(step.argv)} > {shlex.quote(str(step.log))} 2>&1\n")
    todo = [s for s in steps if not _done(s)]
    print(f"{plan.table.name} ({plan.table.profile}): {len(steps)} steps, {len(steps) - len(todo)} already done; "
          f"commands in {plan.out / 'commands.sh'}", flush=True)
    failed: set = set()
    for i, step in enumerate(todo, 1):
        blocked = [m for m in step.needs if m in failed]
        if blocked:
            print(f"[{i}/{len(todo)}] skip {step.label}: {blocked[0][1]} failed", flush=True)
            continue
        try:
            run_step(step, i, len(todo))
        except StepError as e:
            if step.kind == "prep":
                raise
            print(f"      FAILED: {e}", flush=True)
            if step.model:
                failed.add(step.model)
    return failed


# ----------------------------------------------------------------------------- measuring


def compound_split(line: str) -> str:
    """Vaswani et al.'s compound splitting for WMT14 En-De (tensor2tensor's get_ende_bleu.sh)."""
    return re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", line)


def bleu(plan: Plan, ds: Dataset, col: Column, generated: Path) -> Tuple[float, str]:
    """BLEU of one decode by the column's metric, with sacreBLEU's signature."""
    from fairseq_sparse import evaluate

    data = plan.data_dir(ds)
    if col.metric == "tokenized":
        hyps = evaluate.read_hypotheses(str(generated), ds.tgt, detok="none")
        tok = data / f"{col.split}.tok.{ds.tgt}"
        if tok.is_file():
            refs = tok.read_text(encoding="utf-8").splitlines()
        elif ds.post_process in ("subword_nmt", "none"):  # the model's own text is Moses-tokenised (+ BPE)
            refs = [evaluate.undo_subwords(line) for line in (data / f"{col.split}.{ds.tgt}").read_text(encoding="utf-8").splitlines()]
        else:  # characters / sentencepiece: the text is untokenised, so Moses-tokenise both sides
            from sacremoses import MosesTokenizer

            moses = MosesTokenizer(lang=ds.tgt)
            refs = (data / f"{col.split}.raw.{ds.tgt}").read_text(encoding="utf-8").splitlines()
            hyps, refs = ([moses.tokenize(s, return_str=True, escape=False) for s in side] for side in (hyps, refs))
        if col.compound_split:
            hyps, refs = [compound_split(h) for h in hyps], [compound_split(r) for r in refs]
        score, signature = evaluate.corpus_bleu(hyps, refs, tokenize="none", lowercase=col.lowercase)
        return score.score, f"{signature} (Moses-tokenised{', compound-split' if col.compound_split else ''})"
    refs = (data / f"{col.split}.raw.{ds.tgt}").read_text(encoding="utf-8").splitlines()
    if col.metric == "d_bleu":
        blocks = evaluate.read_hypotheses(str(generated), ds.tgt, detok="none")
        documents = evaluate.documents_from_blocks(blocks, evaluate.read_block_documents(str(data / f"{col.split}.blocks.tsv")),
                                                   evaluate.detokenizer(ds.tgt, ds.detok))
        score, signature = evaluate.corpus_bleu(documents, refs, col.sacrebleu_tokenize, col.lowercase)
        return score.score, f"{signature} (d-BLEU over {len(documents)} documents)"
    hyps = evaluate.read_hypotheses(str(generated), ds.tgt, detok=ds.detok)
    score, signature = evaluate.corpus_bleu(hyps, refs, col.sacrebleu_tokenize, col.lowercase)
    return score.score, str(signature)


def decode_seconds(generated: Path) -> float:
    match = re.search(r"Translated [\d,]+ sentences \([\d,]+ tokens\) in ([\d.]+)s", generated.read_text(encoding="utf-8"))
    if not match:
        raise StepError(f"{generated}: no 'Translated ... in Ns' line; was decoding cut short?")
    return float(match.group(1))


def decode_tokens_per_second(generated: Path) -> float:
    match = re.search(r"Translated [\d,]+ sentences .*?, ([\d.]+) tokens/s\)", generated.read_text(encoding="utf-8"))
    if not match:
        raise StepError(f"{generated}: no 'Translated ... tokens/s' line; was decoding cut short?")
    return float(match.group(1))


def train_words_per_second(log: Path) -> float:
    """Median words/s of the logged training intervals (the first one, warm-up, left out when there are more)."""
    rates = [float(m.group(1)) for line in log.read_text(encoding="utf-8").splitlines()
             if "train_inner" in line or "| train |" in line for m in [re.search(r"\bwps (\d+(?:\.\d+)?)", line)] if m]
    if not rates:
        raise StepError(f"{log}: no 'wps' in the training log; lower --log-interval")
    return statistics.median(rates[1:] if len(rates) > 2 else rates)


def trained_params(log: Path) -> int:
    match = re.search(r"num\. (?:shared )?model params: [\d,]+ \(num\. trained: ([\d,]+)\)", log.read_text(encoding="utf-8"))
    if not match:
        raise StepError(f"{log}: no parameter count in the training log")
    return int(match.group(1).replace(",", ""))


VALID_LOSS = re.compile(r"\| valid on 'valid' subset \| loss ([\d.]+)")
EPOCH_DONE = re.compile(r"end of epoch (\d+)")


def trained_epochs(log: Path) -> int:
    """The number of epochs training ran (early stopping by --patience ends it before --max-epoch)."""
    epochs = [int(m.group(1)) for m in EPOCH_DONE.finditer(log.read_text(encoding="utf-8"))]
    if not epochs:
        raise StepError(f"{log}: no 'end of epoch' line in the training log")
    return max(epochs)


def best_valid_loss(log: Path) -> float:
    """The lowest validation loss (base 2, fairseq's) of a training run."""
    losses = [float(m.group(1)) for m in VALID_LOSS.finditer(log.read_text(encoding="utf-8"))]
    if not losses:
        raise StepError(f"{log}: no validation line in the training log (training ran with --disable-validation?)")
    return min(losses)


def l0drop_sparsity(output: Path) -> float:
    match = re.search(r"(\d+) of (\d+) source encodings pruned", output.read_text(encoding="utf-8"))
    if not match:
        raise StepError(f"{output}: no sparsity line")
    return 100.0 * int(match.group(1)) / max(int(match.group(2)), 1)


def attention_sparsity(csv_path: Path) -> float:
    """% of attention weights exactly 0, over every sublayer, layer and head."""
    with open(csv_path, encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    weights = sum(int(r["weights"]) for r in rows)
    return 100.0 * sum(float(r["sparsity"]) * int(r["weights"]) for r in rows) / max(weights, 1)


def null_rate(csv_path: Path) -> float:
    """% of queries whose attention weights are all 0 (ReLA's null attention), over every sublayer, layer and head."""
    with open(csv_path, encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    queries = sum(int(r["queries"]) for r in rows)
    return 100.0 * sum(float(r["null_rate"]) * int(r["queries"]) for r in rows) / max(queries, 1)


def measure(plan: Plan, ds: Dataset, row: Row, col: Column, seed: int, signatures: Dict[str, str]) -> Optional[float]:
    """One cell of one seed; None where the measure does not apply to the row."""
    if col.measure == "bleu":
        value, signature = bleu(plan, ds, col, plan.generate_step(ds, row, col, seed).output)
        signatures[col.id] = signature
        return value
    if col.measure == "bleu_delta":
        ours, signature = bleu(plan, ds, col, plan.generate_step(ds, row, col, seed).output)
        baseline, _ = bleu(plan, ds, col, plan.generate_step(ds, plan.table.row(col.baseline), col, seed).output)
        signatures[col.id] = signature
        return ours - baseline
    if col.measure == "decode_time":
        return decode_seconds(plan.generate_step(ds, row, col, seed).output)
    if col.measure == "decode_speedup":
        baseline = decode_seconds(plan.generate_step(ds, plan.table.row(col.baseline), col, seed).output)
        return baseline / max(decode_seconds(plan.generate_step(ds, row, col, seed).output), 1e-9)
    if col.measure == "decode_token_speedup":  # per generated token: fair when models' outputs differ in length
        baseline = decode_tokens_per_second(plan.generate_step(ds, plan.table.row(col.baseline), col, seed).output)
        return decode_tokens_per_second(plan.generate_step(ds, row, col, seed).output) / baseline
    if col.measure == "train_speedup":
        base_log = plan.run_dir(ds, plan.table.row(col.baseline), seed) / "train.log"
        return train_words_per_second(plan.run_dir(ds, row, seed) / "train.log") / train_words_per_second(base_log)
    if col.measure == "params_m":
        return trained_params(plan.run_dir(ds, row, seed) / "train.log") / 1e6
    if col.measure == "epochs":
        return trained_epochs(plan.run_dir(ds, row, seed) / "train.log")
    if col.measure == "best_valid_loss":
        if "--disable-validation" in plan.train_argv(ds, row, seed):
            return None  # not measured: the row trains without validation (a fixed fine-tuning budget)
        return best_valid_loss(plan.run_dir(ds, row, seed) / "train.log")
    if col.measure == "sparsity" and not plan.prunes(ds, row):
        return 0.0  # nothing can be pruned: the paper's 0.00% of the baseline
    step = plan.analysis_step(ds, row, col, seed)
    if col.measure == "sparsity":
        return l0drop_sparsity(step.output)
    return null_rate(step.output) if col.measure == "null_rate" else attention_sparsity(step.output)


DIGITS = {"decode_speedup": 2, "decode_token_speedup": 2, "train_speedup": 2, "params_m": 1, "decode_time": 1, "epochs": 1,
          "best_valid_loss": 3}


def fmt(value: Optional[float], col: Column, spread: Optional[Tuple[float, int]] = None) -> str:
    """A cell: the mean over seeds, "± std" when more than one seed finished."""
    if value is None:
        return "—"
    if value != value:
        return "failed"
    digits = DIGITS.get(col.measure, 2)
    text = f"{value:+.{digits}f}" if col.measure == "bleu_delta" else f"{value:.{digits}f}"
    if spread and spread[1] > 1:
        text += f" ± {spread[0]:.{digits}f}"
    return text


FAILED = float("nan")  # a cell whose model failed to train or decode


@dataclass
class Results:
    """Per (row id, column id): the mean over seeds, (std, number of seeds), and the signatures per column."""

    means: Dict[Tuple[str, str], float] = field(default_factory=dict)
    spreads: Dict[Tuple[str, str], Tuple[float, int]] = field(default_factory=dict)
    signatures: Dict[str, str] = field(default_factory=dict)
    seeds_done: Dict[str, List[int]] = field(default_factory=dict)  # per row: seeds with every cell measured

    def get(self, key: Tuple[str, str]) -> Optional[float]:
        return self.means.get(key)

    def items(self):
        return self.means.items()


def cell_steps(plan: Plan, ds: Dataset, row: Row, col: Column, seed: int) -> List[Step]:
    """The commands one cell of one seed needs: its models' training and its measurement."""
    rows = [row] + ([plan.table.row(col.baseline)] if col.baseline else [])
    steps = [step for r in rows for step in plan.train_steps(ds, plan.trained_row(r), seed)]
    return steps + plan.measure_steps(ds, row, col, seed)


def collect(plan: Plan, failed: set = frozenset(), finished_only: bool = False) -> Results:
    """Measure every cell, averaged over seeds. ``finished_only``: seeds whose commands have not all
    run yet are left out of a cell (a study completed over several sittings); otherwise they count as failed."""
    results = Results()
    for row in plan.table.rows:
        complete: Optional[set] = None
        for col in plan.table.columns:
            ds = plan.table.datasets[col.dataset]
            if not plan.applies(ds, row):
                continue
            values, seeds = [], []
            for seed in plan.seeds(ds):
                models = {plan.model_key(ds, row, seed)}
                if col.baseline:
                    models.add(plan.model_key(ds, plan.table.row(col.baseline), seed))
                if finished_only and not all(_done(s) for s in cell_steps(plan, ds, row, col, seed)):
                    continue
                seeds.append(seed)
                try:
                    value = FAILED if models & failed else measure(plan, ds, row, col, seed, results.signatures)
                except (StepError, OSError, ValueError) as e:  # its decode or analysis failed (reported when it ran)
                    logger.warning("%s / %s: %s", row.id, col.id, e)
                    value = FAILED
                if value is not None:
                    values.append(value)
            complete = set(seeds) if complete is None else complete & set(seeds)
            if values:
                results.means[row.id, col.id] = statistics.mean(values)
                results.spreads[row.id, col.id] = (statistics.stdev(values) if len(values) > 1 else 0.0, len(values))
        results.seeds_done[row.id] = sorted(complete or ())
    return results


def write_report(plan: Plan, results: Results) -> Path:
    table = plan.table
    header = ["model"]
    for col in table.columns:
        header += [col.label, f"{col.label} (paper)"]
    lines = [f"# {table.title}", "",
             f"Profile `{table.profile}`; source: {table.source}; configuration `{table.path}`; "
             f"commands: `{plan.out / 'commands.sh'}`.", "",
             "| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]
    records = []
    for row in table.rows:
        cells = [row.label]
        for col in table.columns:
            ours, theirs = results.get((row.id, col.id)), (row.paper or {}).get(col.id)
            spread = results.spreads.get((row.id, col.id))
            cells += [fmt(ours, col, spread), fmt(theirs, col)]
            records.append({"row": row.id, "model": row.label, "column": col.id, "label": col.label, "dataset": col.dataset,
                            "measure": col.measure, "split": col.split,
                            "ours": "" if ours is None else ("failed" if ours != ours else f"{ours:.4f}"),
                            "std": "" if spread is None or spread[1] < 2 else f"{spread[0]:.4f}",
                            "seeds": "" if spread is None else spread[1],
                            "paper": "" if theirs is None else theirs, "profile": table.profile})
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    planned = {ds.id: plan.seeds(ds) for ds in table.datasets.values()}
    seeds = sorted({s for ss in planned.values() for s in ss})
    if len(seeds) > 1 or any(results.seeds_done.get(r.id) != seeds for r in table.rows):
        lines.append(f"Cells are the mean ± standard deviation over the seeds that finished (planned: {seeds}); "
                     "seeds finished per row: " + "; ".join(
                         f"{r.id} {','.join(map(str, results.seeds_done.get(r.id) or [])) or 'none'}" for r in table.rows) + ".")
        lines.append("")
    if results.signatures:
        lines.append("BLEU signatures:")
        lines += [f"- {next(c.label for c in table.columns if c.id == cid)}: `{sig}`" for cid, sig in results.signatures.items()]
        lines.append("")
    notes = [f"- {ds.label}: {ds.note}" for ds in table.datasets.values() if ds.note]
    if table.profile == "smoke":
        notes.insert(0, "- Smoke profile: tiny models after a few updates on Bible data; the numbers only show that "
                        "the pipeline runs, they are not comparable with the paper's.")
    if notes:
        lines += ["Notes:", *notes, ""]
    if table.notes.strip():
        lines += [table.notes.strip(), ""]
    md = plan.out / f"{table.name}.md"
    md.write_text("\n".join(lines), encoding="utf-8")
    with open(plan.out / f"{table.name}.csv", "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)
    if table.plot:
        write_plot(plan, results)
    if table.heatmap and (plan.out / "heatmap" / "heatmap.md").is_file():
        pngs = sorted((plan.out / "heatmap").glob("*.png"))
        with open(md, "a", encoding="utf-8") as f:
            f.write("Attention heatmaps: " + ", ".join(f"![{p.name}](heatmap/{p.name})" for p in pngs) + "\n")
    return md


def write_plot(plan: Plan, results: Results) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table, spec = plan.table, plan.table.plot
    series = spec.get("series") or [{"x": spec.get("x", "row"), "y": y} for y in spec["y"]]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for line in series:
        x_key, y = line.get("x", "row"), line["y"]
        label = line.get("label") or next(c.label for c in table.columns if c.id == y)
        for source, style in (("ours", "-o"), ("paper", "--x")):
            points = []
            for r in table.rows:
                value = results.get((r.id, y)) if source == "ours" else (r.paper or {}).get(y)
                x = r.x if x_key == "row" else (results.get((r.id, x_key)) if source == "ours" else (r.paper or {}).get(x_key))
                if value is not None and x is not None and value == value and x == x:
                    points.append((x, value))
            if points:
                points.sort()
                ax.plot(*zip(*points), style, label=f"{label} ({source})")
    ax.set_xlabel(spec.get("xlabel", series[0].get("x", "row")))
    ax.set_ylabel(spec.get("ylabel", ""))
    if spec.get("xscale"):
        ax.set_xscale(spec["xscale"])
    ax.legend(fontsize=7)
    ax.set_title(table.title, fontsize=8)
    fig.tight_layout()
    path = plan.out / f"{table.name}.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- dry run


def _load_script(path: Path):
    spec = importlib.util.spec_from_file_location(f"prep_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


_PARSED: set = set()  # argument lists already parsed, paths left out: rows and seeds share most of them


def check_parses(step: Step) -> None:
    """Parse the step's arguments with the parser of the tool it runs; raise ConfigError if they do not."""
    from fairseq import options

    import fairseq_sparse  # noqa: F401  (registers the architectures and criteria)

    argv = step.argv
    key = (Path(argv[0]).name, *("PATH" if "/" in a else a for a in argv[1:]))
    if key in _PARSED:
        return
    try:
        if argv[0] == sys.executable and argv[1] == "-m":
            module = "fairseq_sparse.analysis.cli" if argv[2] == "fairseq_sparse.analysis" else argv[2]
            importlib.import_module(module).build_parser().parse_args(argv[3:])
        elif argv[0] == sys.executable:
            _load_script(Path(argv[1])).build_parser().parse_args(argv[2:])
        else:
            tool = Path(argv[0]).name
            if tool == "fairseq-preprocess":
                options.get_preprocessing_parser().parse_args(argv[1:])
            elif tool in ("fairseq-train", "fairseq-generate"):
                from fairseq.dataclass.utils import convert_namespace_to_omegaconf

                parser = options.get_training_parser() if tool == "fairseq-train" else options.get_generation_parser()
                convert_namespace_to_omegaconf(options.parse_args_and_arch(parser, input_args=argv[1:]))
            else:
                raise ConfigError(f"no parser known for {tool}")
    except SystemExit as e:
        raise ConfigError(f"{step.label}: the command does not parse (exit {e.code}):\n  {shlex.join(argv)}") from None
    _PARSED.add(key)


def dry_run(plan: Plan, steps: List[Step]) -> None:
    for step in steps:
        check_parses(step)
        print(f"ok  {step.label}: {shlex.join(step.argv)}")
    print(f"{plan.table.name} ({plan.table.profile}): {len(steps)} commands parse")


# ----------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fairseq_sparse.tables", description=__doc__.split("\n\n")[0])
    p.add_argument("config", help="configs/tables/NAME.yaml")
    p.add_argument("--profile", choices=PROFILES, default="smoke")
    p.add_argument("--out", help="output directory (default runs/tables/NAME/PROFILE)")
    p.add_argument("--data-root", default=str(ROOT / "runs" / "data"), help="prepared datasets (default: %(default)s)")
    p.add_argument("--raw-data", help="directory with one subdirectory of already-downloaded raw files per dataset id "
                                      "(default: $RAW_DATA; without either, data-prep scripts download)")
    p.add_argument("--models-root", default=str(ROOT / "runs" / "models"),
                   help="trained models, keyed by their training command so tables share them (default: %(default)s)")
    p.add_argument("--seeds", type=int, nargs="+", help="override the setting's seeds")
    p.add_argument("--dry-run", action="store_true", help="build and parse every command, run nothing")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing; write the report from the commands that have finished (cells count the seeds that did)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    import os

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    raw = args.raw_data or os.environ.get("RAW_DATA")
    try:
        table = load_table(Path(args.config), args.profile)
        out = Path(args.out) if args.out else ROOT / "runs" / "tables" / table.name / args.profile
        plan = Plan(table, out, Path(args.data_root), Path(raw).expanduser() if raw else None, args.seeds,
                    Path(args.models_root))
        steps = plan.steps()
        if args.dry_run:
            dry_run(plan, steps)
            return 0
        if args.report_only:
            plan.out.mkdir(parents=True, exist_ok=True)
            results = collect(plan, finished_only=True)
        else:
            results = collect(plan, execute(plan, steps))
        md = write_report(plan, results)
    except (ConfigError, StepError) as e:
        print(f"tables: error: {e}", file=sys.stderr)
        return 1
    print()
    print(md.read_text(encoding="utf-8"))
    print(f"written: {md}, {md.with_suffix('.csv')}" + (f", {md.with_suffix('.png')}" if table.plot else ""))
    failed_cells = {row for (row, _), value in results.items() if value != value}
    unexpected = sorted(failed_cells - {r.id for r in table.rows if r.may_fail})
    if unexpected:
        print(f"tables: error: these rows failed: {', '.join(unexpected)} (logs above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
