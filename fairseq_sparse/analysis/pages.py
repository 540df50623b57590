"""The output of each analysis sub-command in ``--out``: ``<name>.md``, ``<name>.csv`` and its figures,
from what ``head_stats``, ``alignment_error``, ``pruning`` and ``heatmap`` computed. Each writer
returns what the sub-command returns."""

import argparse
from pathlib import Path
from typing import Dict, List

from . import SUBLAYERS, report
from .alignment import aer_by_layer
from .alignment_error import AlignmentErrors
from .heatmap import Heatmap
from .pruning import LOW, PruningStats

MODES = ("normal", "shifted")  # cross-attention alpha, and alpha[1:] (the next target word's row)


def _mean(values: List[float]) -> float:
    return sum(values) / len(values)


def _per_head(values: List[float]) -> str:
    return " ".join(f"{x:.2f}" for x in values)


def write_zero_weights(rows: List[dict], args: argparse.Namespace) -> List[dict]:
    """Per sublayer: per layer the heads' mean share of zero weights, null rate and peak share, and each head's."""
    out = Path(args.out)
    report.write_csv(out / "zero_weights.csv", rows)
    curves: Dict[str, Dict[str, List[float]]] = {"zero weights": {}, "null rate": {}, "peak share": {}}
    text = [f"# Sparsity and null rate\n\ncheckpoint `{args.path}`, split `{args.split}`. Sparsity rate: fraction of "
            "attention weights over valid (unmasked) keys that are exactly 0; null rate: fraction of queries whose "
            "weights are all 0; peak share: the largest weight's share of its query's total weight, over the queries "
            "that attend (1 for hard retrieval; what decoding with hard retrieval keeps). Per layer: mean over heads.\n"]
    for sub in SUBLAYERS:
        sub_rows = [r for r in rows if r["sublayer"] == sub]
        if not sub_rows:
            continue
        table = []
        for layer in sorted({r["layer"] for r in sub_rows}):
            heads = [r for r in sub_rows if r["layer"] == layer]
            s, n, p = ([r[key] for r in heads] for key in ("zero_weights", "null_rate", "peak_share"))
            table.append([layer + 1, _mean(s), _mean(n), _mean(p), _per_head(s), _per_head(n), _per_head(p)])
        for column, name in enumerate(curves, 1):
            curves[name][sub] = [row[column] for row in table]
        text.append(f"## {sub}\n\n" + report.markdown_table(
            ["layer", "zero weights", "null rate", "peak share", "zero weights per head", "null rate per head",
             "peak share per head"], table) + "\n")
    (out / "zero_weights.md").write_text("\n".join(text), encoding="utf-8")
    report.plot_layer_curves(out / "zero_weights.png", curves)
    return rows


def write_diversity(rows: List[dict], args: argparse.Namespace) -> List[dict]:
    """Per temperature: per sublayer the divergence of each layer and their mean."""
    out = Path(args.out)
    report.write_csv(out / "diversity.csv", rows)
    text = [f"# Head diversity\n\ncheckpoint `{args.path}`, split `{args.split}`. Generalised Jensen-Shannon "
            "divergence between the heads of a layer (nats), averaged over queries: JS = H(mean_h p_h) - mean_h H(p_h). "
            "Rows of non-probability attention (ReLA) are re-normalised with softmax(alpha^tau); null rows are one-hot on "
            f"a dummy slot (entropy 0). Re-normalisation: `{args.renormalise}`.\n"]
    curves: Dict[str, Dict[str, List[float]]] = {}
    for tau in args.tau:
        table = []
        for sub in SUBLAYERS:
            values = [r["js_divergence"] for r in rows if r["tau"] == tau and r["sublayer"] == sub]
            if values:
                curves.setdefault(f"tau={tau:g}", {})[sub] = values
                table.append([sub, _mean(values)] + [f"{v:.3f}" for v in values])
        width = max(len(r) for r in table) - 2 if table else 0
        text.append(f"## tau = {tau:g}\n\n" + report.markdown_table(
            ["sublayer", "mean over layers"] + [f"layer {i + 1}" for i in range(width)],
            [r + [""] * (width + 2 - len(r)) for r in table]) + "\n")
    (out / "diversity.md").write_text("\n".join(text), encoding="utf-8")
    report.plot_layer_curves(out / "diversity.png", curves, "JS divergence")
    return rows


