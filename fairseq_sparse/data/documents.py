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
import logging
import shutil
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from fairseq_sparse.data import cli, document_blocks
from fairseq_sparse.data.binarise import binarize, dictionary_size, find_tool
from fairseq_sparse.data.document_corpora import CORPORA, SRC, TGT, Corpus, download_ids, read_split, resolve
from fairseq_sparse.data.document_readers import Doc
from fairseq_sparse.data.download import download
from fairseq_sparse.data.errors import PrepError
from fairseq_sparse.data.moses import process_lines
from fairseq_sparse.data.raw import check_encoding
from fairseq_sparse.data.subwords import apply_bpe, learn_bpe
from fairseq_sparse.data.text import SPLITS, read_lines, write_lines

logger = logging.getLogger("fairseq_sparse.data")

DEFAULT_MERGES = 30000


def prepare(corpus: Corpus, raw_dir: Path, out: Path, merges: int = DEFAULT_MERGES,
            max_tokens: int = document_blocks.MAX_TOKENS, workers: int = 1,
            keep_tmp: bool = False, encoding: str = "utf-8") -> Dict[str, object]:
    """The whole preparation of one corpus; returns the summary it prints."""
    if max_tokens < 2:
        raise PrepError(f"--max-tokens must be at least 2 (a token and </s>), got {max_tokens}")
    source, found = resolve(corpus, raw_dir)     # before anything is written
    find_tool("fairseq-preprocess")
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
    for split, split_docs in docs.items():
        write_sentences(split, split_docs, tmp, workers)
    del docs
    segment(tmp, out / "bpecodes", merges)
    counts = write_blocks(tmp, out, max_tokens)
    dest = binarize(out, SRC, TGT, True, workers)
    summary: Dict[str, object] = {
        "dataset": corpus.name, "format": source.label, "max_tokens": max_tokens, "splits": counts,
        "vocab": {lang: dictionary_size(dest, lang) for lang in (SRC, TGT)},
        "bin": str(dest),
    }
    if not keep_tmp:
        shutil.rmtree(tmp)
    print_summary(summary)
    return summary


def write_sentences(split: str, docs: List[Doc], tmp: Path, workers: int) -> None:
    """One sentence a line, documents one after the other (``document_blocks``' input): the raw
    sentences (for valid and test, the references) and the tokenised ones."""
    write_lines(tmp / f"{split}.sentcount", (str(len(d.src)) for d in docs))
    write_lines(tmp / f"{split}.ids", (d.id for d in docs))
    for lang in (SRC, TGT):
        raw = tmp / (f"{split}.text.{lang}" if split == "train" else f"{split}.sentences.raw.{lang}")
        write_lines(raw, (s for d in docs for s in (d.src if lang == SRC else d.tgt)))
        write_lines(tmp / f"{split}.tok.{lang}", process_lines(read_lines(raw), lang, "tok", workers))


def segment(tmp: Path, codes: Path, merges: int) -> None:
    """Joint BPE learnt on the tokenised training text, applied to every split's sentences."""
    logger.info("learning %d joint BPE merges", merges)
    learn_bpe(read_lines(*(tmp / f"train.tok.{lang}" for lang in (SRC, TGT))), codes, merges)
    for split in SPLITS:
        for lang in (SRC, TGT):
            apply_bpe(codes, tmp / f"{split}.tok.{lang}", tmp / f"{split}.sentences.{lang}")


def write_blocks(tmp: Path, out: Path, max_tokens: int) -> Dict[str, Dict[str, int]]:
    """Blocks of at most ``max_tokens``, the block maps and the one-document-a-line references,
    with ``document_blocks``; returns its counts per split."""
    for split in SPLITS:
        for lang in (SRC, TGT):
            (out / f"{split}.raw.{lang}").unlink(missing_ok=True)
    args = argparse.Namespace(input=str(tmp), out=str(out), src_lang=SRC, tgt_lang=TGT, prefix="sentences",
                              max_tokens=max_tokens, separator=document_blocks.SEPARATOR)
    try:
        return {split: document_blocks.block_split(args, split) for split in SPLITS}
    except document_blocks.BlockError as e:
        raise PrepError(str(e)) from None


def print_summary(summary: Dict[str, object]) -> None:
    print(f"{summary['dataset']} (from {summary['format']}), blocks of <= {summary['max_tokens']} tokens:")
    for split, c in summary["splits"].items():
        print(f"  {split}: {c['documents']} documents, {c['sentences']} sentences, {c['blocks']} blocks")
    print("  dictionary sizes (joined; without fairseq's 4 special symbols): "
          + ", ".join(f"{lang} {n}" for lang, n in summary["vocab"].items()))
    print(f"  binarised data: {summary['bin']}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fairseq_sparse.data.documents", description=__doc__.split("\n\n")[0],
                                epilog="See the module docstring (top of this file) for formats and splits.")
    p.add_argument("--corpus", required=True, choices=sorted(CORPORA),
                   help="ted: IWSLT17 TED talks; news: News-Commentary v11 (both English->German)")
    cli.add_common_args(p, "download Maruf et al.'s files into OUT/raw (or --raw-dir) first", no_binarize=False)
    p.add_argument("--merges", type=int, default=DEFAULT_MERGES,
                   help=f"joint BPE merge operations (default {DEFAULT_MERGES}, as G-Transformer)")
    p.add_argument("--max-tokens", type=int, default=document_blocks.MAX_TOKENS,
                   help="most positions of a block on either side, </s> included (default %(default)s)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    cli.setup_logging()
    corpus = CORPORA[args.corpus]

    def work() -> None:
        raw_dir = cli.raw_directory(args)
        if args.download:
            download(download_ids(corpus), raw_dir / corpus.hf_dir)
        prepare(corpus, raw_dir, Path(args.out), merges=args.merges, max_tokens=args.max_tokens,
                workers=args.workers, keep_tmp=args.keep_tmp, encoding=check_encoding(args.encoding))

    return cli.report_errors(work)


if __name__ == "__main__":
    sys.exit(main())
