"""Reading parallel documents from the raw formats of the document-level corpora.

Three formats (see ``documents``' docstring for where they come from): Maruf et al.'s files
(a ``<d>`` line starts each document), IWSLT ``train.tags.*`` (each run of metadata lines
starts a talk) and IWSLT XML (``<doc docid=...>`` with ``<seg>`` sentences).  Every reader
pairs the two sides' sentences, decodes XML entities, folds white space and drops the pairs
with an empty side, as G-Transformer's recipe does.
"""

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Tuple

from fairseq_sparse.data.errors import PrepError
from fairseq_sparse.data.raw import raw_lines, unescape

@dataclass
class Doc:
    """One parallel document: its identifier and its aligned sentences."""

    id: str
    src: List[str] = field(default_factory=list)
    tgt: List[str] = field(default_factory=list)


def clean(text: str) -> str:
    """XML entities decoded, white space normalised (``\\r``, and the line separators
    U+2028, U+0085 ... that would break the one-sentence-a-line files, become spaces)."""
    return " ".join(unescape(text).split())


class _DocBuilder:
    """Collects sentence pairs into documents; drops pairs with an empty side."""

    def __init__(self) -> None:
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
    return raw_lines(path, encoding, newline="\n")


def _line_pairs(src: Path, tgt: Path, encoding: str) -> Iterator[Tuple[int, str, str]]:
    """(line number, source line, target line); a PrepError where one file ends first."""
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
    """(docid, its segments' text) of each document of one XML file."""
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


Reader = Callable[[Path, Path, str], Tuple[List[Doc], int]]  # (src, tgt, encoding) -> (documents, pairs dropped)


def reader_for(name: str) -> Reader:
    """The reader of a raw file, by its name (``.gz`` removed)."""
    if name.endswith(".xml"):
        return read_xml
    if name.startswith("train.tags."):
        return read_tags
    return read_maruf

