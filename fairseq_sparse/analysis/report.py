"""Markdown, CSV and PNG output of the analysis commands."""

import csv
import logging
from pathlib import Path
from typing import Dict, List, Sequence


def write_csv(path: Path, rows: List[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        if not rows:
            return
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    def cell(x):
        return f"{x:.4f}" if isinstance(x, float) else str(x)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def pyplot():
    """matplotlib.pyplot drawing to files, its DEBUG lines off (importing fairseq's models sets the
    root logger to DEBUG, and the font manager then prints ~130 lines a figure)."""
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # before the import, which logs too
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_layer_curves(path: Path, panels: Dict[str, Dict[str, List[float]]], ylabel: str = "") -> None:
    """One panel per title; in each, one curve per label over layers (1-based on the x-axis)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.5), squeeze=False)
    for ax, (title, curves) in zip(axes[0], panels.items()):
        for label, values in curves.items():
            ax.plot(range(1, len(values) + 1), values, marker="o", label=label)
        ax.set_title(title)
        ax.set_xlabel("layer")
        ax.set_ylabel(ylabel)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_histogram(path: Path, values: Sequence[float], edges: Sequence[float], title: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.hist(values, bins=list(edges))
    ax.set_xlabel("summed attention per source word")
    ax.set_ylabel("words")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_heatmaps(path: Path, matrices, titles, x_labels, y_labels, suptitle: str) -> None:
    """Side-by-side heatmaps (one per checkpoint) of the same sentence."""
    plt = pyplot()
    n = len(matrices)
    width = max(4.0, 0.3 * len(x_labels) + 2)
    height = max(3.0, 0.3 * len(y_labels) + 1.5)
    fig, axes = plt.subplots(1, n, figsize=(width * n, height), squeeze=False)
    for ax, matrix, title in zip(axes[0], matrices, titles):
        image = ax.imshow(matrix, cmap="Greys", vmin=0.0, aspect="auto")
        ax.set_xticks(range(len(x_labels)))
        ax.set_xticklabels(x_labels, rotation=90, fontsize=7)
        ax.set_yticks(range(len(y_labels)))
        ax.set_yticklabels(y_labels, fontsize=7)
        ax.set_title(title, fontsize=9)
        fig.colorbar(image, ax=ax, fraction=0.046)
    fig.suptitle(suptitle, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
