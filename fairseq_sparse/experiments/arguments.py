"""Command lines merged flag by flag: a later ``--flag`` replaces an earlier one."""

from __future__ import annotations

import shlex
from typing import Dict, List, Sequence, Tuple


def parse_flags(args: str | Sequence[str] | None) -> List[Tuple[str, List[str]]]:
    """Split a command line into ``(--flag, values)`` pairs; leading positionals go under ``""``."""
    tokens = shlex.split(args) if isinstance(args, str) else list(args or [])
    pairs: List[Tuple[str, List[str]]] = []
    for token in tokens:
        if token.startswith("--"):
            pairs.append((token, []))
        elif pairs:
            pairs[-1][1].append(token)
        else:
            pairs.append(("", [token]))
    return pairs


def merge_args(*parts: str | Sequence[str] | None, drop: Sequence[str] = ()) -> List[str]:
    """Merge command-line fragments flag by flag: a later ``--flag`` replaces an earlier one."""
    merged: Dict[str, List[str]] = {}  # a replaced flag keeps its first position: same flags, same command
    for part in parts:
        for flag, values in parse_flags(part):
            merged[flag] = values
    return [token for flag, values in merged.items() if flag not in drop for token in ([flag] if flag else []) + values]
