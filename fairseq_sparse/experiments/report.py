"""The table: every cell measured and averaged over seeds, written as Markdown, CSV and a plot."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from fairseq_sparse.analysis.report import pyplot
from fairseq_sparse.experiments.cells import Results
from fairseq_sparse.experiments.heatmap import HEATMAP
from fairseq_sparse.experiments.measures import MEASURES
from fairseq_sparse.experiments.outputs import (timed_on_node, train_loss_per_epoch, trained_side_by_side,
                                                valid_loss_per_epoch)
from fairseq_sparse.experiments.plan import Plan
from fairseq_sparse.experiments.record import Record
from fairseq_sparse.experiments.runner import relative_to_cwd
from fairseq_sparse.experiments.table import Column

def fmt(value: Optional[float], col: Column, spread: Optional[Tuple[float, int]] = None, failed: bool = False) -> str:
    """A cell: the mean over seeds, "± std" when more than one seed finished; "failed"; "—" (not applicable
    or not measured)."""
    if failed:
        return "failed"
    if value is None:
        return "—"
    digits, signed = MEASURES[col.measure].digits, MEASURES[col.measure].signed
    text = f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"
    if spread and spread[1] > 1:
        text += f" ± {spread[0]:.{digits}f}"
    return text


def side_by_side_trainings(plan: Plan, record: Optional[Record] = None) -> List[str]:
    """"row seed N" of each model trained beside others, where a column reads the training's clock
    (from its log, or from the record where this machine no longer has the log)."""
    table, shared = plan.table, []
    for col in [c for c in table.columns if MEASURES[c.measure].timed]:
        ds = table.datasets[col.dataset]
        for row in [r for r in table.rows if plan.applies(ds, r)]:
            for seed in plan.column_seeds(ds, col):
                name = f"{plan.trained_row(row).id} seed {seed}"
                recorded = record.cells.get((ds.id, row.id, col.id, seed)) if record else None
                if name not in shared and (trained_side_by_side(plan.run_dir(ds, row, seed) / "train.log")
                                           or (recorded and recorded.side_by_side)):
                    shared.append(name)
    return shared


def write_report(plan: Plan, results: Results, record: Optional[Record] = None) -> Path:
    table = plan.table
    # a "(paper)" column only where some row quotes the paper: tables of our own (demo, study) stay readable
    quoted = {col.id for col in table.columns if any(col.id in (row.paper or {}) for row in table.rows)}
    header = ["model"]
    for col in table.columns:
        header += [col.label] + ([f"{col.label} (paper)"] if col.id in quoted else [])
    lines = [f"# {table.title}", "",
             f"Profile `{table.profile}`; source: {table.source}; configuration `{relative_to_cwd(str(table.path))}`; "
             f"commands: `{relative_to_cwd(str(plan.out / 'commands.sh'))}`.", "",
             "| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]
    records = []
    for row in table.rows:
        cells = [row.label]
        for col in table.columns:
            ours, theirs = results.get((row.id, col.id)), (row.paper or {}).get(col.id)
            spread, failed = results.spreads.get((row.id, col.id)), (row.id, col.id) in results.failures
            cells += [fmt(ours, col, spread, failed)] + ([fmt(theirs, col)] if col.id in quoted else [])
            records.append({"row": row.id, "model": row.label, "column": col.id, "label": col.label, "dataset": col.dataset,
                            "measure": col.measure, "split": col.split,
                            "ours": "failed" if failed else ("" if ours is None else f"{ours:.4f}"),
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
        for cid, sig in results.signatures.items():
            col = next(c for c in table.columns if c.id == cid)
            lines.append(f"- {col.label}: `{sig}`" + (f"; the paper: {col.paper_scoring}" if col.paper_scoring else ""))
        lines.append("")
    if results.failures:
        lines.append("Failed cells (a seed of theirs did not finish or could not be read):")
        lines += [f"- {row} / {col}: {why}" for (row, col), why in sorted(results.failures.items())]
        lines.append("")
    notes = [f"- {ds.label}: {ds.note}" for ds in table.datasets.values() if ds.note]
    if table.profile == "smoke":
        notes.insert(0, "- Smoke profile: tiny models after a few updates on Bible data; the numbers only show that "
                        "the pipeline runs, they are not comparable with the paper's.")
    shared = side_by_side_trainings(plan, record)
    if shared:
        notes.append(f"- Trained side by side with other models (`--jobs`) for all or part of the run: {', '.join(shared)}. "
                     "Their training times are those of a shared machine, not comparable with those of models trained alone.")
    nodes = [f"{step.label}: {node}" for step in plan.steps(every_seed=True) if step.runs_alone
             for node in [timed_on_node(step.log)] if node]
    if nodes:
        notes.append("- Timed on a Slurm node of their own (`--exclusive`): " + "; ".join(nodes) + ".")
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
    if table.curves and write_curves(plan, record):
        with open(md, "a", encoding="utf-8") as f:
            f.write(f"Validation loss per epoch of every model: ![curves]({table.name}.curves.png) "
                    f"(numbers: `{table.name}.curves.csv`).\n\n")
    heatmap = heatmap_dir(plan, record)
    if table.heatmap and heatmap:
        pngs = sorted(heatmap.glob("*.png"))
        folder = HEATMAP.folder(table.name).as_posix()
        with open(md, "a", encoding="utf-8") as f:
            f.write(f"Attention heatmaps (seed {HEATMAP.seed(plan)}'s models): "
                    + ", ".join(f"![{p.name}]({folder}/{p.name})" for p in pngs) + "\n")
    return md


def heatmap_dir(plan: Plan, record: Optional[Record] = None) -> Optional[Path]:
    """The folder of the table's attention heatmaps: drawn here, else kept in the record's folder."""
    drawn = HEATMAP.drawn(plan)
    if drawn:
        return drawn
    return record.heatmap_dir if record and record.has_heatmap() else None


# train_loss: the epoch's mean training loss (empty in curves recorded before it was kept); run: 1 for
# a model's first training, 2, 3, ... for each time the same command trained it again from scratch
CURVE_FIELDS = ["dataset", "row", "seed", "run", "model", "epoch", "valid_loss", "train_loss"]


def continues(recorded: Dict[int, float], logged: Dict[int, float]) -> bool:
    """Whether a training log is the recorded run itself (resumed or still going), not the same command
    trained again: the two agree on every epoch both have, except the recorded curve's last, which a run
    killed after validating but before saving its checkpoint validates again when it resumes."""
    last = max(recorded)
    return all(logged[e] == loss for e, loss in recorded.items() if e in logged and e != last)


def model_runs(kept: List[dict], logged: List[dict]) -> List[dict]:
    """Every run of one model (one training command) as curve lines: the recorded runs, the training log
    extending the run it continues (never two runs spliced: a shorter log keeps that run's recorded
    curve) or added as the next run. A continuation needs the model again after its checkpoints were
    lost, so the same command trains twice; the first run's curve stays beside the cells measured from
    it, and the second's shows how far a rerun moves."""
    runs: Dict[int, List[dict]] = {}
    for line in kept:
        runs.setdefault(line["run"], []).append(line)
    if logged:
        curve = {line["epoch"]: line["valid_loss"] for line in logged}
        same = [r for r, lines in runs.items() if continues({l["epoch"]: l["valid_loss"] for l in lines}, curve)]
        run = same[-1] if same else max(runs, default=0) + 1
        if len(logged) >= len(runs.get(run, [])):
            runs[run] = logged
    return [{**line, "run": run} for run in sorted(runs) for line in runs[run]]


