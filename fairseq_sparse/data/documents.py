#!/usr/bin/env python3
"""Document-level En-De data of the Top-k Selective Attention paper: TED (IWSLT17) and News.

The paper (section 5.1.1) follows Maruf et al. (2019, "Selective Attention for
Context-aware Neural Machine Translation", NAACL) for the data -- TED talks of the
IWSLT 2017 MT track and News-Commentary v11 of WMT 2016, English->German -- and Bao
et al. (2021, G-Transformer) for the setting: documents packed into blocks of at most
512 tokens, scored with d-BLEU.

Splits, as Maruf et al. (2019, section 4.1) define them and as work following them
restates (e.g. HanoiT, arXiv 2301.06825, section 4.1): TED, tst2016-2017 for testing and
the rest of the IWSLT17 dev/test sets for development; News, the document-delimited
News-Commentary v11 for training, WMT'16 newstest2015 for development and newstest2016
for testing. So:

* ``--corpus ted``: train = the IWSLT17 En-De training talks; valid = dev2010 and
  tst2010-tst2015 (the En-De sets of the 2017-01-trnted release; Maruf's dev file starts
  with dev2010's first talks and has 93 talks); test = tst2016 and tst2017;
* ``--corpus news``: train = News-Commentary v11 (document-delimited); valid =
  newstest2015; test = newstest2016.

Raw formats, whichever is found under ``--raw`` (searched recursively by file name):

1. Maruf et al.'s release, as G-Transformer's ``exp_gtrans/prepare-bpe.sh`` reads it:
   ``concatenated_en2de_{train,dev,test}_{en,de}.txt``, one sentence a line, and a line
   ``<d>`` at the start of every document (the same line numbers on both sides). The
   text is *not* tokenised (plain detokenised sentences, CRLF line ends, a few XML
   entities such as ``&amp;`` left from the IWSLT XML); so the references are the raw
   sentences themselves, nothing is Moses-detokenised. The TED and News files have the
   same names: they are taken from ``--raw`` itself or from a sub-directory named as in
   Maruf's repository (``IWSLT2017``, ``NC-2016``) or in G-Transformer's copy
   (``iwslt17``, ``nc2016``), never from the other corpus' directory. Evidence:
   github.com/sameenmaruf/selective-attn ``data/{IWSLT2017,NC-2016}/`` (dev/test files
   in the repository; ``data/readme.txt`` links the News training files), the Hugging
   Face dataset ``gshbao/DocNMT`` (G-Transformer's ``raw_data`` submodule: ``iwslt17/``,
   ``nc2016/``, "each line a sentence, documents separated by '<d>' lines") and
   G-Transformer's ``prepare-bpe.sh`` (drops pairs with an empty side, turns ``<d>``
   lines into document breaks). The files there have 23 test / 93 dev TED documents and
   155 test / 81 dev News documents.
2. For TED also the official IWSLT17 release (WIT3 ``2017-01-trnted`` ``en-de.tgz``
   and, for tst2016/tst2017, ``2017-01-ted-test`` ``en-de.tgz`` + ``de-en.tgz``):
   ``train.tags.en-de.{en,de}`` (talks delimited by the metadata lines ``<url>``,
   ``<talkid>``, ``<title>`` ...; the metadata, title and description included, are
   dropped, the ``<talkid>`` names the document) and
   ``IWSLT17.TED.{dev2010,tst2010,...,tst2015}.en-de.{en,de}.xml`` (``<doc docid=...>``
   with ``<seg id=...>`` sentences); the test talks come as
   ``IWSLT17.TED.tst201[67].en-de.en.xml`` + ``IWSLT17.TED.tst201[67].de-en.de.xml``
   (the German side of the de-en test set is the same talks; ``...en-de.de.xml`` is
   used instead when present). Sides are paired by ``docid`` and must have the same
   number of segments.

When both formats are complete under ``--raw``, Maruf et al.'s files are used. Missing
files end the run before anything is written, with one message naming every missing
file (of the format most of whose files were found; of both when none was).

There is no official document-delimited release of News-Commentary v11 (the WMT16
files are sentence-aligned without boundaries), so ``--corpus news`` needs format 1.

Processing (G-Transformer's recipe where the paper is silent): pairs with an empty side
are dropped (as ``prepare-bpe.sh`` does, in every split), XML entities are decoded,
white space is normalised; Moses punctuation normalisation and tokenisation
(sacremoses, cased: no truecasing, unlike G-Transformer, because the d-BLEU references
are cased raw text and the evaluation has no detruecaser); joint BPE learnt on the
training text (subword-nmt, ``--merges``, default 30000 as in G-Transformer); the
sentences of every document are packed greedily into blocks of at most ``--max-tokens``
positions on both sides, never across documents, with ``fairseq_sparse.data.document_blocks``
(sentences separated by ``<sep>``); binarised with ``fairseq-preprocess`` and a joined
dictionary, English -> German.

Files in ``--out``: ``{split}.en`` / ``{split}.de`` (one block a line), ``{split}
.blocks.tsv`` (the block map), ``{valid,test}.raw.{en,de}`` (one whole raw document a
line: the d-BLEU references, ``python -m fairseq_sparse.evaluate GEN test.raw.de
--lang de --documents test.blocks.tsv``), ``bpecodes`` and ``bin/``. Intermediate files
go to ``OUT/tmp`` (one sentence a line: ``document_blocks.py``'s input) and are deleted
unless ``--keep-tmp``.

``--download`` fetches Maruf et al.'s files from G-Transformer's copy on the Hugging
Face hub (``gshbao/DocNMT``), falling back to Maruf's GitHub repository (TED, and the
News dev/test files; the News training files are otherwise only in the Dropbox folder
linked from that repository's ``data/readme.txt``) into ``OUT/raw/{iwslt17,nc2016}``
(or ``--raw-dir``). It needs network access and is not covered by the offline tests.

Examples::

    python -m fairseq_sparse.data.documents --corpus ted --raw ~/data/DocNMT --out data/ted17.doc.en-de
    python -m fairseq_sparse.data.documents --corpus news --download --out data/nc11.doc.en-de
"""

