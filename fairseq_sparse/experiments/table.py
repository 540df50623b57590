"""A table as the runner uses it: its datasets, columns (what each measures) and rows (models), plain data.

``schema.py`` reads them from a YAML file and checks every reference; the modules that build and read
commands take them from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional


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
    gold_alignments: bool = False  # its split ``align`` and ``align.gold`` (fairseq_sparse.data.gold_alignments)


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
    # the paper's own scoring of this column, traced to its text or official scripts, printed beside
    # our BLEU signature (a paper table's BLEU column must say it)
    paper_scoring: str = ""
    sacrebleu_tokenize: str = "13a"
    baseline: Optional[str] = None
    generate_args: str = ""
    rounds: int = 3  # speed measures: rounds of decoding the row and its baseline in turn (smoke: 1)
    first_seeds: Optional[int] = None  # measured on the dataset's first N seeds only (None: every seed)
    epoch: Optional[int] = None  # valid_loss_at, valid_gap_at: the epoch whose validation loss the column shows
    aer_attention: str = "normal"  # aer: "normal" (alpha) or "shifted" (alpha[1:]) cross-attention
    aer_over: str = "layer"  # aer, averaged over layers: "layer" (heads averaged: AoL) or "best_head" (AoH)


@dataclass
class Row:
    id: str
    label: str
    args: str = ""
    generate_args: str = ""
    reuse: Optional[str] = None
    finetune_from: Optional[str] = None  # starts from that row's model: fresh optimizer and schedule
    # carries that row's run on (its last checkpoint's optimizer state and schedule; the row's args give
    # --continue-updates): python -m fairseq_sparse.train --continue-from
    continue_from: Optional[str] = None
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
    curves: bool = False  # the report plots each model's validation loss per epoch (training to convergence)
    slurm: Optional[dict] = None  # resources per kind of step on a Slurm cluster (experiments/resources.py)

    def row(self, row_id: str) -> Row:
        return next(r for r in self.rows if r.id == row_id)
