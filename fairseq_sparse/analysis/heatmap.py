"""The attention matrices of chosen sentences, one per checkpoint, for side-by-side heatmaps: the
checks of --layer, --head and --sentences against each checkpoint, and the matrices with the tokens
that label their axes. Computing only: the figures are drawn by ``pages``."""

import argparse
import sys
from dataclasses import dataclass
from typing import Dict, List

import numpy

from .collect import attention_modules, batches, load, pieces


@dataclass
class Heatmap:
    """One sentence: each checkpoint's matrix (queries × keys), the key and query tokens, the 1-based layer."""

    sentence: int
    matrices: List[numpy.ndarray]
    x: List[str]
    y: List[str]
    layer: int


def check_heatmap_choice(path: str, model, task, args: argparse.Namespace) -> None:
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


def sentence_matrices(model, task, args: argparse.Namespace) -> Dict[int, tuple]:
    """{sentence id: (matrix, batch, index in the batch, source positions, target positions)} of one checkpoint."""
    pad = task.source_dictionary.pad()
    found = {}
    for batch in batches(model, task, args.split, args.max_tokens, ids=args.sentences, cpu=args.cpu):
        w = batch.weights[args.sublayer][args.layer]  # (H, B, T, S); a negative layer counts from the top
        for b in range(w.size(1)):
            src_pos, tgt_pos = batch.sentence(b, pad)
            rows = src_pos if args.sublayer == "encoder" else tgt_pos
            cols = tgt_pos if args.sublayer == "decoder" else src_pos
            m = w[:, b][:, rows][..., cols]
            matrix = (m.mean(0) if args.head == "mean" else m[int(args.head)]).cpu().numpy()
            found[int(batch.ids[b])] = matrix, batch, b, src_pos, tgt_pos
    return found


def heatmaps(args: argparse.Namespace) -> List[Heatmap]:
    """One ``Heatmap`` per --sentences id, from every --path checkpoint (their tokens: the first's)."""
    paths = args.path
    overrides = args.model_overrides or ["{}"] * len(paths)
    if len(overrides) != len(paths):
        sys.exit(f"analysis heatmap: error: {len(paths)} checkpoints but {len(overrides)} --model-overrides (one per checkpoint)")
    loaded = [load(p, args.data, args.cpu, args.dtype, o) for p, o in zip(paths, overrides)]
    for path, (model, model_task) in zip(paths, loaded):
        check_heatmap_choice(path, model, model_task, args)
    per_model = [sentence_matrices(model, model_task, args) for model, model_task in loaded]
    task = loaded[0][1]
    found = []
    for sid in args.sentences:
        _, batch, b, src_pos, tgt_pos = per_model[0][sid]
        src = pieces(task.source_dictionary, batch.src_tokens[b, src_pos])
        prev = pieces(task.target_dictionary, batch.prev[b, tgt_pos])
        found.append(Heatmap(sid, [matrices[sid][0] for matrices in per_model],
                             x=prev if args.sublayer == "decoder" else src, y=src if args.sublayer == "encoder" else prev,
                             layer=args.layer % batch.weights[args.sublayer].size(0) + 1))
    return found