import argparse
import gzip
import itertools
import logging
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from fairseq_sparse.data import common
from fairseq_sparse.data import document_blocks
from fairseq_sparse.data.common import Job, PrepError

logger = logging.getLogger("fairseq_sparse.data")

SRC, TGT = "en", "de"
SPLITS = common.SPLITS
DEFAULT_MERGES = 30000

# --------------------------------------------------------------------------- raw formats

MARUF_SPLITS = {"train": "train", "valid": "dev", "test": "test"}


def maruf_name(split: str, lang: str) -> str:
    return f"concatenated_en2de_{MARUF_SPLITS[split]}_{lang}.txt"


@dataclass
class Doc:
    """One parallel document: its identifier and its aligned sentences."""

    id: str
    src: List[str] = field(default_factory=list)
    tgt: List[str] = field(default_factory=list)


def clean(text: str) -> str:
    """XML entities decoded, white space normalised (``\\r``, and the line separators
    U+2028, U+0085 ... that would break the one-sentence-a-line files, become spaces)."""
    return " ".join(common.unescape(text).split())


class _DocBuilder:
    """Collects sentence pairs into documents; drops pairs with an empty side."""

    def __init__(self):
        self.docs: List[Doc] = []
        self.dropped = 0

    def start(self, doc_id: Optional[str] = None) -> None:
        if not self.docs or self.docs[-1].src:
            self.docs.append(Doc(doc_id or ""))
        elif doc_id:
            self.docs[-1].id = doc_id

    def add(self, a: str, b: str) -> None:
        a, b = clean(a), clean(b)
        if not a or not b:
            self.dropped += 1
            return
        if not self.docs:
            self.docs.append(Doc(""))
        self.docs[-1].src.append(a)
        self.docs[-1].tgt.append(b)

    def result(self) -> List[Doc]:
        return [d for d in self.docs if d.src]


def _open(path: Path, encoding: str) -> Iterator[str]:
    """Lines end at ``\n`` only (a stray ``\r`` inside a line must not split it, as in the
    line-based tools of G-Transformer's recipe); ``.gz`` allowed; decoded strictly."""
    return common.raw_lines(path, encoding, newline="\n")


def _line_pairs(src: Path, tgt: Path, encoding: str) -> Iterator[Tuple[int, str, str]]:
    for n, (a, b) in enumerate(itertools.zip_longest(_open(src, encoding), _open(tgt, encoding)), 1):
        if a is None or b is None:
            raise PrepError(f"{src.name} and {tgt.name} have different numbers of lines")
        yield n, a, b


