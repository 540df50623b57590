#!/usr/bin/env python3
"""IWSLT17 French-English (TED talks), from the official XML/tags release.

The Top-k Selective Attention paper says only: fairseq's preprocessing, Moses
tokenisation, then subword units.  Implemented:

* raw data: ``fr-en.tgz`` of the IWSLT 2017 TED task (``2017-01-trnted``), i.e.
  ``train.tags.fr-en.{fr,en}`` and ``IWSLT17.TED.{dev2010,tst2010,...,tst2015}
  .fr-en.{fr,en}.xml``;
* valid: dev2010 (``--valid-sets``), test: tst2015 (``--test-sets``; several
  sets are concatenated in the order given);
* Moses tokenisation (cased), Moses cleaning (ratio 1.5, 1-175 tokens, as in
  fairseq's IWSLT recipe) on the tokenised training text;
* ``--subword bpe`` (default): joint BPE, 10,000 merges (fairseq's IWSLT recipe);
  ``--subword spm``: a joint sentencepiece BPE model of ``--vocab-size`` pieces
  (16,000: fairseq's IWSLT17 recipe) on the punctuation-normalised text;
* binarised with a joined dictionary.

Examples::

    python -m fairseq_sparse.data.iwslt17_fr_en --raw ~/data/iwslt17/fr-en --out data/iwslt17.fr-en
    python -m fairseq_sparse.data.iwslt17_fr_en --download --out data/iwslt17.fr-en
    python -m fairseq_sparse.data.iwslt17_fr_en --raw ~/data/iwslt17/fr-en --subword spm --out data/iwslt17.fr-en.spm
"""

import argparse
import sys
from typing import List, Optional, Sequence

from fairseq_sparse.data import cli
from fairseq_sparse.data.job import Job, Pair, iwslt_sets, iwslt_train

DOWNLOADS = ["iwslt17/fr-en"]   # configs/downloads.yaml


def build_parser() -> argparse.ArgumentParser:
    p = cli.base_parser(__doc__, "data/iwslt17.fr-en")
    p.add_argument("--valid-sets", default="dev2010", help="comma-separated (default dev2010)")
    p.add_argument("--test-sets", default="tst2015", help="comma-separated (default tst2015)")
    p.add_argument("--subword", choices=("bpe", "spm"), default="bpe")
    p.add_argument("--merges", type=int, default=10000, help="joint BPE merges (default 10000)")
    p.add_argument("--vocab-size", type=int, default=16000,
                   help="sentencepiece vocabulary with --subword spm (default 16000)")
    cli.add_filter_args(p, 175, 1.5)
    return p


def build_job(args: argparse.Namespace) -> Job:
    src, tgt = "fr", "en"

    def ted(names: str) -> List[Pair]:
        return iwslt_sets(17, "fr-en", src, tgt, [f"TED.{s}" for s in cli.comma_separated(names)])

    return Job(
        name="iwslt17.fr-en", src=src, tgt=tgt,
        corpora={"train": iwslt_train("fr-en", src, tgt), "valid": ted(args.valid_sets), "test": ted(args.test_sets)},
        subword=args.subword, merges=args.merges, vocab_size=args.vocab_size,
        clean_on="tok" if args.subword == "bpe" else "subword",
        max_len=args.max_len, ratio=args.ratio, joined_dictionary=True,
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    return cli.main_with(build_job, lambda args: DOWNLOADS, build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
