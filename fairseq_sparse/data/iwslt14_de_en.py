#!/usr/bin/env python3
"""IWSLT14 German-English (TED talks), following fairseq's ``prepare-iwslt14.sh``.

The recipe used by the Explicit Sparse Transformer paper ("default scripts of
fairseq v0.6.1"):

* raw data: ``de-en.tgz`` of the IWSLT14 evaluation campaign, i.e.
  ``train.tags.de-en.{de,en}`` and ``IWSLT14.TED{,X}.{dev2010,dev2012,tst2010,
  tst2011,tst2012}.de-en.{de,en}.xml``;
* Moses tokenisation, Moses ``clean-corpus-n.perl -ratio 1.5`` with 1-175 tokens
  on the tokenised training text, lowercasing (case-insensitive BLEU);
* valid: every 23rd line of the cleaned training data (about 7K pairs), train:
  the rest (about 160K pairs);
* test: dev2010 + TEDX dev2012 + tst2010 + tst2011 + tst2012 (about 6.8K pairs);
* joint BPE with 10,000 merges learnt on train (``--merges``);
* binarised with ``fairseq-preprocess`` into ``OUT/bin`` (separate dictionaries as
  in fairseq's example; ``--joined-dictionary`` to share one).

Examples::

    python -m fairseq_sparse.data.iwslt14_de_en --raw ~/data/iwslt14/de-en --out data/iwslt14.de-en
    python -m fairseq_sparse.data.iwslt14_de_en --download --out data/iwslt14.de-en
"""

import argparse
import sys
from typing import Optional, Sequence

from fairseq_sparse.data import cli
from fairseq_sparse.data.job import Job, iwslt_sets, iwslt_train

DOWNLOADS = ["iwslt14/de-en.tgz"]   # configs/downloads.yaml
TEST_SETS = ["TED.dev2010", "TEDX.dev2012", "TED.tst2010", "TED.tst2011", "TED.tst2012"]


def build_parser() -> argparse.ArgumentParser:
    p = cli.base_parser(__doc__, "data/iwslt14.de-en")
    p.add_argument("--merges", type=int, default=10000, help="joint BPE merges (default 10000)")
    p.add_argument("--cased", action="store_true", help="do not lowercase")
    p.add_argument("--joined-dictionary", action="store_true",
                   help="one dictionary for both languages")
    cli.add_filter_args(p, 175, 1.5)
    return p


def build_job(args: argparse.Namespace) -> Job:
    src, tgt = "de", "en"
    return Job(
        name="iwslt14.de-en", src=src, tgt=tgt,
        corpora={"train": iwslt_train("de-en", src, tgt), "test": iwslt_sets(14, "de-en", src, tgt, TEST_SETS)},
        lowercase=not args.cased, subword="bpe", merges=args.merges,
        clean_on="tok", max_len=args.max_len, ratio=args.ratio,
        joined_dictionary=args.joined_dictionary, valid_from_train=23,
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    return cli.main_with(build_job, lambda args: DOWNLOADS, build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
