"""A table's attention heatmap: the models it draws, where it goes, and which sitting draws it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from fairseq_sparse.experiments.plan_view import PlanView
from fairseq_sparse.experiments.step import Step


def heatmap_folder(table: str) -> Path:
    """A table's heatmaps, relative to its output folder and to a record's folder alike: a record's
    folder keeps several tables, each with its own heatmaps."""
    return Path("heatmap") / table


def drawn_heatmaps(plan: PlanView) -> Optional[Path]:
    """The folder of the heatmaps the table's output holds, once its heatmap step has run to the end."""
    folder = plan.out / heatmap_folder(plan.table.name)
    return folder if (folder / "heatmap.md").is_file() else None


def heatmap_seed(plan: PlanView) -> int:
    """The seed whose models the heatmap draws: the table's first, whichever seeds a sitting runs."""
    return plan.seeds(plan.table.datasets[plan.table.heatmap["dataset"]])[0]


def draws_heatmap(plan: PlanView, every_seed: bool = False) -> bool:
    """Whether the table has a heatmap and this sitting (or, ``every_seed``, the whole table) runs its seed."""
    if not plan.table.heatmap:
        return False
    ds = plan.table.datasets[plan.table.heatmap["dataset"]]
    return every_seed or heatmap_seed(plan) in plan.seeds_to_run(ds)


def heatmap_step(plan: PlanView) -> Step:
    """Attention of chosen sentences, the given rows' models side by side (``heatmap_seed``'s)."""
    spec = plan.table.heatmap
    ds = plan.table.datasets[spec["dataset"]]
    rows = [plan.table.row(r) for r in spec["rows"]]
    seed = heatmap_seed(plan)
    out = plan.out / heatmap_folder(plan.table.name)
    argv = [sys.executable, "-m", "fairseq_sparse.analysis", "heatmap", str(plan.data_dir(ds) / "bin"),
            "--path", *[str(plan.checkpoint(ds, r, seed)) for r in rows], "--labels", *[r.label for r in rows],
            "--split", spec.get("split", "test"), "--sentences", *[str(s) for s in spec.get("sentences", [0])],
            "--sublayer", spec.get("sublayer", "cross"), "--layer", str(spec.get("layer", 0)),
            "--head", str(spec.get("head", "mean")), "--out", str(out),
            "--model-overrides", *[plan.model_overrides(ds, r) for r in rows]] + (["--cpu"] if plan.smoke else [])
    return Step("heatmap", argv, out / "heatmap.md", plan.out / "heatmap.log", "attention heatmaps",
                needs=tuple(plan.model_key(ds, r, seed) for r in rows))
