"""``python -m fairseq_sparse.analysis SUBCOMMAND DATA --path CHECKPOINT [--split test] --out DIR``.

Subcommands: sparsity, diversity, aer, l0drop, heatmap (attention of checkpoints) and
bible-alignments (gold alignments from the bible-alignments wheel). Each writes
``<name>.md`` and ``<name>.csv`` (and PNG figures) into ``--out``.
"""

import argparse
import logging
import math
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Dict, List, Optional

import torch

from ..checkpoint_loading import CheckpointLoadError
from . import SUBLAYERS, alignment, diversity, l0drop_stats, report, sparsity
from .collect import NotASparseModel, attention_modules, batches, load


def _pieces(dictionary, tokens) -> List[str]:
    return [dictionary[int(t)] for t in tokens]


# ---------------------------------------------------------------- sparsity

def run_sparsity(model, task, args) -> List[dict]:
    acc = {}
    for batch in batches(model, task, args.split, args.max_tokens, args.max_sentences, cpu=args.cpu):
        for sub, w in batch.weights.items():
            for layer in range(w.size(0)):
                z, t = sparsity.sparsity_counts(w[layer], batch.valid[sub])
                n, q = sparsity.null_counts(w[layer], batch.valid[sub])
                p, a = sparsity.peak_share_sums(w[layer], batch.valid[sub])
                counts = torch.stack([c.double() for c in (z, t, n, q, p, a)]).cpu()
                acc[(sub, layer)] = acc.get((sub, layer), 0) + counts
    rows = []
    for (sub, layer), (z, t, n, q, p, a) in sorted(acc.items(), key=lambda kv: (SUBLAYERS.index(kv[0][0]), kv[0][1])):
        for head in range(len(z)):
            rows.append({"sublayer": sub, "layer": layer, "head": head, "sparsity": float(sparsity.rate(z[head], t[head])),
                         "null_rate": float(sparsity.rate(n[head], q[head])), "peak_share": float(sparsity.rate(p[head], a[head])),
                         "weights": int(t[head]), "queries": int(q[head])})
    out = Path(args.out)
    report.write_csv(out / "sparsity.csv", rows)
    curves = {"sparsity rate": {}, "null rate": {}, "peak share": {}}
    text = [f"# Sparsity and null rate\n\ncheckpoint `{args.path}`, split `{args.split}`. Sparsity rate: fraction of "
            "attention weights over valid (unmasked) keys that are exactly 0; null rate: fraction of queries whose "
            "weights are all 0; peak share: the largest weight's share of its query's total weight, over the queries "
            "that attend (1 for hard retrieval; what decoding with hard retrieval keeps). Per layer: mean over heads.\n"]
    for sub in SUBLAYERS:
        sub_rows = [r for r in rows if r["sublayer"] == sub]
        if not sub_rows:
            continue
        layers = sorted({r["layer"] for r in sub_rows})
        table = []
        for layer in layers:
            heads = [r for r in sub_rows if r["layer"] == layer]
            s = [r["sparsity"] for r in heads]
            n = [r["null_rate"] for r in heads]
            p = [r["peak_share"] for r in heads]
            table.append([layer + 1, sum(s) / len(s), sum(n) / len(n), sum(p) / len(p),
                          " ".join(f"{x:.2f}" for x in s), " ".join(f"{x:.2f}" for x in n), " ".join(f"{x:.2f}" for x in p)])
        curves["sparsity rate"][sub] = [row[1] for row in table]
        curves["null rate"][sub] = [row[2] for row in table]
        curves["peak share"][sub] = [row[3] for row in table]
        text.append(f"## {sub}\n\n" + report.markdown_table(
            ["layer", "sparsity", "null rate", "peak share", "sparsity per head", "null rate per head",
             "peak share per head"], table) + "\n")
    (out / "sparsity.md").write_text("\n".join(text), encoding="utf-8")
    report.plot_layer_curves(out / "sparsity.png", curves)
    return rows


# ---------------------------------------------------------------- diversity

