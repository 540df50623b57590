"""A table's configuration: its datasets, columns (measures) and rows (models), read and checked.

The YAML format is described in ``configs/README.md``; every reference (dataset, paper setting,
measure, row) is checked when the table is loaded, so a mistake is one error naming the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional

import yaml

from fairseq_sparse.experiments.errors import ConfigError
from fairseq_sparse.experiments.measures import EPOCH_MEASURES, MEASURES
from fairseq_sparse.experiments.table import Column, Dataset, Row, Table

CONFIGS = Path(__file__).resolve().parent.parent / "configs"  # shipped with the package
PROFILES = ("paper", "smoke")
METRICS = ("sacrebleu", "tokenized", "d_bleu")
# measures under their former names: "sparsity" was both of these; configurations written before still load
RENAMED_MEASURES = {"sparsity": "pruned", "attn_sparsity": "zero_weights"}
# measures that score translations with the column's metric
BLEU_MEASURES = ("bleu", "bleu_delta")


def table_names(configs: Path = CONFIGS) -> List[str]:
    return sorted(p.stem for p in (configs / "tables").glob("*.yaml"))


def resolve_config(name_or_path: str, configs: Path = CONFIGS) -> Path:
    """A table by name (``rela_table1``, shipped with the package) or by the path of a YAML file."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return path
    shipped = configs / "tables" / f"{name_or_path}.yaml"
    if shipped.is_file():
        return shipped
    raise ConfigError(f"no table named {name_or_path!r}; known: {', '.join(table_names(configs))} (or give a .yaml path)")


