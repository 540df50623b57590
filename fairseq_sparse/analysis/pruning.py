"""What an L0Drop checkpoint prunes over a split: the pruning rate by token type (subword pieces, POS
classes of whole words; HanTa tags) and the cross-attention each source word receives, summed over the
target and binned. Computing only: the page is written by ``pages``."""

import argparse
import math
from collections import Counter
from dataclasses import dataclass
from typing import List

from . import alignment, l0drop_stats
from .collect import batches, pieces

BIN = 0.2  # width of the histogram's bins of summed attention
LOW = 0.6  # summed attention below which a word counts as barely attended


@dataclass
class PruningStats:
    """Rows of pruning by token type ("all" last), the summed attention per source word and its histogram."""

    lang: str
    types: List[dict]
    summed: List[float]
    edges: List[float]
    histogram: List[dict]
    has_gates: bool

    @property
    def mean(self) -> float:
        return sum(self.summed) / max(len(self.summed), 1)

    @property
    def below(self) -> float:
        """The fraction of words whose summed attention is below ``LOW``."""
        return sum(v < LOW for v in self.summed) / max(len(self.summed), 1)

    def result(self) -> dict:
        """What ``python -m fairseq_sparse.analysis l0drop`` returns."""
        return {"types": self.types, "histogram": self.histogram, "mean": self.mean, "below_0.6": self.below,
                "has_gates": self.has_gates}


def type_rows(pruned: Counter, total: Counter, kinds: List[str]) -> List[dict]:
    """Pruned tokens, tokens and pruning rate per token type, then over all types."""
    rows = [{"type": kind, "pruned": pruned[kind], "tokens": total[kind],
             "pruning_rate": pruned[kind] / total[kind] if total[kind] else float("nan")} for kind in kinds]
    overall = sum(pruned.values()) / max(sum(total.values()), 1)
    return rows + [{"type": "all", "pruned": sum(pruned.values()), "tokens": sum(total.values()), "pruning_rate": overall}]


def histogram(values: List[float]) -> List[dict]:
    """Words per bin of width ``BIN``, from 0 to at least 4 (the last bin includes its upper edge)."""
    edges = histogram_edges(values)
    bins = [{"low": lo, "high": hi, "words": sum(lo <= v < hi or (hi == edges[-1] and v == hi) for v in values)}
            for lo, hi in zip(edges[:-1], edges[1:])]
    for row in bins:
        row["fraction"] = row["words"] / max(len(values), 1)
    return bins


def histogram_edges(values: List[float]) -> List[float]:
    """Bin edges from 0 to the largest value rounded up to a bin, at least 4."""
    top = max(4.0, math.ceil(max(values, default=0.0) / BIN) * BIN)
    return [round(BIN * i, 6) for i in range(int(round(top / BIN)) + 1)]


def pruning_stats(model, task, args: argparse.Namespace) -> PruningStats:
    """Pruning by token type (if the checkpoint has gates) and summed cross-attention per source word."""
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
            src_pieces = pieces(src_dict, batch.src_tokens[b, src_pos[:-1]])
            if batch.closed is not None:
                has_gates = True
                types = piece_types(src_pieces, tagger.categories(src_pieces))
                p, t = l0drop_stats.pruning_counts(types, batch.closed[b, src_pos[:-1]].tolist())
                pruned.update(p)
                total.update(t)
            attn = cross[:, :, b][:, :, tgt_pos][..., src_pos[:-1]].cpu()
            summed += l0drop_stats.summed_attention_per_word(attn, alignment.word_spans(src_pieces)).tolist()
    return PruningStats(lang, type_rows(pruned, total, TYPES), summed, histogram_edges(summed), histogram(summed), has_gates)