def _renormalise(mode: str, attn_fn: str) -> bool:
    return mode == "always" or (mode == "auto" and attn_fn.startswith("rela"))


def run_diversity(model, task, args) -> List[dict]:
    sums: Dict = defaultdict(float)
    counts: Dict = defaultdict(int)
    fns: Dict = {}
    for batch in batches(model, task, args.split, args.max_tokens, args.max_sentences, cpu=args.cpu):
        for sub, w in batch.weights.items():
            for layer in range(w.size(0)):
                fn = batch.attn_fn[sub][layer]
                fns[(sub, layer)] = fn
                for tau in args.tau:
                    js = diversity.head_diversity(w[layer], batch.valid[sub], _renormalise(args.renormalise, fn), tau)
                    real = ~torch.isnan(js)
                    sums[(tau, sub, layer)] += float(js[real].sum())
                    counts[(tau, sub, layer)] += int(real.sum())
    rows = [{"tau": tau, "sublayer": sub, "layer": layer, "attn_fn": fns[(sub, layer)],
             "renormalised": _renormalise(args.renormalise, fns[(sub, layer)]),
             "js_divergence": sums[(tau, sub, layer)] / max(counts[(tau, sub, layer)], 1), "queries": counts[(tau, sub, layer)]}
            for (tau, sub, layer) in sorted(sums, key=lambda k: (k[0], SUBLAYERS.index(k[1]), k[2]))]
    out = Path(args.out)
    report.write_csv(out / "diversity.csv", rows)
    text = [f"# Head diversity\n\ncheckpoint `{args.path}`, split `{args.split}`. Generalised Jensen-Shannon "
            "divergence between the heads of a layer (nats), averaged over queries: JS = H(mean_h p_h) - mean_h H(p_h). "
            "Rows of non-probability attention (ReLA) are re-normalised with softmax(alpha^tau); null rows are one-hot on "
            f"a dummy slot (entropy 0). Re-normalisation: `{args.renormalise}`.\n"]
    curves = {}
    for tau in args.tau:
        table = []
        for sub in SUBLAYERS:
            values = [r["js_divergence"] for r in rows if r["tau"] == tau and r["sublayer"] == sub]
            if values:
                curves.setdefault(f"tau={tau:g}", {})[sub] = values
                table.append([sub, sum(values) / len(values)] + [f"{v:.3f}" for v in values])
        width = max(len(r) for r in table) - 2 if table else 0
        text.append(f"## tau = {tau:g}\n\n" + report.markdown_table(
            ["sublayer", "mean over layers"] + [f"layer {i + 1}" for i in range(width)],
            [r + [""] * (width + 2 - len(r)) for r in table]) + "\n")
    (out / "diversity.md").write_text("\n".join(text), encoding="utf-8")
    report.plot_layer_curves(out / "diversity.png", curves, "JS divergence")
    return rows


# ---------------------------------------------------------------- aer

def read_gold(path: str, reversed_: bool):
    gold = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            sure, possible = alignment.parse_pharaoh(line)
            if reversed_:
                sure, possible = alignment.reverse(sure), alignment.reverse(possible)
            gold.append((sure, possible))
    return gold


