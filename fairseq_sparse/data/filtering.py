"""Length filtering of training pairs, as Moses' ``clean-corpus-n.perl`` with a minimum of 1.

Only training data is filtered: valid and test stay whole, aligned with their references.
"""

from pathlib import Path
from typing import List, Sequence, Tuple

from fairseq_sparse.data.text import read_lines, write_lines


def keep_pair(a: str, b: str, max_len: int, ratio: float) -> bool:
    """Moses ``clean-corpus-n.perl`` with min 1: non-empty, at most ``max_len``
    tokens per side (0: any), length ratio at most ``ratio`` (0: any)."""
    la, lb = len(a.split()), len(b.split())
    if la == 0 or lb == 0:
        return False
    if max_len and (la > max_len or lb > max_len):
        return False
    if ratio and (la / lb > ratio or lb / la > ratio):
        return False
    return True


def kept_indices(src: Sequence[str], tgt: Sequence[str], max_len: int, ratio: float) -> List[int]:
    """The indices of the pairs ``keep_pair`` keeps."""
    return [i for i, (a, b) in enumerate(zip(src, tgt)) if keep_pair(a, b, max_len, ratio)]


def filter_files(files: Sequence[Tuple[Path, Path]], max_len: int, ratio: float) -> int:
    """Filter aligned files in place; returns the number of pairs kept.

    The first (source, target) pair of files decides; any further pairs (the same sentences at
    another stage of processing) follow its decisions, so that they stay aligned."""
    src, tgt = files[0]
    decisions = [keep_pair(a, b, max_len, ratio) for a, b in zip(read_lines(src), read_lines(tgt))]
    for a, b in files:
        for path in (a, b):
            tmp = path.with_name(path.name + ".filtered")
            write_lines(tmp, (line for line, k in zip(read_lines(path), decisions) if k))
            tmp.replace(path)
    return sum(decisions)
