"""Per-head statistics of every attention layer over a split: share of zero weights, null rate and peak
share (``zero_weights``) and the divergence between a layer's heads (``diversity``). Computing only: the pages
are written by ``pages``."""

import argparse
from collections import defaultdict
from typing import Dict, List

import torch

from . import SUBLAYERS, diversity, zero_weights
from .collect import batches
from ..core.attention import get_attention


def zero_weight_rows(model, task, args: argparse.Namespace) -> List[dict]:
    """One row per (sublayer, layer, head): share of zero weights, null rate, peak share and what they count."""
    acc = {}
    for batch in batches(model, task, args.split, args.max_tokens, args.max_sentences, cpu=args.cpu):
        for sub, w in batch.weights.items():
            for layer in range(w.size(0)):
                z, t = zero_weights.zero_weight_counts(w[layer], batch.valid[sub])
                n, q = zero_weights.null_counts(w[layer], batch.valid[sub])
                p, a = zero_weights.peak_share_sums(w[layer], batch.valid[sub])
                counts = torch.stack([c.double() for c in (z, t, n, q, p, a)]).cpu()
                acc[(sub, layer)] = acc.get((sub, layer), 0) + counts
    rows = []
    for (sub, layer), (z, t, n, q, p, a) in sorted(acc.items(), key=lambda kv: (SUBLAYERS.index(kv[0][0]), kv[0][1])):
        for head in range(len(z)):
            rows.append({"sublayer": sub, "layer": layer, "head": head, "zero_weights": float(zero_weights.rate(z[head], t[head])),
                         "null_rate": float(zero_weights.rate(n[head], q[head])), "peak_share": float(zero_weights.rate(p[head], a[head])),
                         "weights": int(t[head]), "queries": int(q[head])})
    return rows


def renormalised(mode: str, attn_fn: str) -> bool:
    """Whether rows of ``attn_fn`` are re-normalised with softmax (--renormalise; auto: functions whose
    weights are not probabilities, the ReLA family and its ablations)."""
    return mode == "always" or (mode == "auto" and not get_attention(attn_fn).weights_are_probabilities)


def diversity_rows(model, task, args: argparse.Namespace) -> List[dict]:
    """One row per (tau, sublayer, layer): the heads' mean Jensen-Shannon divergence over queries."""
    sums: Dict = defaultdict(float)
    counts: Dict = defaultdict(int)
    fns: Dict = {}
    for batch in batches(model, task, args.split, args.max_tokens, args.max_sentences, cpu=args.cpu):
        for sub, w in batch.weights.items():
            for layer in range(w.size(0)):
                fn = batch.attn_fn[sub][layer]
                fns[(sub, layer)] = fn
                for tau in args.tau:
                    js = diversity.head_diversity(w[layer], batch.valid[sub], renormalised(args.renormalise, fn), tau)
                    real = ~torch.isnan(js)
                    sums[(tau, sub, layer)] += float(js[real].sum())
                    counts[(tau, sub, layer)] += int(real.sum())
    return [{"tau": tau, "sublayer": sub, "layer": layer, "attn_fn": fns[(sub, layer)],
             "renormalised": renormalised(args.renormalise, fns[(sub, layer)]),
             "js_divergence": sums[(tau, sub, layer)] / max(counts[(tau, sub, layer)], 1), "queries": counts[(tau, sub, layer)]}
            for (tau, sub, layer) in sorted(sums, key=lambda k: (k[0], SUBLAYERS.index(k[1]), k[2]))]
