"""The text files that pass between the preparation steps: UTF-8, one sentence (or block) a line.

Every prepared dataset has the same three splits, written as ``{split}.{lang}`` and the like.
Raw files, whose encoding the user gives, are read by ``raw.py``; everything written by the
preparation itself is UTF-8 and read back here.
"""

from pathlib import Path
from typing import Iterable, Iterator

SPLITS = ("train", "valid", "test")


def read_lines(*paths: Path) -> Iterator[str]:
    """The lines of the files, one file after the other, without their ``\\n``."""
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                yield line.rstrip("\n")


def write_lines(path: Path, lines: Iterable[str]) -> int:
    """Write ``lines``, each ended by ``\\n``; returns how many were written."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")
            n += 1
    return n