def run_aer(model, task, args) -> List[dict]:
    gold = read_gold(args.gold, args.gold_reversed)
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    pad = src_dict.pad()
    counts: Dict = defaultdict(lambda: [0, 0, 0, 0])
    sentences = skipped = 0
    limit = len(gold) if args.max_sentences is None else min(len(gold), args.max_sentences)
    for batch in batches(model, task, args.split, args.max_tokens, limit, cpu=args.cpu):
        cross = batch.weights["cross"]  # (L, H, B, T, S)
        for b in range(cross.size(2)):
            sid = int(batch.ids[b])
            src_pos, tgt_pos = batch.sentence(b, pad)
            src_pieces = _pieces(src_dict, batch.src_tokens[b, src_pos[:-1]])
            tgt_pieces = _pieces(tgt_dict, batch.target[b, tgt_pos[:-1]])
            src_spans, tgt_spans = alignment.word_spans(src_pieces), alignment.word_spans(tgt_pieces)
            sure, possible = gold[sid]
            if any(i >= len(src_spans) or j >= len(tgt_spans) for i, j in possible | sure):
                skipped += 1
                continue
            sentences += 1
            attn = cross[:, :, b][:, :, tgt_pos][..., src_pos].double().cpu()  # (L, H, T, S)
            for mode in ("normal", "shifted"):
                merged = alignment.merge_subwords(alignment.target_rows(attn, mode == "shifted"), tgt_spans, src_spans)
                for layer in range(merged.size(0)):
                    candidates = [(h, merged[layer, h]) for h in range(merged.size(1))] + [("layer", merged[layer].mean(0))]
                    for head, matrix in candidates:
                        hyp = alignment.extract_alignment(matrix)
                        c = alignment.aer_counts(hyp, sure, possible)
                        key = (mode, layer, head)
                        counts[key] = [x + y for x, y in zip(counts[key], c)]
    rows = [{"mode": mode, "layer": layer, "head": head, "aer": alignment.aer(c), "links": c[2], "sure": c[3]}
            for (mode, layer, head), c in counts.items()]
    out = Path(args.out)
    report.write_csv(out / "aer.csv", rows)
    text = [f"# Alignment error rate\n\ncheckpoint `{args.path}`, split `{args.split}`, gold `{args.gold}`: "
            f"{sentences} sentences ({skipped} skipped: gold links outside the sentence's words). Cross-attention, "
            "subwords merged (target pieces averaged, source pieces summed), argmax per target word. Normal: alpha; "
            "shifted: alpha[1:]. Best head: lowest AER in the layer; layer: heads' attention averaged.\n"]
    curves = {}
    for mode in ("normal", "shifted"):
        table = []
        layers = sorted({r["layer"] for r in rows if r["mode"] == mode})
        for layer in layers:
            heads = [r for r in rows if r["mode"] == mode and r["layer"] == layer and r["head"] != "layer"]
            best = min(heads, key=lambda r: r["aer"])
            layer_row = next(r for r in rows if r["mode"] == mode and r["layer"] == layer and r["head"] == "layer")
            table.append([layer + 1, best["head"], best["aer"], layer_row["aer"]])
        if table:
            aoh = sum(r[2] for r in table) / len(table)
            aol = sum(r[3] for r in table) / len(table)
            curves[f"{mode} attention"] = {"best head": [r[2] for r in table], "layer": [r[3] for r in table]}
            text.append(f"## {mode}\n\n" + report.markdown_table(["layer", "best head", "AER best head", "AER layer"], table)
                        + f"\n\nAoH (mean over layers of the best head): {aoh:.4f}; AoL (mean over layers of the layer "
                          f"attention): {aol:.4f}\n")
    (out / "aer.md").write_text("\n".join(text), encoding="utf-8")
    if curves:
        report.plot_layer_curves(out / "aer.png", curves, "AER")
    return rows


# ---------------------------------------------------------------- l0drop

