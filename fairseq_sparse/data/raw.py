"""Reading the raw files of the official releases: strict decoding, their formats, finding them.

Formats: plain parallel text (one sentence a line, optionally gzipped), IWSLT ``train.tags.*``
(metadata lines in tags, one sentence a line otherwise) and IWSLT XML / WMT SGML (one
``<seg id="N">...</seg>`` a sentence).  A raw file is decoded in the encoding ``--encoding``
names, strictly: a byte that does not decode stops preparation with the file and the line,
it is never replaced (a wrongly encoded file would otherwise corrupt the data and the BLEU
references silently); a control character other than tab stops it the same way.
"""

import codecs
import gzip
import html
import itertools
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from fairseq_sparse.data.errors import PrepError

logger = logging.getLogger("fairseq_sparse.data")
BYTE_ORDER_MARK = "\ufeff"


@dataclass(frozen=True)
class Raw:
    """One raw file: its name (relative to the raw directory) and its format.

    ``fmt`` is ``plain`` (one sentence a line, ``.gz`` allowed), ``tags`` (IWSLT
    ``train.tags.*``: metadata lines in tags, one sentence a line otherwise) or
    ``seg`` (IWSLT XML / WMT SGML: one ``<seg id="N">...</seg>`` a sentence) or
    ``auto`` (``seg`` for ``.sgm``/``.xml`` files, else ``plain``).  ``name`` may
    list alternatives separated by ``|``; the first that exists is used.
    """

    name: str
    fmt: str = "auto"


def check_encoding(encoding: str) -> str:
    """The name of a text encoding Python knows (``--encoding``), or a PrepError."""
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise PrepError(f"--encoding {encoding}: not a text encoding Python knows (e.g. utf-8, latin-1, cp1252)") from None
    return encoding


def raw_lines(path: Path, encoding: str = "utf-8", newline: Optional[str] = None) -> Iterator[str]:
    """The lines of a raw text file (``.gz`` allowed), decoded strictly; a byte-order mark at its start
    is dropped (and logged).

    An undecodable byte is never replaced (a wrongly encoded file would otherwise corrupt the
    data and the BLEU references silently): preparation stops with one message naming the
    file, the line and what to do. ``newline`` as ``open``'s (None: universal newlines).
    """
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding=encoding, newline=newline) as f:
            first = next(f, None)
            if first is None:
                return
            if first.startswith(BYTE_ORDER_MARK):
                # an encoding's signature (Windows editors write one), not text: kept, it would glue
                # itself to the first token and hide an IWSLT metadata line's tag from the reader
                logger.info("%s starts with a byte-order mark (U+FEFF): read without it", path)
                first = first[len(BYTE_ORDER_MARK):]
            for number, line in enumerate(itertools.chain([first], f), 1):
                refuse_control_characters(path, number, line)
                yield line
    except UnicodeDecodeError as err:
        line = _first_undecodable_line(path, encoding)
        where = f"line {line}" if line else f"byte {err.start}"
        raise PrepError(f"{path}: {where} is not valid {encoding} ({err.reason}); give the raw files' encoding "
                        f"with --encoding, or convert the file to UTF-8") from None


# C0 control characters but tab and the line ends: a NUL or an escape inside a word is no text, and would go
# on into the prepared text and the dictionary as part of a token
CONTROL_CHARACTER = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")
CONTROL_NAMES = {0x00: "NUL", 0x08: "backspace", 0x0B: "vertical tab", 0x0C: "form feed", 0x1B: "escape"}


def refuse_control_characters(path: Path, number: int, line: str) -> None:
    """Stop preparation at a control character, naming the file, the line and the character (never dropped
    silently: a file holding them is usually binary, or text of another encoding read wrongly)."""
    found = CONTROL_CHARACTER.search(line)
    if found:
        code = ord(found.group())
        name = f" ({CONTROL_NAMES[code]})" if code in CONTROL_NAMES else ""
        raise PrepError(f"{path}: line {number} holds the control character U+{code:04X}{name} at column "
                        f"{found.start() + 1}; remove it (tab is the only control character text may hold)")


def _first_undecodable_line(path: Path, encoding: str) -> Optional[int]:
    """The number of the first line of ``path`` that does not decode (the text reader decodes
    ahead in blocks, so its error does not say which line)."""
    opener = gzip.open if path.suffix == ".gz" else open
    decoder = codecs.getincrementaldecoder(encoding)()
    with opener(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                decoder.decode(raw)
            except UnicodeDecodeError:
                return number
    return None


# IWSLT train.tags: metadata lines dropped; <title>/<description> keep their text
# (fairseq's prepare-iwslt14.sh / prepare-iwslt17-multilingual.sh).
_KEEP_TAGS = re.compile(r"^\s*<(title|description)>(.*)</\1>\s*$")
_SEG = re.compile(r"<seg[^>]*>(.*)</seg>", re.IGNORECASE)


def unescape(text: str) -> str:
    """XML entities (``&amp;``, ``&lt;``, ``&#39;`` ...) to characters."""
    return html.unescape(text) if "&" in text else text


def read_raw(path: Path, fmt: str, encoding: str = "utf-8") -> Iterator[str]:
    """The sentences of one raw file, stripped, one per line."""
    lines = raw_lines(path, encoding)
    if fmt == "plain":
        for line in lines:
            yield line.strip()
    elif fmt == "tags":
        for line in lines:
            m = _KEEP_TAGS.match(line)
            if m:
                yield m.group(2).strip()
            elif not line.lstrip().startswith("<"):
                yield line.strip()
    elif fmt == "seg":
        for line in lines:
            m = _SEG.search(line)
            if m:
                yield unescape(m.group(1)).replace("\u2019", "'").strip()
    else:  # pragma: no cover - programming error
        raise ValueError(f"unknown raw format {fmt!r}")


def fmt_of(raw: Raw, path: Path) -> str:
    """The format ``raw`` is read in: its own, or for ``auto`` the one its file name says."""
    if raw.fmt != "auto":
        return raw.fmt
    return "seg" if path.name.endswith((".sgm", ".xml", ".sgm.gz", ".xml.gz")) else "plain"


def find_raw(raw_dir: Path, name: str) -> Optional[Path]:
    """``raw_dir/name``, else ``name`` (or ``name.gz``) anywhere below ``raw_dir``
    (archives extract into different sub-directories); ``a|b``: the first found."""
    if "|" in name:
        for alt in name.split("|"):
            path = find_raw(raw_dir, alt)
            if path is not None:
                return path
        return None
    for candidate in (name, name + ".gz"):
        direct = raw_dir / candidate
        if direct.is_file():
            return direct
    base = Path(name).name
    for candidate in (base, base + ".gz"):
        hits = sorted(p for p in raw_dir.rglob(candidate) if p.is_file())
        if hits:
            return hits[0]
    return None


def missing_entry(name: str) -> str:
    """How a missing raw file is listed in the error: the name, and its alternatives."""
    alts = name.split("|")
    return alts[0] + (f"  (or: {', '.join(alts[1:])})" if len(alts) > 1 else "")
