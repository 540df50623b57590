"""One command of a table and where its output goes (what the plan lists and the runner runs)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple


@dataclass
class Step:
    """One command and its output (a ``.done`` marker when it has no single output file); the
    runner's completion marker (``runner.completion_marker``) proves it ran to the end."""

    kind: str  # prep | train | average | generate | speed | pruned | attention (sources.py) | heatmap (heatmap.py)
    argv: List[str]
    output: Path
    log: Path
    label: str
    model: Optional[Tuple[str, str, int]] = None  # (dataset, row, seed) this step trains
    needs: Tuple[Tuple[str, str, int], ...] = ()  # models whose checkpoints it reads
    resumes_from: Optional[Path] = None  # what a run cut short leaves to go on from (a training's checkpoint_last.pt)
    runs_alone: bool = False  # its running time is a result (a decode's speed): --jobs stops the others meanwhile
