"""Alignment error rate of a checkpoint's cross-attention against gold alignments, per layer and head
(normal and shifted attention), over a split. Computing only: the page is written by ``pages``."""

import argparse
from collections import defaultdict
from dataclasses import dataclass
from typing import Dict, List, Set, Tuple

from . import alignment
from .collect import batches, pieces

Gold = List[Tuple[Set, Set]]  # per sentence: (sure links, possible links)


@dataclass
class AlignmentErrors:
    """One row per (mode, layer, head or "layer"), and how many sentences were scored or skipped."""

    rows: List[dict]
    sentences: int
    skipped: int


def read_gold(path: str, reversed_: bool) -> Gold:
    gold = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            sure, possible = alignment.parse_pharaoh(line)
            if reversed_:
                sure, possible = alignment.reverse(sure), alignment.reverse(possible)
            gold.append((sure, possible))
    return gold


def alignment_errors(model, task, args: argparse.Namespace) -> AlignmentErrors:
    """AER of every head and of each layer's mean attention, subwords merged to words, argmax per target word.
    Sentences whose gold links fall outside their words are skipped."""
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
            src_spans = alignment.word_spans(pieces(src_dict, batch.src_tokens[b, src_pos[:-1]]))
            tgt_spans = alignment.word_spans(pieces(tgt_dict, batch.target[b, tgt_pos[:-1]]))
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
                        c = alignment.aer_counts(alignment.extract_alignment(matrix), sure, possible)
                        key = (mode, layer, head)
                        counts[key] = [x + y for x, y in zip(counts[key], c)]
    rows = [{"mode": mode, "layer": layer, "head": head, "aer": alignment.aer(c), "links": c[2], "sure": c[3]}
            for (mode, layer, head), c in counts.items()]
    return AlignmentErrors(rows, sentences, skipped)