def run_l0drop(model, task, args) -> dict:
    from .postags import TYPES, Tagger, piece_types

    lang = args.lang or task.cfg.source_lang
    tagger = Tagger(lang)
    src_dict = task.source_dictionary
    pad = src_dict.pad()
    pruned: Counter = Counter()
    total: Counter = Counter()
    summed: List[float] = []
    has_gates = False
    for batch in batches(model, task, args.split, args.max_tokens, args.max_sentences, cpu=args.cpu):
        cross = batch.weights["cross"]
        for b in range(cross.size(2)):
            src_pos, tgt_pos = batch.sentence(b, pad)
            pieces = _pieces(src_dict, batch.src_tokens[b, src_pos[:-1]])
            spans = alignment.word_spans(pieces)
            if batch.closed is not None:
                has_gates = True
                types = piece_types(pieces, tagger.categories(pieces))
                p, t = l0drop_stats.pruning_counts(types, batch.closed[b, src_pos[:-1]].tolist())
                pruned.update(p)
                total.update(t)
            attn = cross[:, :, b][:, :, tgt_pos][..., src_pos[:-1]].cpu()
            summed += l0drop_stats.summed_attention_per_word(attn, spans).tolist()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    type_rows = [{"type": kind, "pruned": pruned[kind], "tokens": total[kind],
                  "pruning_rate": pruned[kind] / total[kind] if total[kind] else float("nan")} for kind in TYPES]
    overall = sum(pruned.values()) / max(sum(total.values()), 1)
    type_rows.append({"type": "all", "pruned": sum(pruned.values()), "tokens": sum(total.values()), "pruning_rate": overall})
    report.write_csv(out / "l0drop_types.csv", type_rows)
    top = max(4.0, math.ceil(max(summed, default=0.0) / 0.2) * 0.2)
    edges = [round(0.2 * i, 6) for i in range(int(round(top / 0.2)) + 1)]
    hist = [{"low": lo, "high": hi, "words": sum(lo <= v < hi or (hi == edges[-1] and v == hi) for v in summed)}
            for lo, hi in zip(edges[:-1], edges[1:])]
    for row in hist:
        row["fraction"] = row["words"] / max(len(summed), 1)
    report.write_csv(out / "l0drop_attention_hist.csv", hist)
    mean = sum(summed) / max(len(summed), 1)
    below = sum(v < 0.6 for v in summed) / max(len(summed), 1)
    text = [f"# L0Drop analysis\n\ncheckpoint `{args.path}`, split `{args.split}`, source language `{lang}` (HanTa).\n"]
    if has_gates:
        text.append("## Pruning rate by token type\n\nSubwords: first piece BPEH, later pieces BPEO; whole words by POS.\n\n"
                    + report.markdown_table(["type", "pruned", "tokens", "pruning rate"],
                                            [[r["type"], r["pruned"], r["tokens"], r["pruning_rate"]] for r in type_rows]) + "\n")
    else:
        text.append("The checkpoint has no L0Drop gates or prune pattern: no pruning rates.\n")
    text.append("## Summed cross-attention per source word\n\nAveraged over layers and heads, summed over target steps and "
                f"over the word's pieces. {len(summed)} words, mean {mean:.3f}, {below:.1%} below 0.6. Histogram in "
                "`l0drop_attention_hist.csv` and `l0drop_attention_hist.png`.\n")
    (out / "l0drop.md").write_text("\n".join(text), encoding="utf-8")
    report.plot_histogram(out / "l0drop_attention_hist.png", summed, edges, f"mean {mean:.2f}, {below:.1%} < 0.6")
    return {"types": type_rows, "histogram": hist, "mean": mean, "below_0.6": below, "has_gates": has_gates}


# ---------------------------------------------------------------- heatmap

def check_heatmap_choice(path: str, model, task, args) -> None:
    """Exit with one line naming the valid range when --layer, --head or --sentences is out of it."""
    modules = [module for (sublayer, _), module in attention_modules(model).items() if sublayer == args.sublayer]
    if not modules:
        sys.exit(f"analysis heatmap: error: {path} has no {args.sublayer} attention")
    layers, heads = len(modules), modules[0].num_heads
    if not -layers <= args.layer < layers:
        sys.exit(f"analysis heatmap: error: --layer {args.layer} is out of range: {path} has {layers} {args.sublayer} "
                 f"attention layers, so --layer takes 0..{layers - 1} (or -{layers}..-1, counted from the top)")
    if args.head != "mean" and not (args.head.isdigit() and int(args.head) < heads):
        sys.exit(f"analysis heatmap: error: --head {args.head}: {path} has {heads} heads, so --head takes 0..{heads - 1} or mean")
    if args.split not in task.datasets:
        task.load_dataset(args.split)
    sentences = len(task.dataset(args.split))
    wrong = [i for i in args.sentences if not 0 <= i < sentences]
    if wrong:
        sys.exit(f"analysis heatmap: error: --sentences {' '.join(map(str, wrong))} out of range: split "
                 f"'{args.split}' has {sentences} sentences, ids 0..{sentences - 1}")