def read_maruf(src: Path, tgt: Path, encoding: str = "utf-8") -> Tuple[List[Doc], int]:
    """Maruf et al.'s files: a ``<d>`` line starts each document."""
    docs = _DocBuilder()
    for n, a, b in _line_pairs(src, tgt, encoding):
        da, db = a.strip() == "<d>", b.strip() == "<d>"
        if da != db:
            raise PrepError(f"{src.name} / {tgt.name} line {n}: a document boundary (<d>) on one side only")
        if da:
            docs.start()
        else:
            docs.add(a, b)
    return docs.result(), docs.dropped


# the metadata lines of train.tags.* (fairseq's IWSLT recipes drop the same ones)
_METADATA = re.compile(r"^\s*</?(url|keywords|speaker|talkid|title|description|reviewer|translator|doc|"
                       r"transcript|head|mteval|srcset|refset)\b[^>]*>", re.IGNORECASE)
_TALKID = re.compile(r"<talkid>\s*(\S+?)\s*</talkid>")


def read_tags(src: Path, tgt: Path, encoding: str = "utf-8") -> Tuple[List[Doc], int]:
    """IWSLT ``train.tags.*``: each run of metadata lines starts a talk."""
    docs = _DocBuilder()
    in_metadata = False
    for n, a, b in _line_pairs(src, tgt, encoding):
        ma, mb = bool(_METADATA.match(a)), bool(_METADATA.match(b))
        if ma != mb:
            raise PrepError(f"{src.name} / {tgt.name} line {n}: a metadata line on one side only")
        if ma:
            if not in_metadata:
                docs.start()
                in_metadata = True
            talk = _TALKID.search(a)
            if talk:
                docs.start(talk.group(1))
        else:
            in_metadata = False
            docs.add(a, b)
    return docs.result(), docs.dropped


_DOC = re.compile(r"<doc\b[^>]*?\bdocid\s*=\s*\"([^\"]*)\"", re.IGNORECASE)
_SEG = re.compile(r"<seg\b[^>]*>(.*)</seg>", re.IGNORECASE)


def _xml_documents(path: Path, encoding: str) -> List[Tuple[str, List[str]]]:
    docs: List[Tuple[str, List[str]]] = []
    for line in _open(path, encoding):
        m = _DOC.search(line)
        if m:
            docs.append((m.group(1), []))
        m = _SEG.search(line)
        if m:
            if not docs:
                docs.append(("", []))
            docs[-1][1].append(m.group(1))
    return docs


def read_xml(src: Path, tgt: Path, encoding: str = "utf-8") -> Tuple[List[Doc], int]:
    """IWSLT XML: ``<doc docid=...>`` with ``<seg>`` sentences; sides paired by docid."""
    a_docs, b_docs = _xml_documents(src, encoding), _xml_documents(tgt, encoding)
    b_by_id = dict(b_docs)
    if len(a_docs) != len(b_docs):
        raise PrepError(f"{src.name} has {len(a_docs)} documents, {tgt.name} {len(b_docs)}")
    if len(b_by_id) != len(b_docs) or not all(i for i, _ in a_docs):
        b_by_id = {}  # no usable document ids: pair in order
    docs = _DocBuilder()
    for k, (doc_id, a_segs) in enumerate(a_docs):
        b_segs = b_by_id.get(doc_id) if b_by_id else b_docs[k][1]
        if b_segs is None:
            raise PrepError(f"document {doc_id} of {src.name} is not in {tgt.name}")
        if len(a_segs) != len(b_segs):
            raise PrepError(f"document {doc_id} has {len(a_segs)} segments in {src.name} "
                            f"but {len(b_segs)} in {tgt.name}")
        docs.start(doc_id or None)
        for a, b in zip(a_segs, b_segs):
            docs.add(a, b)
    return docs.result(), docs.dropped


def reader_for(name: str) -> Callable[[Path, Path, str], Tuple[List[Doc], int]]:
    if name.endswith(".xml"):
        return read_xml
    if name.startswith("train.tags."):
        return read_tags
    return read_maruf


# --------------------------------------------------------------------------- corpora

