"""The document-level corpora (TED of IWSLT17, News-Commentary v11; English -> German): their
raw formats, where their files are, and reading a split's documents.

Maruf et al.'s TED and News files share their names, so each corpus looks for them in its own
directories (as Maruf's repository and G-Transformer's copy name them) and never in the other
corpus' (``find_maruf``).  ``resolve`` picks the first raw format whose files are all there.
"""

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from fairseq_sparse.data.document_readers import Doc, reader_for
from fairseq_sparse.data.errors import PrepError
from fairseq_sparse.data.raw import find_raw, missing_entry
from fairseq_sparse.data.text import SPLITS

logger = logging.getLogger("fairseq_sparse.data")

SRC, TGT = "en", "de"

MARUF_SPLITS = {"train": "train", "valid": "dev", "test": "test"}


def maruf_name(split: str, lang: str) -> str:
    """The name of one of Maruf et al.'s files, e.g. ``concatenated_en2de_dev_de.txt``."""
    return f"concatenated_en2de_{MARUF_SPLITS[split]}_{lang}.txt"


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


@dataclass(frozen=True)
class Corpus:
    """One document-level corpus: its output name, where its files are, its raw formats."""

    key: str
    name: str
    dirs: Tuple[str, ...]          # sub-directories that hold its Maruf-format files
    hf_dir: str                    # G-Transformer's copy (Hugging Face gshbao/DocNMT)
    sources: Tuple[Source, ...]


CORPORA = {
    "ted": Corpus("ted", "ted17.doc.en-de", ("iwslt17", "IWSLT2017", "iwslt2017", "ted"), "iwslt17",
                  (MARUF, IWSLT17)),
    "news": Corpus("news", "nc11.doc.en-de", ("nc2016", "NC-2016", "nc-2016", "nc11", "news"), "nc2016",
                   (MARUF,)),
}
# directories of the other document-level corpora in Maruf's / G-Transformer's layout
_ALL_DIRS = {d.lower() for c in CORPORA.values() for d in c.dirs} | {"europarl7"}


def download_ids(corpus: Corpus) -> List[str]:
    """Maruf et al.'s files of ``corpus`` (ids of ``configs/downloads.yaml``: G-Transformer's copy on
    the Hugging Face hub, else Maruf's repository where it has the file)."""
    return [f"docnmt/{corpus.hf_dir}/{maruf_name(split, lang)}" for split in SPLITS for lang in (SRC, TGT)]


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
    """The files of ``source`` found (by name), and the entries of those missing."""
    found, missing = {}, []
    for name in source.names():
        if source.maruf:
            path = find_maruf(raw_dir, name, corpus)
        else:
            path = find_raw(raw_dir, name)
        if path is None:
            missing.append(missing_entry(name))
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

    def listing(missing: List[str]) -> str:
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
    """The documents of ``split`` (an index where a format gives no id) and the number of pairs
    dropped for an empty side."""
    docs: List[Doc] = []
    dropped = 0
    for a, b in source.files[split]:
        part, n = reader_for(found[a].name.removesuffix(".gz"))(found[a], found[b], encoding)
        docs += part
        dropped += n
    for i, d in enumerate(docs):
        d.id = d.id or str(i)
    return docs, dropped

