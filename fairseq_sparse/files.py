"""Writing files so that a reader sees the whole file or none: shared by data preparation, the
benchmarks and the table runner (a killed process must never leave a file that looks finished)."""

import contextlib
import os
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def replaced_atomically(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block ends without an error it becomes
    ``path`` by one rename, and on an error it is removed."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        yield partial
        os.replace(partial, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` under a temporary name, then rename."""
    with replaced_atomically(path) as partial:
        partial.write_text(text, encoding="utf-8")


def describe_os_error(error: OSError) -> str:
    """One line for an ``OSError`` of ours (a full disk, a read-only or missing folder): the path(s) and
    the system's words."""
    paths = " -> ".join(str(p) for p in (error.filename, error.filename2) if p is not None)
    what = error.strerror or str(error)
    return f"{paths}: {what}" if paths else what