@dataclass(frozen=True)
class Source:
    """One raw format of a corpus: per split, the (source, target) files to concatenate.

    A name may list alternatives separated by ``|`` (the first found is used)."""

    label: str
    files: Dict[str, List[Tuple[str, str]]]
    maruf: bool = False  # names shared by the TED and News files: look in the corpus' directory

    def names(self) -> List[str]:
        return list(dict.fromkeys(n for pairs in self.files.values() for pair in pairs for n in pair))


MARUF = Source("Maruf et al. (2019)'s document-level release",
               {s: [(maruf_name(s, SRC), maruf_name(s, TGT))] for s in SPLITS}, maruf=True)

TED_DEV = ("dev2010", "tst2010", "tst2011", "tst2012", "tst2013", "tst2014", "tst2015")
TED_TEST = ("tst2016", "tst2017")


def _ted_test(tst: str, lang: str) -> str:
    # the en-de test archive holds the English talks, the de-en one the German side
    return "|".join(f"IWSLT17.TED.{tst}.{pair}.{lang}.xml" for pair in ("en-de", "de-en"))


IWSLT17 = Source("the official IWSLT17 release (2017-01-trnted en-de.tgz; 2017-01-ted-test en-de.tgz, de-en.tgz)", {
    "train": [(f"train.tags.en-de.{SRC}", f"train.tags.en-de.{TGT}")],
    "valid": [(f"IWSLT17.TED.{s}.en-de.{SRC}.xml", f"IWSLT17.TED.{s}.en-de.{TGT}.xml") for s in TED_DEV],
    "test": [(_ted_test(s, SRC), _ted_test(s, TGT)) for s in TED_TEST],
})

HF_URL = "https://huggingface.co/datasets/gshbao/DocNMT/resolve/main/{dir}/{name}"
GITHUB_URL = "https://raw.githubusercontent.com/sameenmaruf/selective-attn/master/data/{dir}/{name}"


@dataclass(frozen=True)
class Corpus:
    key: str
    name: str
    dirs: Tuple[str, ...]          # sub-directories that hold its Maruf-format files
    hf_dir: str                    # G-Transformer's copy (Hugging Face gshbao/DocNMT)
    github_dir: str                # Maruf's repository
    github_splits: Tuple[str, ...]  # splits whose files are in Maruf's repository
    sources: Tuple[Source, ...]


CORPORA = {
    "ted": Corpus("ted", "ted17.doc.en-de", ("iwslt17", "IWSLT2017", "iwslt2017", "ted"), "iwslt17",
                  "IWSLT2017", SPLITS, (MARUF, IWSLT17)),
    "news": Corpus("news", "nc11.doc.en-de", ("nc2016", "NC-2016", "nc-2016", "nc11", "news"), "nc2016",
                   "NC-2016", ("valid", "test"), (MARUF,)),
}
# directories of the other document-level corpora in Maruf's / G-Transformer's layout
_ALL_DIRS = {d.lower() for c in CORPORA.values() for d in c.dirs} | {"europarl7"}


def download_urls(corpus: Corpus) -> List[str]:
    urls = []
    for split in SPLITS:
        for lang in (SRC, TGT):
            name = maruf_name(split, lang)
            alts = [HF_URL.format(dir=corpus.hf_dir, name=name)]
            if split in corpus.github_splits:
                alts.append(GITHUB_URL.format(dir=corpus.github_dir, name=name))
            urls.append("|".join(alts))
    return urls


def find_maruf(raw_dir: Path, name: str, corpus: Corpus) -> Optional[Path]:
    """``name`` in ``raw_dir``, in one of the corpus' directories, else anywhere below
    ``raw_dir`` but not in a directory of another corpus (the names are shared)."""
    for d in ("",) + corpus.dirs:
        path = raw_dir / d / name
        if path.is_file():
            return path
    own = {d.lower() for d in corpus.dirs}
    foreign = _ALL_DIRS - own
    hits = []
    for path in sorted(raw_dir.rglob(name)):
        parts = {p.lower() for p in path.relative_to(raw_dir).parts[:-1]}
        if path.is_file() and not parts & foreign:
            hits.append((not parts & own, path))  # the corpus' own directories first
    return min(hits)[1] if hits else None