def run_heatmap(args) -> List[Path]:
    paths = args.path
    labels = args.labels or [Path(p).stem for p in paths]
    overrides = args.model_overrides or ["{}"] * len(paths)
    if len(overrides) != len(paths):
        sys.exit(f"analysis heatmap: error: {len(paths)} checkpoints but {len(overrides)} --model-overrides (one per checkpoint)")
    loaded = [load(p, args.data, args.cpu, args.dtype, o) for p, o in zip(paths, overrides)]
    task = loaded[0][1]
    src_dict, tgt_dict, pad = task.source_dictionary, task.target_dictionary, task.source_dictionary.pad()
    for path, (model, model_task) in zip(paths, loaded):
        check_heatmap_choice(path, model, model_task, args)
    per_model = []
    for model, model_task in loaded:
        found = {}
        for batch in batches(model, model_task, args.split, args.max_tokens, ids=args.sentences, cpu=args.cpu):
            w = batch.weights[args.sublayer][args.layer]  # (H, B, T, S); a negative layer counts from the top
            for b in range(w.size(1)):
                src_pos, tgt_pos = batch.sentence(b, pad)
                rows = src_pos if args.sublayer == "encoder" else tgt_pos
                cols = tgt_pos if args.sublayer == "decoder" else src_pos
                m = w[:, b][:, rows][..., cols]
                found[int(batch.ids[b])] = (m.mean(0) if args.head == "mean" else m[int(args.head)]).cpu().numpy(), batch, b, src_pos, tgt_pos
        per_model.append(found)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for sid in args.sentences:
        _, batch, b, src_pos, tgt_pos = per_model[0][sid]
        src = _pieces(src_dict, batch.src_tokens[b, src_pos])
        prev = _pieces(tgt_dict, batch.prev[b, tgt_pos])
        y = src if args.sublayer == "encoder" else prev
        x = prev if args.sublayer == "decoder" else src
        layer = args.layer % batch.weights[args.sublayer].size(0) + 1
        path = out / f"heatmap_{args.sublayer}_l{layer}_h{args.head}_s{sid}.png"
        report.plot_heatmaps(path, [found[sid][0] for found in per_model], labels, x, y,
                             f"sentence {sid}, {args.sublayer} attention, layer {layer}, head {args.head} "
                             "(decoder queries labelled by their input token)")
        written.append(path)
    (out / "heatmap.md").write_text("# Attention heatmaps\n\n" + "\n".join(f"![{p.name}]({p.name})" for p in written) + "\n")
    return written


# ---------------------------------------------------------------- command line

