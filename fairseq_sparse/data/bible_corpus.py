"""The Bible as a parallel corpus: verse pairs, chapters as documents, splits by whole books.

A ``Unit`` is one line of the corpus: a verse, or at document level a chapter made of its
verses.  Valid and test are whole held-out books, every other book is training data.
"""

import random
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, TypeVar

from fairseq_sparse.data.bible_db import PAIRS, Verses
from fairseq_sparse.data.errors import PrepError
from fairseq_sparse.data.text import SPLITS

NUM_BOOKS = 66

Key = Tuple[int, ...]  # (book, chapter, verse) or (book, chapter)


@dataclass
class Unit:
    """One line of the corpus: a verse, or a chapter made of several verses."""

    key: Key
    src: List[str]
    tgt: List[str]

    @property
    def book(self) -> int:
        return self.key[0]

    @property
    def ident(self) -> str:
        return ":".join(str(k) for k in self.key)


def align(src: Verses, tgt: Verses) -> Tuple[List[Unit], int]:
    """Verse pairs present and non-empty on both sides, in canonical order; and the
    number of verses skipped."""
    keys = sorted(set(src) | set(tgt))
    units = [Unit(k, [src[k]], [tgt[k]]) for k in keys if src.get(k) and tgt.get(k)]
    return units, len(keys) - len(units)


def group_chapters(verses: Sequence[Unit]) -> List[Unit]:
    """Merge verse units into one unit per (book, chapter), keeping verse order."""
    chapters: Dict[Key, Unit] = {}
    for u in verses:
        doc = chapters.setdefault(u.key[:2], Unit(u.key[:2], [], []))
        doc.src.extend(u.src)
        doc.tgt.extend(u.tgt)
    return list(chapters.values())


def parse_pair(pair: str) -> Tuple[str, str]:
    """``--pair`` as (source language, target language)."""
    if pair not in PAIRS:
        raise PrepError(f"unknown pair {pair!r}; choose from {', '.join(PAIRS)}")
    src, tgt = pair.split("-")
    return src, tgt


def parse_books(text: str, what: str) -> List[int]:
    """``--valid-books``/``--test-books`` (``41`` or ``41,42``) as sorted book numbers."""
    try:
        books = sorted({int(b) for b in text.replace(",", " ").split()})
    except ValueError:
        raise PrepError(f"{what} {text!r}: expected book numbers such as 41 or 41,42") from None
    bad = [b for b in books if not 1 <= b <= NUM_BOOKS]
    if not books or bad:
        raise PrepError(f"{what} {text!r}: books are numbered 1..{NUM_BOOKS}")
    return books


def split_by_book(
    units: Sequence[Unit], valid_books: Iterable[int], test_books: Iterable[int]
) -> Dict[str, List[Unit]]:
    """Whole books to valid and test, every other book to train (order kept)."""
    valid, test = set(valid_books), set(test_books)
    if valid & test:
        raise PrepError(f"books {sorted(valid & test)} are in both the valid and the test split")
    splits: Dict[str, List[Unit]] = {s: [] for s in SPLITS}
    for u in units:
        name = "valid" if u.book in valid else "test" if u.book in test else "train"
        splits[name].append(u)
    for name in SPLITS:
        if not splits[name]:
            raise PrepError(f"the {name} split is empty (check --valid-books/--test-books)")
    return splits


Item = TypeVar("Item")


def subsample(units: Sequence[Item], n: Optional[int], seed: int) -> List[Item]:
    """At most ``n`` of ``units``, drawn with ``seed``, in their original order."""
    if n is None or n >= len(units):
        return list(units)
    keep = sorted(random.Random(seed).sample(range(len(units)), n))
    return [units[i] for i in keep]


def kept_sentences(units: Sequence[Unit], sentences: Sequence[str], keep: Iterable[int]) -> List[str]:
    """The sentences of the kept units; ``sentences`` holds every unit's sentences in order."""
    starts = [0]
    for u in units:
        starts.append(starts[-1] + len(u.src))
    return [sentences[j] for i in keep for j in range(starts[i], starts[i + 1])]
