"""A table's attention heatmap, the one kind of step that belongs to the table rather than to a cell: the
models it draws, where it goes, and which sitting draws it. One object, as each cell's source in
``sources.py``: it builds its step from what the plan hands it and owns its output's place."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from fairseq_sparse.experiments.plan_view import PlanView
from fairseq_sparse.experiments.step import Step


class Heatmap:
    """Attention of chosen sentences, the given rows' models side by side (``fairseq_sparse.analysis heatmap``)."""

    kind = "heatmap"

    @staticmethod
    def folder(table: str) -> Path:
        """A table's heatmaps, relative to its output folder and to a record's folder alike: a record's
        folder keeps several tables, each with its own heatmaps."""
        return Path("heatmap") / table

    def drawn(self, plan: PlanView) -> Optional[Path]:
        """The folder of the heatmaps the table's output holds, once its step has run to the end."""
        folder = plan.out / self.folder(plan.table.name)
        return folder if (folder / "heatmap.md").is_file() else None

    @staticmethod
    def seed(plan: PlanView) -> int:
        """The seed whose models the heatmap draws: the table's first, whichever seeds a sitting runs."""
        return plan.seeds(plan.table.datasets[plan.table.heatmap["dataset"]])[0]

    def drawn_by(self, plan: PlanView, every_seed: bool = False) -> bool:
        """Whether the table has a heatmap and this sitting (or, ``every_seed``, the whole table) runs its seed."""
        if not plan.table.heatmap:
            return False
        ds = plan.table.datasets[plan.table.heatmap["dataset"]]
        return every_seed or self.seed(plan) in plan.seeds_to_run(ds)

    def step(self, plan: PlanView) -> Step:
        """The command drawing the heatmaps of ``seed``'s models."""
        drawn = plan.table.heatmap
        ds = plan.table.datasets[drawn["dataset"]]
        rows = [plan.table.row(r) for r in drawn["rows"]]
        seed = self.seed(plan)
        out = plan.out / self.folder(plan.table.name)
        argv = [sys.executable, "-m", "fairseq_sparse.analysis", "heatmap", str(plan.data_dir(ds) / "bin"),
                "--path", *[str(plan.checkpoint(ds, r, seed)) for r in rows], "--labels", *[r.label for r in rows],
                "--split", drawn.get("split", "test"), "--sentences", *[str(s) for s in drawn.get("sentences", [0])],
                "--sublayer", drawn.get("sublayer", "cross"), "--layer", str(drawn.get("layer", 0)),
                "--head", str(drawn.get("head", "mean")), "--out", str(out),
                "--model-overrides", *[plan.model_overrides(ds, r) for r in rows]] + (["--cpu"] if plan.smoke else [])
        return Step(self.kind, argv, out / "heatmap.md", plan.out / "heatmap.log", "attention heatmaps",
                    needs=tuple(plan.model_key(ds, r, seed) for r in rows))


HEATMAP = Heatmap()