def _common(p, multi_path: bool = False) -> None:
    p.add_argument("data", help="binarised data directory")
    if multi_path:
        p.add_argument("--path", required=True, nargs="+", help="checkpoints to compare side by side")
    else:
        p.add_argument("--path", required=True, help="checkpoint")
    p.add_argument("--split", default="test")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--max-tokens", type=int, default=4000)
    p.add_argument("--cpu", action="store_true", help="stay on the CPU even if a GPU is available")
    if multi_path:
        p.add_argument("--model-overrides", nargs="+", metavar="DICT",
                       help="fairseq's --model-overrides for each checkpoint, e.g. \"{'cross_attn_fn': 'topk'}\" (\"{}\": none)")
    else:
        p.add_argument("--model-overrides", default="{}", metavar="DICT",
                       help="as fairseq-generate's, e.g. \"{'cross_attn_fn': 'topk'}\" to analyse a model decoded with top-k")
    p.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float32",
                   help="run the model in this dtype, as trained with --fp16 / --bf16 (attention weights stay float32)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fairseq_sparse.analysis", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("sparsity", help="sparsity rate and null rate per layer, head and sublayer")
    _common(p)
    p.add_argument("--max-sentences", type=int)
    p = sub.add_parser("diversity", help="generalised Jensen-Shannon divergence between heads")
    _common(p)
    p.add_argument("--max-sentences", type=int)
    p.add_argument("--tau", type=float, nargs="+", default=[1.0], help="temperatures: softmax(alpha ** tau)")
    p.add_argument("--renormalise", choices=["auto", "always", "never"], default="auto",
                   help="softmax re-normalisation of rows: auto = ReLA-family sublayers only")
    p = sub.add_parser("aer", help="alignment error rate of cross-attention against gold alignments")
    _common(p)
    p.add_argument("--max-sentences", type=int)
    p.add_argument("--gold", required=True, help="Pharaoh file, one line per sentence of the split (i-j sure, i?j possible)")
    p.add_argument("--gold-reversed", action="store_true", help="gold links are target-source, not source-target")
    p = sub.add_parser("l0drop", help="pruning rate by token type and summed attention per source word")
    _common(p)
    p.add_argument("--max-sentences", type=int)
    p.add_argument("--lang", choices=["en", "de"], help="source language for HanTa (default: the task's)")
    p = sub.add_parser("heatmap", help="attention of chosen sentences, checkpoints side by side")
    _common(p, multi_path=True)
    p.add_argument("--labels", nargs="+")
    p.add_argument("--sentences", type=int, nargs="+", default=[0])
    p.add_argument("--sublayer", choices=SUBLAYERS, default="cross")
    p.add_argument("--layer", type=int, default=0, help="0-based; -1: the last layer")
    p.add_argument("--head", default="mean", help="0-based head index or 'mean'")
    p = sub.add_parser("bible-alignments", help="gold Greek-English alignments (bible-alignments wheel) as Pharaoh + text")
    p.add_argument("--out-prefix", required=True)
    p.add_argument("--wheel", help="the bible_alignments-0.4.2 wheel (default: cached, else pip download)")
    p.add_argument("--max-verses", type=int)
    p.add_argument("--drop-punctuation", action="store_true", help="leave out the BSB tokens marked 'exclude'")
    return parser


def quiet_library_logs() -> None:
    """Keep INFO output (fairseq's, the package's) but not other libraries' DEBUG lines.

    Importing fairseq's models runs ``logging.basicConfig(level=logging.DEBUG)`` (in
    fairseq/models/wav2vec/wav2vec2_classification.py), which fairseq's own commands pre-empt by
    configuring logging first; without this, each figure printed ~130 DEBUG lines of matplotlib's
    font manager.
    """
    root = logging.getLogger()
    if root.level < logging.INFO:
        root.setLevel(logging.INFO)
    logging.getLogger("matplotlib").setLevel(logging.WARNING)


def main(argv: Optional[List[str]] = None):
    args = build_parser().parse_args(argv)
    quiet_library_logs()
    if args.command == "bible-alignments":
        from .bible_alignments import convert

        n = convert(args.out_prefix, Path(args.wheel) if args.wheel else None, args.max_verses, args.drop_punctuation)
        print(f"{n} verses written to {args.out_prefix}.{{grc,en,align,ids}}")
        return n
    args.cpu = args.cpu or not torch.cuda.is_available()
    for path in (args.path if isinstance(args.path, list) else [args.path]):
        if not Path(path).is_file():
            sys.exit(f"analysis: error: no such checkpoint: {path}")
    try:
        if args.command == "heatmap":
            result = run_heatmap(args)
        else:
            model, task = load(args.path, args.data, args.cpu, args.dtype, args.model_overrides)
            result = {"sparsity": run_sparsity, "diversity": run_diversity, "aer": run_aer, "l0drop": run_l0drop}[args.command](
                model, task, args)
    except (CheckpointLoadError, NotASparseModel) as err:  # a checkpoint it cannot analyse: one line, no traceback
        sys.exit(f"analysis {args.command}: error: {err}")
    print(f"{args.command}: written to {args.out}")
    return result
