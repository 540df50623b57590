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

import sys

from fairseq_sparse.data import common
from fairseq_sparse.data.common import Job, Raw

URLS = [
    "http://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz"
    "|https://wit3.fbk.eu/archive/2014-01/texts/de/en/de-en.tgz",
]
TEST_SETS = ["TED.dev2010", "TEDX.dev2012", "TED.tst2010", "TED.tst2011", "TED.tst2012"]


def build_job(args) -> Job:
    src, tgt = "de", "en"
    test = [(Raw(f"IWSLT14.{t}.de-en.{src}.xml", "seg"), Raw(f"IWSLT14.{t}.de-en.{tgt}.xml", "seg"))
            for t in TEST_SETS]
    return Job(
        name="iwslt14.de-en", src=src, tgt=tgt,
        corpora={"train": [(Raw(f"train.tags.de-en.{src}", "tags"),
                            Raw(f"train.tags.de-en.{tgt}", "tags"))],
                 "test": test},
        lowercase=not args.cased, subword="bpe", merges=args.merges,
        clean_on="tok", max_len=args.max_len, ratio=args.ratio,
        joined_dictionary=args.joined_dictionary, valid_from_train=23,
    )


def build_parser():
    p = common.base_parser(__doc__, "data/iwslt14.de-en")
    p.add_argument("--merges", type=int, default=10000, help="joint BPE merges (default 10000)")
    p.add_argument("--cased", action="store_true", help="do not lowercase")
    p.add_argument("--joined-dictionary", action="store_true",
                   help="one dictionary for both languages")
    common.add_filter_args(p, 175, 1.5)
    return p


def main(argv=None) -> int:
    return common.main_with(build_job, lambda a: URLS, build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