def write_aer(errors: AlignmentErrors, args: argparse.Namespace) -> List[dict]:
    """Per mode the layers' best head and layer AER, with AoH and AoL (their means over layers)."""
    out = Path(args.out)
    report.write_csv(out / "aer.csv", errors.rows)
    text = [f"# Alignment error rate\n\ncheckpoint `{args.path}`, split `{args.split}`, gold `{args.gold}`: "
            f"{errors.sentences} sentences ({errors.skipped} skipped: gold links outside the sentence's words). "
            "Cross-attention, subwords merged (target pieces averaged, source pieces summed), argmax per target word. "
            "Normal: alpha; shifted: alpha[1:]. Best head: lowest AER in the layer; layer: heads' attention averaged.\n"]
    curves = {}
    for mode in MODES:
        table = aer_by_layer(errors.rows, mode)
        if table:
            aoh, aol = _mean([r[2] for r in table]), _mean([r[3] for r in table])
            curves[f"{mode} attention"] = {"best head": [r[2] for r in table], "layer": [r[3] for r in table]}
            text.append(f"## {mode}\n\n" + report.markdown_table(["layer", "best head", "AER best head", "AER layer"], table)
                        + f"\n\nAoH (mean over layers of the best head): {aoh:.4f}; AoL (mean over layers of the layer "
                          f"attention): {aol:.4f}\n")
    (out / "aer.md").write_text("\n".join(text), encoding="utf-8")
    if curves:
        report.plot_layer_curves(out / "aer.png", curves, "AER")
    return errors.rows


def write_l0drop(stats: PruningStats, args: argparse.Namespace) -> dict:
    """The pruning rates by token type (if the checkpoint has gates) and the summed attention's histogram."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report.write_csv(out / "l0drop_types.csv", stats.types)
    report.write_csv(out / "l0drop_attention_hist.csv", stats.histogram)
    text = [f"# L0Drop analysis\n\ncheckpoint `{args.path}`, split `{args.split}`, source language `{stats.lang}` (HanTa).\n"]
    if stats.has_gates:
        text.append("## Pruning rate by token type\n\nSubwords: first piece BPEH, later pieces BPEO; whole words by POS.\n\n"
                    + report.markdown_table(["type", "pruned", "tokens", "pruning rate"],
                                            [[r["type"], r["pruned"], r["tokens"], r["pruning_rate"]] for r in stats.types])
                    + "\n")
    else:
        text.append("The checkpoint has no L0Drop gates or prune pattern: no pruning rates.\n")
    text.append("## Summed cross-attention per source word\n\nAveraged over layers and heads, summed over target steps and "
                f"over the word's pieces. {len(stats.summed)} words, mean {stats.mean:.3f}, {stats.below:.1%} below {LOW}. "
                "Histogram in `l0drop_attention_hist.csv` and `l0drop_attention_hist.png`.\n")
    (out / "l0drop.md").write_text("\n".join(text), encoding="utf-8")
    report.plot_histogram(out / "l0drop_attention_hist.png", stats.summed, stats.edges,
                          f"mean {stats.mean:.2f}, {stats.below:.1%} < {LOW}")
    return stats.result()


def write_heatmaps(maps: List[Heatmap], args: argparse.Namespace) -> List[Path]:
    """One figure per sentence, the checkpoints side by side, and ``heatmap.md`` showing them."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    labels = args.labels or [Path(p).stem for p in args.path]
    written = []
    for heatmap in maps:
        path = out / f"heatmap_{args.sublayer}_l{heatmap.layer}_h{args.head}_s{heatmap.sentence}.png"
        report.plot_heatmaps(path, heatmap.matrices, labels, heatmap.x, heatmap.y,
                             f"sentence {heatmap.sentence}, {args.sublayer} attention, layer {heatmap.layer}, head "
                             f"{args.head} (decoder queries labelled by their input token)")
        written.append(path)
    (out / "heatmap.md").write_text("# Attention heatmaps\n\n" + "\n".join(f"![{p.name}]({p.name})" for p in written) + "\n")
    return written
