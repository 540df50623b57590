"""Where Top-k (OOW)'s attention goes: the share of each query's attention mass on its window keys and on
the picks beyond the window, per sublayer and layer (results/study/README.md, "Why Top-k (OOW) loses").

The window of a query is what ``topk_oow`` takes first: its ceil(k/2) nearest visible keys in
``window``'s neighbour order (itself, the key before, the key after, ...), or as many as the model's
``--topk-oow-window``; the rest of the weight a query gives lies on the other keys of k, picked by score outside
the window. Weights are the model's own (``collect.AttentionRecorder``, need_weights), so the selection is the
model's; the window is computed here from the positions of the real tokens. Only queries that see more keys
than the window holds count (the others have no picks). The CSV's ``window`` column is the window's size
(ceil(k/2) unless ``--topk-oow-window`` gave one), so models with and without it share a file.

Plain top-k (``topk``) in self-attention is measured the same way: the share of its mass on the ceil(k/2)
nearest keys (the keys Top-k (OOW) would take as its window) and on the rest of its k, chosen by score
further away; at sentence length a query has some 30 keys to pick from, at 512 tokens some 500.

    python -m fairseq_sparse.analysis.oow_mass DATA --path CHECKPOINT [--split valid] [--max-sentences N] [--out CSV]
"""

import argparse
import csv
import sys
from collections import defaultdict
from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor

from ..core.attention.structured import neighbour_rank, smallest_ranks, topk_oow_split
from .collect import batches, load

MEASURED = ("topk_oow", "topk")  # self-attention functions whose picks beyond a window are measured


def window_keys(valid: Tensor, k: int, window: Optional[int] = None) -> Tensor:
    """(B, T, S) bool: each query's ceil(k/2) (or ``window``: ``topk_oow_split``) nearest valid keys in the
    neighbour order.

    Real tokens are contiguous within a row (left- or right-padded), so offsets between indices are
    offsets between real-token positions."""
    queries = torch.arange(valid.size(1)).view(1, -1, 1)
    keys = torch.arange(valid.size(2)).view(1, 1, -1)
    if valid.size(1) == valid.size(2):  # self-attention: query i is key i
        rank = neighbour_rank(queries, keys)
    else:
        raise ValueError("the window is defined for self-attention only")
    return smallest_ranks(rank.expand_as(valid), valid, topk_oow_split(k, window)[0])


def mass_shares(weights: Tensor, valid: Tensor, k: int, window: Optional[int] = None) -> Tuple[Tensor, Tensor]:
    """Per head: (sum over counted queries of the window's share of the query's mass, number of counted
    queries), both (H,). weights: (H, B, T, S); valid: (B, T, S)."""
    in_window = window_keys(valid, k, window)
    counted = valid.sum(-1) > topk_oow_split(k, window)[0]  # (B, T): queries that have picks
    w = weights.float().masked_fill(~valid.unsqueeze(0), 0.0)
    total = w.sum(-1).clamp(min=torch.finfo(w.dtype).tiny)
    share = (w * in_window.unsqueeze(0)).sum(-1) / total  # (H, B, T)
    share = share.masked_fill(~counted.unsqueeze(0), 0.0)
    return share.flatten(1).sum(1), counted.sum().expand(weights.size(0)).clone()


def measure(model, task, split: str, k: int, max_sentences: Optional[int], window: Optional[int] = None) -> List[Dict]:
    sums: Dict[Tuple[str, int], Tensor] = defaultdict(lambda: 0)
    counts: Dict[Tuple[str, int], Tensor] = defaultdict(lambda: 0)
    fns: Dict[Tuple[str, int], str] = {}
    for batch in batches(model, task, split, max_tokens=4096, max_sentences=max_sentences):
        for sublayer in ("encoder", "decoder"):
            if sublayer not in batch.weights:
                continue
            for layer, fn in enumerate(batch.attn_fn[sublayer]):
                if fn not in MEASURED:
                    continue
                share, n = mass_shares(batch.weights[sublayer][layer], batch.valid[sublayer], k, window)
                sums[(sublayer, layer)] = sums[(sublayer, layer)] + share
                counts[(sublayer, layer)] = counts[(sublayer, layer)] + n
                fns[(sublayer, layer)] = fn
    rows = []
    for (sublayer, layer), total in sorted(sums.items()):
        per_head = (total / counts[(sublayer, layer)].clamp(min=1)).tolist()
        window = sum(per_head) / len(per_head)
        rows.append({"sublayer": sublayer, "layer": layer, "queries": int(counts[(sublayer, layer)][0]),
                     "window_share": round(window, 4), "picks_share": round(1 - window, 4),
                     "window_share_per_head": " ".join(f"{h:.4f}" for h in per_head)})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fairseq_sparse.analysis.oow_mass", description=__doc__.split("\n\n")[0])
    parser.add_argument("data", help="the binarized data folder the model was trained on")
    parser.add_argument("--path", required=True, help="a checkpoint of a model with topk_oow or topk self-attention")
    parser.add_argument("--split", default="valid")
    parser.add_argument("--max-sentences", type=int, default=None, help="the first N items of the split (default: all)")
    parser.add_argument("--label", default="", help="written in the CSV's first column (e.g. 'initialisation')")
    parser.add_argument("--out", help="append the rows to this CSV")
    args = parser.parse_args(argv)
    model, task = load(args.path, args.data)
    k, window = 8, None
    for module in model.modules():
        if getattr(module, "attn_fn", None) in MEASURED:
            k, window = module.attn_k, getattr(module, "oow_window", None)
            break
    rows = measure(model, task, args.split, k, args.max_sentences, window)
    if not rows:
        print(f"{args.path}: no topk_oow or topk self-attention", file=sys.stderr)
        return 1
    split = "" if window is None else f", window {window}"
    print(f"| sublayer | layer | queries | window share | picks share | (k = {k}{split}, {args.split}) |")
    print("|---|---:|---:|---:|---:|---|")
    for row in rows:
        print(f"| {row['sublayer']} | {row['layer']} | {row['queries']} | {row['window_share']:.4f} | {row['picks_share']:.4f} | per head: {row['window_share_per_head']} |")
    if args.out:
        # The window's size is always written (the default ceil(k/2) too), so models with and without
        # --topk-oow-window share one CSV.
        fields = ["label", "split", "k", "window", *rows[0].keys()]
        new = not _exists(args.out)
        if not new and _header(args.out) != fields:
            print(f"{args.out} has the columns {','.join(_header(args.out))}, these rows {','.join(fields)}: "
                  "write them to another CSV", file=sys.stderr)
            return 1
        with open(args.out, "a", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            if new:
                writer.writeheader()
            for row in rows:
                writer.writerow({"label": args.label, "split": args.split, "k": k,
                                 "window": topk_oow_split(k, window)[0], **row})
    return 0


def _exists(path: str) -> bool:
    import os

    return os.path.exists(path)


def _header(path: str) -> List[str]:
    with open(path, newline="", encoding="utf-8") as f:
        return next(csv.reader(f), [])


if __name__ == "__main__":
    sys.exit(main())
