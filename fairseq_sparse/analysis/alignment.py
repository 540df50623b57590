"""Word alignment from cross-attention and alignment error rate (ReLA paper, section 6, Table 5).

Conventions
* Alignments are sets of (source word index, target word index) pairs, 0-based, as in
  Pharaoh files (``i-j`` sure, ``i?j`` possible; ``i`` on the source side).
* Cross-attention of one sentence is (T, S) over its real tokens: T target steps, the
  last of which predicts </s>, and S source tokens, the last of which is </s>.
* Normal attention (alpha): row t is the step that *predicts* target token t.
  Shifted attention (alpha[1:]): the first decoding step is skipped, so row t + 1 (the
  step whose *input* is target token t) aligns target token t.
* Subword merging: a word is a run of pieces whose all but last end in ``@@``. Target
  rows of a word's pieces are averaged (one distribution per word), source columns of a
  word's pieces are summed (the attention mass the word receives).
* Extraction: each target word is linked to the argmax source word; a row that is all 0
  (null attention) gives no link.
"""

from typing import Dict, Iterable, List, Sequence, Set, Tuple

import torch
from torch import Tensor

Alignment = Set[Tuple[int, int]]


def word_spans(pieces: Sequence[str], marker: str = "@@") -> List[List[int]]:
    """Group piece indices into words: ``["un@@", "do", "it"]`` -> ``[[0, 1], [2]]``."""
    spans: List[List[int]] = []
    current: List[int] = []
    for i, piece in enumerate(pieces):
        current.append(i)
        if not piece.endswith(marker):
            spans.append(current)
            current = []
    if current:
        spans.append(current)
    return spans


def merge_words(pieces: Sequence[str], marker: str = "@@") -> List[str]:
    """De-BPE: the words the pieces spell."""
    return ["".join(pieces[i][: -len(marker)] if pieces[i].endswith(marker) else pieces[i] for i in span)
            for span in word_spans(pieces, marker)]


def _membership(spans: List[List[int]], n: int, dtype) -> Tensor:
    m = torch.zeros(len(spans), n, dtype=dtype)
    for w, span in enumerate(spans):
        m[w, span] = 1.0
    return m


def merge_subwords(attn: Tensor, tgt_spans: List[List[int]], src_spans: List[List[int]]) -> Tensor:
    """(..., T, S) piece attention -> (..., T_words, S_words): rows averaged, columns summed."""
    rows = _membership(tgt_spans, attn.size(-2), attn.dtype).to(attn.device)
    rows = rows / rows.sum(-1, keepdim=True)
    cols = _membership(src_spans, attn.size(-1), attn.dtype).to(attn.device)
    return rows @ attn @ cols.transpose(0, 1)


def target_rows(attn: Tensor, shifted: bool) -> Tensor:
    """(..., T, S) attention of a full pass -> (..., T - 1, S - 1): one row per target token
    (</s> excluded), one column per source token (</s> excluded). ``shifted`` takes alpha[1:]."""
    rows = attn[..., 1:, :] if shifted else attn[..., :-1, :]
    return rows[..., :-1]


def extract_alignment(attn: Tensor) -> Alignment:
    """(T, S) word-level attention -> {(argmax source word, target word)}; all-zero rows give none."""
    best = attn.argmax(-1)
    alive = (attn != 0).any(-1)
    return {(int(best[t]), t) for t in range(attn.size(0)) if alive[t]}


def parse_pharaoh(line: str) -> Tuple[Alignment, Alignment]:
    """``"0-0 1?2"`` -> (sure, possible) with sure a subset of possible."""
    sure: Alignment = set()
    possible: Alignment = set()
    for link in line.split():
        sep = "?" if "?" in link else "-"
        i, j = link.split(sep)
        pair = (int(i), int(j))
        possible.add(pair)
        if sep == "-":
            sure.add(pair)
    return sure, possible


def format_pharaoh(alignment: Iterable[Tuple[int, int]]) -> str:
    return " ".join(f"{i}-{j}" for i, j in sorted(alignment))


def reverse(alignment: Alignment) -> Alignment:
    return {(j, i) for i, j in alignment}


def aer_counts(hyp: Alignment, sure: Alignment, possible: Alignment) -> Tuple[int, int, int, int]:
    """(|A & S|, |A & P|, |A|, |S|) for one sentence; P is taken as P | S."""
    possible = possible | sure
    return len(hyp & sure), len(hyp & possible), len(hyp), len(sure)


def aer(counts: Sequence[float]) -> float:
    """AER = 1 - (|A & S| + |A & P|) / (|A| + |S|) from (summed) ``aer_counts``."""
    a_s, a_p, a, s = counts
    return 1.0 - (a_s + a_p) / (a + s) if a + s else 0.0


def aer_by_layer(rows: List[Dict], mode: str) -> List[list]:
    """Per layer (1-based), from the rows of ``alignment_error`` (mode, layer, head or "layer", aer): its
    best head, that head's AER and the AER of the layer's mean attention. Their means over layers are
    ReLA's AoH and AoL (Table 5)."""
    table = []
    for layer in sorted({r["layer"] for r in rows if r["mode"] == mode}):
        heads = [r for r in rows if r["mode"] == mode and r["layer"] == layer and r["head"] != "layer"]
        best = min(heads, key=lambda r: r["aer"])
        layer_row = next(r for r in rows if r["mode"] == mode and r["layer"] == layer and r["head"] == "layer")
        table.append([layer + 1, best["head"], best["aer"], layer_row["aer"]])
    return table