def _locate(source: Source, raw_dir: Path, corpus: Corpus) -> Tuple[Dict[str, Path], List[str]]:
    found, missing = {}, []
    for name in source.names():
        if source.maruf:
            path = find_maruf(raw_dir, name, corpus)
        else:
            path = common.find_raw(raw_dir, name)
        if path is None:
            alts = name.split("|")
            missing.append(alts[0] + (f"  (or: {', '.join(alts[1:])})" if len(alts) > 1 else ""))
        else:
            found[name] = path
    return found, missing


def resolve(corpus: Corpus, raw_dir: Path) -> Tuple[Source, Dict[str, Path]]:
    """The first raw format whose files are all there; else one PrepError naming every
    missing file of the format most of whose files were found."""
    if not raw_dir.is_dir():
        raise PrepError(f"raw data directory {raw_dir} does not exist "
                        f"(give --raw DIR with the extracted files, or --download)")
    tried = []
    for source in corpus.sources:
        found, missing = _locate(source, raw_dir, corpus)
        if not missing:
            if source.maruf:
                where = {p.lower() for path in found.values() for p in path.resolve().parent.parts}
                if where & (_ALL_DIRS - {d.lower() for d in corpus.dirs}) and not where & {d.lower() for d in corpus.dirs}:
                    logger.warning("%s: the files in %s look like another corpus' (its directory name); "
                                   "check --raw", corpus.name, next(iter(found.values())).parent)
            return source, found
        tried.append((source, found, missing))
    best = max(tried, key=lambda t: len(t[1]))  # ties: the first (Maruf's release)

    def listing(missing):
        return "".join(f"\n  {m}" for m in missing)

    source, found, missing = best
    where = f"{raw_dir}" + (f" (or its sub-directory {' / '.join(corpus.dirs[:2])})" if source.maruf else "")
    msg = (f"{corpus.name}: {len(missing)} raw file{'s' if len(missing) > 1 else ''} of {source.label} "
           f"missing in {where}; extract them there, or use --download; nothing was written:"
           f"{listing(missing)}")
    if not found:
        for other, _, other_missing in tried:
            if other is not source:
                msg += f"\nor, as {other.label}:{listing(other_missing)}"
    raise PrepError(msg)


def read_split(source: Source, found: Dict[str, Path], split: str, encoding: str = "utf-8") -> Tuple[List[Doc], int]:
    docs: List[Doc] = []
    dropped = 0
    for a, b in source.files[split]:
        part, n = reader_for(found[a].name.removesuffix(".gz"))(found[a], found[b], encoding)
        docs += part
        dropped += n
    for i, d in enumerate(docs):
        d.id = d.id or str(i)
    return docs, dropped


# --------------------------------------------------------------------------- pipeline

