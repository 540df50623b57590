"""Fetching raw data: the official archives of a dataset (``--download``) and the download cache.

Archives are fetched into the raw directory, once (a file already there is not fetched again),
and extracted next to themselves, once (a hidden marker file remembers it); the scripts then
find their raw files by name below that directory (``raw.find_raw``).
"""

import logging
import os
import re
import shutil
import tarfile
import urllib.request
import zipfile
from pathlib import Path
from typing import Sequence

from fairseq_sparse.data.errors import PrepError

logger = logging.getLogger("fairseq_sparse.data")


def cache_dir() -> Path:
    """Where downloaded corpora (the Bible database, the Bible alignments) are kept: $FAIRSEQ_SPARSE_CACHE
    or ~/.cache/fairseq-sparse."""
    env = os.environ.get("FAIRSEQ_SPARSE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fairseq-sparse"


def download(urls: Sequence[str], raw_dir: Path) -> None:
    """Fetch every URL into ``raw_dir`` (skipping files already there) and
    extract archives (.tgz, .tar.gz, .tar, .zip; lone .gz files are read as is).

    An entry may hold alternatives separated by ``|``: the first that works wins;
    ``URL1+URL2`` are the parts of one split archive, concatenated."""
    raw_dir.mkdir(parents=True, exist_ok=True)
    for entry in urls:
        errors = []
        for url in entry.split("|"):
            parts = url.split("+")
            fname = parts[0].rstrip("/").split("/")[-1].split("=")[-1]
            if len(parts) > 1:
                fname = re.sub(r"\.\d+$", "", fname)
            dest = raw_dir / fname
            if not dest.exists():
                try:
                    _fetch(parts, dest)
                except Exception as e:  # noqa: BLE001 - report every alternative
                    errors.append(f"{url}: {e}")
                    continue
            _extract(dest, raw_dir)
            break
        else:
            raise PrepError("download failed: " + "; ".join(errors))


def _fetch(parts: Sequence[str], dest: Path) -> None:
    """The concatenated ``parts`` into ``dest``, through ``dest.part`` so that an interrupted
    download never looks complete."""
    tmp = dest.with_name(dest.name + ".part")
    with open(tmp, "wb") as f:
        for part in parts:
            logger.info("downloading %s", part)
            with urllib.request.urlopen(part, timeout=60) as r:
                shutil.copyfileobj(r, f, 1 << 20)
    tmp.rename(dest)


def _extract(path: Path, raw_dir: Path) -> None:
    """Extract an archive into ``raw_dir`` unless its marker says it was; other files stay as they are."""
    marker = raw_dir / f".{path.name}.extracted"
    if marker.exists():
        return
    name = path.name
    if name.endswith((".tgz", ".tar.gz", ".tar")):
        with tarfile.open(path) as t:
            t.extractall(raw_dir, filter="data")
    elif name.endswith(".zip"):
        with zipfile.ZipFile(path) as z:
            z.extractall(raw_dir)
    else:
        return
    marker.touch()