def _load_yaml(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"no such configuration file: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path}: not valid YAML{where}: {problem}") from e
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
    table_yaml = _load_yaml(path)
    for key in ("name", "title", "paper", "datasets", "columns", "rows"):
        if key not in table_yaml:
            raise ConfigError(f"{path}: missing key {key!r}")
    paper = _load_yaml(configs / "papers" / f"{table_yaml['paper']}.yaml")
    settings = paper.get("settings") or {}
    catalogue = _load_yaml(configs / "datasets.yaml")
    smoke = _load_yaml(configs / "smoke.yaml")

    datasets: Dict[str, Dataset] = {}
    for entry in table_yaml["datasets"]:
        ds_id = entry.get("id")
        if ds_id not in catalogue:
            raise ConfigError(f"{path}: dataset {ds_id!r} is not in {configs / 'datasets.yaml'}")
        if entry.get("setting") not in settings:
            raise ConfigError(f"{path}: dataset {ds_id}: setting {entry.get('setting')!r} is not in "
                              f"papers/{table_yaml['paper']}.yaml (known: {sorted(settings)})")
        info = catalogue[ds_id]
        setting = dict(settings[entry["setting"]])
        if "train" not in setting:
            raise ConfigError(f"papers/{table_yaml['paper']}.yaml: setting {entry['setting']} has no 'train'")
        prep = [info["prep"][profile]] if isinstance(info["prep"][profile], str) else list(info["prep"][profile])
        groups = entry.get("length_groups")
        if groups is not None:  # the test set cut by source length (ReLA Figure 2): splits test_len{g}of{N}
            if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
                raise ConfigError(f"{path}: dataset {ds_id}: length_groups must be a positive integer, got {groups!r}")
            prep.append(f"fairseq_sparse.data.length_groups --out {{out}} --pair {info['src']}-{info['tgt']} "
                        f"--groups {groups}")
        gold = entry.get("gold_alignments")
        if gold is not None:  # RWTH's German-English gold alignments as split "align" (ReLA Table 5)
            if gold != "rwth":
                raise ConfigError(f"{path}: dataset {ds_id}: gold_alignments must be rwth, got {gold!r}")
            where = "{source}" if profile == "paper" else "--stand-in diagonal"
            prep.append(f"fairseq_sparse.data.gold_alignments --out {{out}} --pair {info['src']}-{info['tgt']} {where}")
        if entry.get("pos_prune_table") is not None:  # L0Drop's POS pattern: {out}/pos-table.SRC, a row's {data}/pos-table.SRC
            if entry["pos_prune_table"] is not True or info["src"] not in ("en", "de"):
                raise ConfigError(f"{path}: dataset {ds_id}: pos_prune_table takes true, for an English or German source "
                                  f"(HanTa's models), got {entry['pos_prune_table']!r} with source {info['src']}")
            limit = "" if profile == "paper" else " --max-sentences 300"
            # the BPE text fairseq reads: every prepared dataset keeps it (the tokenised text only some do)
            prep.append(f"fairseq_sparse.data.pos_prune_table {{out}}/train.{info['src']} --bpe --lang {info['src']} "
                        f"--out {{out}}/pos-table.{info['src']}{limit}")
        datasets[ds_id] = Dataset(
            id=ds_id, label=info["label"], src=info["src"], tgt=info["tgt"],
            prep=prep,
            post_process=info.get("post_process", "subword_nmt") if profile == "paper" else "subword_nmt",
            documents=bool(info.get("documents", False)),
            detok=info.get("detok", "moses") if profile == "paper" else "moses",
            note=info.get("smoke_note", "") if profile == "smoke" else "",
            setting=setting, train_args=entry.get("train_args", "") or "",
            generate_args=entry.get("generate_args", "") or "", gold_alignments=gold is not None)

    columns = [Column(**_fields(Column, c, f"{path}: column {c.get('id')}")) for c in table_yaml["columns"]]
    rows = [Row(**_fields(Row, r, f"{path}: row {r.get('id')}")) for r in table_yaml["rows"]]
    for entry in (*columns, *rows):  # YAML reads a bare null, yes or 12 as no string: say so here
        for key in ("id", "label"):
            if not isinstance(getattr(entry, key), str) or not getattr(entry, key):
                raise ConfigError(f"{path}: {type(entry).__name__.lower()} {entry.id!r}: {key} must be a non-empty "
                                  f"string, got {getattr(entry, key)!r} (quote it in the YAML)")
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
        if c.measure == "valid_bleu":  # an alias: BLEU on the validation set
            c.measure, c.split = "bleu", "valid"
        c.measure = RENAMED_MEASURES.get(c.measure, c.measure)
        if c.measure not in MEASURES:
            raise ConfigError(f"{where}: unknown measure {c.measure!r}; known: {', '.join(['valid_bleu', *MEASURES])}")
        if c.metric not in METRICS:
            raise ConfigError(f"{where}: unknown metric {c.metric!r}; known: {', '.join(METRICS)}")
        if c.metric == "d_bleu" and not datasets[c.dataset].documents:
            raise ConfigError(f"{where}: d_bleu needs a document-level dataset, {c.dataset} is not one")
        if c.measure in BLEU_MEASURES and datasets[c.dataset].documents and c.metric != "d_bleu":
            # its references are whole documents and its hypotheses blocks: no sentence-level score exists
            raise ConfigError(f"{where}: {c.dataset} is document-level: {c.measure} needs metric: d_bleu, got {c.metric}")
        if not isinstance(c.rounds, int) or isinstance(c.rounds, bool) or c.rounds < 1:
            raise ConfigError(f"{where}: rounds must be a whole number of at least 1, got {c.rounds!r}")
        if c.first_seeds is not None and (not isinstance(c.first_seeds, int) or isinstance(c.first_seeds, bool)
                                          or c.first_seeds < 1):
            raise ConfigError(f"{where}: first_seeds must be a whole number of at least 1, got {c.first_seeds!r}")
        if (c.measure in EPOCH_MEASURES) != (c.epoch is not None) or (
                c.epoch is not None and (not isinstance(c.epoch, int) or isinstance(c.epoch, bool) or c.epoch < 1)):
            raise ConfigError(f"{where}: measures {' and '.join(EPOCH_MEASURES)} need epoch (a whole number of at least 1), "
                              f"and only they take one; got measure {c.measure!r}, epoch {c.epoch!r}")
        if c.measure == "aer" and not (datasets[c.dataset].gold_alignments and c.split == "align"):
            raise ConfigError(f"{where}: aer reads split align of a dataset with gold_alignments: rwth "
                              f"(got split {c.split!r} of {c.dataset})")
        if (c.aer_attention, c.aer_over) != ("normal", "layer") and c.measure != "aer" or (
                c.aer_attention not in ("normal", "shifted") or c.aer_over not in ("layer", "best_head")):
            raise ConfigError(f"{where}: aer_attention (normal or shifted) and aer_over (layer or best_head) are "
                              f"for measure aer; got {c.aer_attention!r} and {c.aer_over!r} with {c.measure!r}")
        if MEASURES[c.measure].relative and c.baseline not in row_ids:
            raise ConfigError(f"{where}: {c.measure} needs 'baseline:' naming a row, got {c.baseline!r}")
    seen: List[str] = []
    for r in rows:
        where = f"{path}: row {r.id}"
        starts = {"reuse": r.reuse, "finetune_from": r.finetune_from, "continue_from": r.continue_from}
        for what, ref in starts.items():
            if ref is not None and ref not in seen:
                raise ConfigError(f"{where}: {what} {ref!r} must name an earlier row (earlier: {seen})")
        if sum(ref is not None for ref in starts.values()) > 1:
            raise ConfigError(f"{where}: a row reuses, fine-tunes or continues a model, only one of them")
        if r.continue_from and "--continue-updates" not in r.args:
            raise ConfigError(f"{where}: continue_from needs --continue-updates N in args (updates beyond the base's)")
        for ds_id in list(r.datasets or []) + list(r.args_by_dataset or {}):
            if ds_id not in datasets:
                raise ConfigError(f"{where}: dataset {ds_id!r} is not among the table's datasets {sorted(datasets)}")
        if r.setting is not None and r.setting not in settings:
            raise ConfigError(f"{where}: setting {r.setting!r} is not in papers/{table_yaml['paper']}.yaml (known: {sorted(settings)})")
        unknown = set(r.paper or {}) - set(column_ids)
        if unknown:
            raise ConfigError(f"{where}: paper numbers for unknown column(s) {sorted(unknown)}")
        seen.append(r.id)
    plot = table_yaml.get("plot")
    if plot:
        lines = plot.get("series") or [{"x": plot.get("x", "row"), "y": y} for y in plot.get("y", [])]
        if not lines:
            raise ConfigError(f"{path}: plot needs 'y' (column ids) or 'series' ([{{x, y, label}}])")
        for line in lines:
            if line.get("y") not in column_ids:
                raise ConfigError(f"{path}: plot y {line.get('y')!r} is not a column")
            if line.get("x", "row") != "row" and line["x"] not in column_ids:
                raise ConfigError(f"{path}: plot x {line['x']!r} is neither 'row' nor a column")
    curves = table_yaml.get("curves", False)
    if not isinstance(curves, bool):
        raise ConfigError(f"{path}: curves must be true or false, got {curves!r}")
    heatmap = table_yaml.get("heatmap")
    if heatmap:
        unknown = set(heatmap) - {"rows", "dataset", "sentences", "sublayer", "layer", "head", "split"}
        if unknown:
            raise ConfigError(f"{path}: heatmap: unknown key(s) {sorted(unknown)}")
        if heatmap.get("dataset") not in datasets or not heatmap.get("rows") or set(heatmap["rows"]) - set(row_ids):
            raise ConfigError(f"{path}: heatmap needs 'dataset' (one of the table's) and 'rows' (row ids)")
    return Table(name=table_yaml["name"], title=table_yaml["title"], source=table_yaml.get("source", ""), notes=table_yaml.get("notes", "") or "",
                 profile=profile, datasets=datasets, columns=columns, rows=rows, smoke=smoke, plot=plot, path=path,
                 settings=settings, heatmap=heatmap, curves=curves, slurm=table_yaml.get("slurm"))


