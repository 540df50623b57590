"""What the sources of measurements, the measures and the output readers read of a table's plan.

``plan.Plan`` implements it; it is declared here, beside the table's data, so that those modules need
not import the plan, which imports them (imports go one way)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Protocol, Tuple

from fairseq_sparse.experiments.table import Column, Dataset, Row, Table


class PlanView(Protocol):
    table: Table
    out: Path  # the table's output folder
    smoke: bool  # the smoke profile (CPU, tiny models)
    bin: Path  # the folder of the fairseq-* commands
    user_dir: str  # the plugin, as fairseq's --user-dir

    def tool(self, name: str) -> List[str]: ...

    def data_dir(self, ds: Dataset) -> Path: ...

    def run_dir(self, ds: Dataset, row: Row, seed: int) -> Path: ...

    def checkpoint(self, ds: Dataset, row: Row, seed: int) -> Path: ...

    def model_key(self, ds: Dataset, row: Row, seed: int) -> Tuple[str, str, int]: ...

    def train_argv(self, ds: Dataset, row: Row, seed: int) -> List[str]: ...

    def generate_args(self, ds: Dataset, row: Row, col: Column) -> List[str]: ...

    def model_overrides(self, ds: Dataset, row: Row) -> str: ...

    def prunes(self, ds: Dataset, row: Row) -> bool: ...

    def seeds(self, ds: Dataset) -> List[int]: ...

    def seeds_to_run(self, ds: Dataset) -> List[int]: ...
