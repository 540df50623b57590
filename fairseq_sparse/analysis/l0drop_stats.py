"""L0Drop analysis: pruning rate by token type (section 6, Figure 5) and the summed
cross-attention each source word receives (Figures 1 and 7)."""

from collections import Counter
from typing import Dict, List, Sequence, Tuple

from torch import Tensor

from .alignment import merge_subwords


def pruning_counts(types: Sequence[str], closed: Sequence[bool]) -> Tuple[Counter, Counter]:
    """(pruned per type, total per type) for one sentence; types and closed are per source piece."""
    pruned: Counter = Counter()
    total: Counter = Counter()
    for kind, is_closed in zip(types, closed):
        total[kind] += 1
        pruned[kind] += int(bool(is_closed))
    return pruned, total


def pruning_rates(pruned: Counter, total: Counter) -> Dict[str, float]:
    return {kind: pruned[kind] / total[kind] for kind in total if total[kind]}


def summed_attention_per_word(cross: Tensor, src_spans: List[List[int]]) -> Tensor:
    """cross: (L, H, T, S) cross-attention of one sentence over its real target steps and real
    source pieces (</s> excluded). Averaged over layers and heads, summed over target steps
    and over the pieces of each source word -> (S_words,)."""
    mean = cross.double().mean(dim=(0, 1))  # (T, S)
    per_piece_rows = [[t] for t in range(mean.size(0))]
    return merge_subwords(mean, per_piece_rows, src_spans).sum(0)
