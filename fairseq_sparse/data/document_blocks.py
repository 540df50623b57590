#!/usr/bin/env python3
"""Pack sentence-aligned documents into blocks of at most 512 tokens for document-level NMT.

Bao et al. (2021)'s setting, used by the Extremely Sparse Transformer paper: the
consecutive sentences of a document are packed greedily into a block while the block
fits on both sides; a block never crosses a document boundary. Sentences inside a block
are separated by a separator token (default ``<sep>``) so they can be recovered::

    python -m fairseq_sparse.data.bible --pair de-en --level document --max-len 100000 --out data/bible-doc
    python -m fairseq_sparse.data.document_blocks --in data/bible-doc --out data/bible-blocks --src-lang de --tgt-lang en
    fairseq-preprocess --source-lang de --target-lang en --joined-dictionary \\
        --trainpref data/bible-blocks/train --validpref data/bible-blocks/valid \\
        --testpref data/bible-blocks/test --destdir data/bible-blocks/bin

Input, for each split and language, in ``--in``:

* ``{split}.{prefix}.{lang}``: tokenised (BPE) text, one sentence per line, documents
  one after the other (``--prefix``, default ``sentences``, as ``bible.py --level
  document`` writes them);
* ``{split}.sentcount``: the number of sentences of each document, one per line. Without
  it, an empty line ends each document (in both languages' files);
* optional ``{split}.{prefix}.raw.{lang}``: the raw (detokenised) sentences, same layout;
* optional ``{split}.ids``: one identifier per document.

Output in ``--out``:

* ``{split}.{lang}``: one block per line (what fairseq-preprocess reads);
* ``{split}.blocks.tsv``: per block, with a header: ``document`` (0-based index),
  ``first_sentence`` (index in the document), ``num_sentences``, ``document_id``;
* ``{split}.raw.{lang}`` if raw sentences were given: one whole document per line, its
  sentences joined by a space (the references of d-BLEU, ``python -m
  fairseq_sparse.evaluate GEN test.raw.en --documents test.blocks.tsv``).

Length of a block on a side = its tokens + its separators + the end-of-sentence token
fairseq appends, so a model never sees more than ``--max-tokens`` positions. A sentence
that alone is longer is cut to fit (a warning counts them): blocks never exceed the limit.
"""

import argparse
import csv
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_sparse.data.text import write_lines

logger = logging.getLogger("data_prep.document_blocks")

SEPARATOR = "<sep>"  # between the sentences of a block; also fairseq_sparse.evaluate's --separator
MAX_TOKENS = 512
MAP_COLUMNS = ("document", "first_sentence", "num_sentences", "document_id")

Document = List[str]  # its sentences, one string of space-separated tokens each


class BlockError(Exception):
    """A problem with the input that ends the run with one clear message."""


@dataclass(frozen=True)
class Block:
    document: int
    first_sentence: int
    num_sentences: int


def block_length(sentences: Sequence[str]) -> int:
    """Positions a block takes: tokens, one separator between sentences, and fairseq's </s>."""
    return sum(len(s.split()) for s in sentences) + len(sentences) - 1 + 1


def pack_document(src: Document, tgt: Document, max_tokens: int) -> List[Tuple[int, int]]:
    """Greedy packing: (first sentence, number of sentences) of each block of one document."""
    spans: List[Tuple[int, int]] = []
    for i in range(len(src)):
        if spans:
            first, count = spans[-1]
            if max(block_length(src[first : i + 1]), block_length(tgt[first : i + 1])) <= max_tokens:
                spans[-1] = (first, count + 1)
                continue
        spans.append((i, 1))
    return spans


def fit_sentence(sentence: str, max_tokens: int) -> Tuple[str, bool]:
    """The sentence cut to the tokens a block of one sentence can hold; and whether it was cut."""
    tokens = sentence.split()
    if len(tokens) + 1 <= max_tokens:
        return sentence, False
    return " ".join(tokens[: max_tokens - 1]), True


def block_text(sentences: Sequence[str], separator: str = SEPARATOR) -> str:
    return f" {separator} ".join(" ".join(s.split()) for s in sentences)


def make_blocks(
    src_docs: Sequence[Document], tgt_docs: Sequence[Document], max_tokens: int = MAX_TOKENS, separator: str = SEPARATOR
) -> Tuple[List[Block], List[str], List[str]]:
    """Blocks of every document, with their source and target lines."""
    if max_tokens < 2:
        raise BlockError(f"--max-tokens must be at least 2 (a token and </s>), got {max_tokens}")
    blocks, src_lines, tgt_lines, cut = [], [], [], 0
    for d, (src, tgt) in enumerate(zip(src_docs, tgt_docs)):
        if len(src) != len(tgt):
            raise BlockError(f"document {d} has {len(src)} source but {len(tgt)} target sentences")
        fitted = [[fit_sentence(s, max_tokens) for s in side] for side in (src, tgt)]
        cut += sum(was_cut for side in fitted for _, was_cut in side)
        src, tgt = ([s for s, _ in side] for side in fitted)
        for first, count in pack_document(src, tgt, max_tokens):
            blocks.append(Block(d, first, count))
            src_lines.append(block_text(src[first : first + count], separator))
            tgt_lines.append(block_text(tgt[first : first + count], separator))
    if cut:
        logger.warning("%d sentences longer than %d tokens were cut to fit a block", cut, max_tokens)
    return blocks, src_lines, tgt_lines