def write_curves(plan: Plan, record: Optional[Record] = None) -> Optional[Path]:
    """NAME.curves.png and .csv: each trained model's validation loss per epoch (what shows a run
    converged; the .csv also its training loss), one colour per row, one line style per seed; None if
    no model has validated yet.
    A model whose log this machine no longer has keeps the curve recorded for it (same run directory
    name), and one trained again from scratch keeps both runs (``model_runs``). A recorded curve of a
    seed this run does not plan (``--seeds 2`` of a few rows of a table planned for seed 1) is kept too:
    rendering the report never loses a curve of the record."""
    table, records, seen = plan.table, [], set()
    kept = record.curves() if record else []
    for ds in [table.datasets[i] for i in dict.fromkeys(c.dataset for c in table.columns)]:
        seeds = sorted(set(plan.seeds(ds)) | {r["seed"] for r in kept if r["dataset"] == ds.id})
        for row in [r for r in table.rows if plan.applies(ds, r)]:
            for seed in seeds:
                run = plan.run_dir(ds, row, seed)
                if run in seen:  # a row that reuses another's model
                    continue
                seen.add(run)
                trained = train_loss_per_epoch(run / "train.log")
                logged = [{"dataset": ds.id, "row": plan.trained_row(row).id, "seed": seed, "model": run.name, "epoch": epoch,
                           "valid_loss": loss, "train_loss": trained.get(epoch)}
                          for epoch, loss in sorted(valid_loss_per_epoch(run / "train.log").items())]
                records += model_runs([r for r in kept if (r["dataset"], r["model"]) == (ds.id, run.name)], logged)
    if not records:
        return None
    with open(plan.out / f"{table.name}.curves.csv", "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CURVE_FIELDS)
        writer.writeheader()
        writer.writerows({**r, "train_loss": "" if r.get("train_loss") is None else r["train_loss"]} for r in records)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    rows = list(dict.fromkeys(r["row"] for r in records))
    seeds = sorted({r["seed"] for r in records})
    for key in dict.fromkeys((r["dataset"], r["row"], r["seed"], r["run"]) for r in records):
        points = [(r["epoch"], r["valid_loss"]) for r in records if (r["dataset"], r["row"], r["seed"], r["run"]) == key]
        ax.plot(*zip(*points), color=f"C{rows.index(key[1]) % 10}", linestyle=["-", "--", ":", "-."][seeds.index(key[2]) % 4],
                alpha=1.0 if key[3] == 1 else 0.5,
                label=f"{key[1]} (seed {key[2]}{f', run {key[3]}' if key[3] > 1 else ''})"
                      + (f", {key[0]}" if len(table.datasets) > 1 else ""))
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation loss (base 2)")
    ax.set_title(table.name, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    png = plan.out / f"{table.name}.curves.png"
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return png


def write_plot(plan: Plan, results: Results) -> Path:
    plt = pyplot()
    table, plot = plan.table, plan.table.plot
    series = plot.get("series") or [{"x": plot.get("x", "row"), "y": y} for y in plot["y"]]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for line in series:
        x_key, y = line.get("x", "row"), line["y"]
        label = line.get("label") or next(c.label for c in table.columns if c.id == y)
        for source, style in (("ours", "-o"), ("paper", "--x")):
            points = []
            for r in table.rows:
                value = results.get((r.id, y)) if source == "ours" else (r.paper or {}).get(y)
                x = r.x if x_key == "row" else (results.get((r.id, x_key)) if source == "ours" else (r.paper or {}).get(x_key))
                if value is not None and x is not None:  # a failed cell has no mean
                    points.append((x, value))
            if points:
                points.sort()
                ax.plot(*zip(*points), style, label=f"{label} ({source})")
    ax.set_xlabel(plot.get("xlabel", series[0].get("x", "row")))
    ax.set_ylabel(plot.get("ylabel", ""))
    if plot.get("xscale"):
        ax.set_xscale(plot["xscale"])
    ax.legend(fontsize=7)
    ax.set_title(table.title, fontsize=8)
    fig.tight_layout()
    path = plan.out / f"{table.name}.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