def _write(path: Path, lines: Iterable[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")


def _lines(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield line.rstrip("\n")


def prepare(corpus: Corpus, raw_dir: Path, out: Path, merges: int = DEFAULT_MERGES,
            max_tokens: int = document_blocks.MAX_TOKENS, workers: int = 1,
            keep_tmp: bool = False, encoding: str = "utf-8") -> Dict[str, object]:
    if max_tokens < 2:
        raise PrepError(f"--max-tokens must be at least 2 (a token and </s>), got {max_tokens}")
    source, found = resolve(corpus, raw_dir)     # before anything is written
    common.find_tool("fairseq-preprocess")
    logger.info("%s: reading %s", corpus.name, source.label)
    docs = {}
    for split in SPLITS:
        docs[split], dropped = read_split(source, found, split, encoding)
        if dropped:
            logger.info("%s: dropped %d sentence pairs with an empty side", split, dropped)
        if not docs[split]:
            raise PrepError(f"{corpus.name}: no {split} documents in "
                            + ", ".join(sorted({found[n].name for p in source.files[split] for n in p})))

    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "tmp"
    tmp.mkdir(exist_ok=True)
    job = Job(name=corpus.name, src=SRC, tgt=TGT, corpora={}, merges=merges, joined_dictionary=True)

    # 1. one sentence a line, documents one after the other (document_blocks.py's input);
    #    the raw valid/test sentences become the references
    for split, split_docs in docs.items():
        _write(tmp / f"{split}.sentcount", (str(len(d.src)) for d in split_docs))
        _write(tmp / f"{split}.ids", (d.id for d in split_docs))
        for lang in (SRC, TGT):
            raw = tmp / (f"{split}.text.{lang}" if split == "train" else f"{split}.sentences.raw.{lang}")
            _write(raw, (s for d in split_docs for s in (d.src if lang == SRC else d.tgt)))
            _write(tmp / f"{split}.tok.{lang}", common.process_lines(_lines(raw), lang, job, workers, "tok"))
    del docs

    # 2. joint BPE
    codes = out / "bpecodes"
    logger.info("learning %d joint BPE merges", merges)
    common.learn_bpe([tmp / f"train.tok.{lang}" for lang in (SRC, TGT)], codes, merges)
    for split in SPLITS:
        for lang in (SRC, TGT):
            common.apply_bpe(codes, tmp / f"{split}.tok.{lang}", tmp / f"{split}.sentences.{lang}")

    # 3. blocks of <= max_tokens, block maps and one-document-a-line references
    for split in SPLITS:
        for lang in (SRC, TGT):
            (out / f"{split}.raw.{lang}").unlink(missing_ok=True)
    counts = {}
    args = argparse.Namespace(input=str(tmp), out=str(out), src_lang=SRC, tgt_lang=TGT, prefix="sentences",
                              max_tokens=max_tokens, separator=document_blocks.SEPARATOR)
    try:
        for split in SPLITS:
            counts[split] = document_blocks.block_split(args, split)
    except document_blocks.BlockError as e:
        raise PrepError(str(e)) from None

    # 4. binarise
    dest = common.binarize(out, job.src, job.tgt, job.joined_dictionary, workers)
    summary: Dict[str, object] = {
        "dataset": corpus.name, "format": source.label, "max_tokens": max_tokens, "splits": counts,
        "vocab": {lang: sum(1 for _ in _lines(dest / f"dict.{lang}.txt")) for lang in (SRC, TGT)},
        "bin": str(dest),
    }
    if not keep_tmp:
        shutil.rmtree(tmp)
    print_summary(summary)
    return summary


def print_summary(summary: Dict[str, object]) -> None:
    print(f"{summary['dataset']} (from {summary['format']}), blocks of <= {summary['max_tokens']} tokens:")
    for split, c in summary["splits"].items():
        print(f"  {split}: {c['documents']} documents, {c['sentences']} sentences, {c['blocks']} blocks")
    print("  dictionary sizes (joined; without fairseq's 4 special symbols): "
          + ", ".join(f"{lang} {n}" for lang, n in summary["vocab"].items()))
    print(f"  binarised data: {summary['bin']}")


# --------------------------------------------------------------------------- CLI

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fairseq_sparse.data.documents", description=__doc__.split("\n\n")[0],
                                epilog="See the module docstring (top of this file) for formats and splits.")
    p.add_argument("--corpus", required=True, choices=sorted(CORPORA),
                   help="ted: IWSLT17 TED talks; news: News-Commentary v11 (both English->German)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--raw", metavar="DIR",
                     help="directory holding the raw files (searched recursively by file name)")
    src.add_argument("--download", action="store_true",
                     help="download Maruf et al.'s files into OUT/raw (or --raw-dir) first")
    p.add_argument("--raw-dir", metavar="DIR", help="with --download: where to put the files (default OUT/raw)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--merges", type=int, default=DEFAULT_MERGES,
                   help=f"joint BPE merge operations (default {DEFAULT_MERGES}, as G-Transformer)")
    p.add_argument("--max-tokens", type=int, default=document_blocks.MAX_TOKENS,
                   help="most positions of a block on either side, </s> included (default %(default)s)")
    p.add_argument("--workers", type=int, default=1,
                   help="processes for tokenisation and fairseq-preprocess (default 1)")
    p.add_argument("--keep-tmp", action="store_true", help="keep the intermediate files in OUT/tmp")
    common.add_encoding_arg(p)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    corpus = CORPORA[args.corpus]
    out = Path(args.out)
    try:
        if args.download:
            raw_dir = Path(args.raw_dir) if args.raw_dir else out / "raw"
            common.download(download_urls(corpus), raw_dir / corpus.hf_dir)
        else:
            raw_dir = Path(args.raw)
        prepare(corpus, raw_dir, out, merges=args.merges, max_tokens=args.max_tokens,
                workers=args.workers, keep_tmp=args.keep_tmp, encoding=common.check_encoding(args.encoding))
    except PrepError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