def unblock(block_lines: Sequence[str], blocks: Sequence[Block], separator: str = SEPARATOR) -> List[Document]:
    """The documents (as sentence lists) back from block lines and the block map."""
    documents: Dict[int, Document] = {}
    for line, block in zip(block_lines, blocks, strict=True):
        sentences = split_block(line, separator)
        if len(sentences) != block.num_sentences:
            raise BlockError(f"a block of document {block.document} has {len(sentences)} sentences, the map says {block.num_sentences}")
        documents.setdefault(block.document, []).extend(sentences)
    return [documents[d] for d in sorted(documents)]


def split_block(line: str, separator: str = SEPARATOR, drop_empty: bool = False) -> List[str]:
    """The sentences of a block line, split at separator tokens.

    A block written by ``blocks_of`` holds exactly its map's sentences, empty ones included
    (``unblock`` checks the count). A *translated* block is model output: a stray or doubled
    separator makes no sentence there, so evaluation splits it with ``drop_empty=True``.
    """
    sentences: List[List[str]] = [[]]
    for token in line.split():
        if token == separator:
            sentences.append([])
        else:
            sentences[-1].append(token)
    return [" ".join(tokens) for tokens in sentences if tokens or not drop_empty]


# ------------------------------------------------------------------ files


def read_documents(path: Path, sentcount: Optional[Sequence[int]]) -> List[Document]:
    """Documents of a one-sentence-a-line file: split by sentence counts, else at empty lines."""
    lines = path.read_text(encoding="utf-8").splitlines()
    if sentcount is None:
        documents: List[Document] = [[]]
        for line in lines:
            if line.strip():
                documents[-1].append(line)
            elif documents[-1]:
                documents.append([])
        return [d for d in documents if d]
    if sum(sentcount) != len(lines):
        raise BlockError(f"{path} has {len(lines)} lines, the sentence counts add up to {sum(sentcount)}")
    starts = [sum(sentcount[:i]) for i in range(len(sentcount))]
    return [lines[a : a + n] for a, n in zip(starts, sentcount)]


def read_sentcount(path: Path) -> Optional[List[int]]:
    if not path.is_file():
        return None
    counts = [int(x) for x in path.read_text().split()]
    if any(c < 1 for c in counts):
        raise BlockError(f"{path}: every document needs at least one sentence")
    return counts


def write_block_map(path: Path, blocks: Sequence[Block], document_ids: Sequence[str]) -> None:
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(MAP_COLUMNS)
        for b in blocks:
            writer.writerow((b.document, b.first_sentence, b.num_sentences, document_ids[b.document]))


def read_block_map(path: Path) -> List[Block]:
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    return [Block(int(r["document"]), int(r["first_sentence"]), int(r["num_sentences"])) for r in rows]


def block_split(args: argparse.Namespace, split: str) -> Dict[str, int]:
    """Block one split; returns its numbers of documents, sentences and blocks."""
    src_dir, out = Path(args.input), Path(args.out)
    sentcount = read_sentcount(src_dir / f"{split}.sentcount")
    docs = {}
    for lang in (args.src_lang, args.tgt_lang):
        path = src_dir / f"{split}.{args.prefix}.{lang}"
        if not path.is_file():
            raise BlockError(f"no such file: {path}")
        docs[lang] = read_documents(path, sentcount)
    if len(docs[args.src_lang]) != len(docs[args.tgt_lang]):
        raise BlockError(f"{split}: {len(docs[args.src_lang])} source but {len(docs[args.tgt_lang])} target documents")
    blocks, src_lines, tgt_lines = make_blocks(docs[args.src_lang], docs[args.tgt_lang], args.max_tokens, args.separator)

    ids_path = src_dir / f"{split}.ids"
    ids = ids_path.read_text(encoding="utf-8").splitlines() if ids_path.is_file() else []
    if len(ids) != len(docs[args.src_lang]):
        ids = [str(d) for d in range(len(docs[args.src_lang]))]
    out.mkdir(parents=True, exist_ok=True)
    write_lines(out / f"{split}.{args.src_lang}", src_lines)
    write_lines(out / f"{split}.{args.tgt_lang}", tgt_lines)
    write_block_map(out / f"{split}.blocks.tsv", blocks, ids)
    for lang in (args.src_lang, args.tgt_lang):
        raw = src_dir / f"{split}.{args.prefix}.raw.{lang}"
        if raw.is_file():
            write_lines(out / f"{split}.raw.{lang}", (" ".join(d) for d in read_documents(raw, sentcount)))
    return {"documents": len(docs[args.src_lang]), "sentences": sum(map(len, docs[args.src_lang])), "blocks": len(blocks)}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fairseq_sparse.data.document_blocks", description=__doc__.split("\n\n")[0])
    p.add_argument("--in", dest="input", required=True, help="directory of one-sentence-a-line files")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--src-lang", required=True)
    p.add_argument("--tgt-lang", required=True)
    p.add_argument("--splits", nargs="+", default=["train", "valid", "test"])
    p.add_argument("--prefix", default="sentences", help="input files are {split}.{prefix}.{lang} (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=MAX_TOKENS,
                   help="most positions in a block on either side, </s> included (default: %(default)s)")
    p.add_argument("--separator", default=SEPARATOR, help="token between the sentences of a block (default: %(default)s)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
                        level=os.environ.get("LOGLEVEL", "INFO").upper(), stream=sys.stdout)
    args = build_parser().parse_args(argv)
    try:
        for split in args.splits:
            counts = block_split(args, split)
            logger.info("%s: %d documents, %d sentences -> %d blocks of <= %d tokens", split,
                        counts["documents"], counts["sentences"], counts["blocks"], args.max_tokens)
    except BlockError as e:
        sys.exit(f"document_blocks.py: error: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
