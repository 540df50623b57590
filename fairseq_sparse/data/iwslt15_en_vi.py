#!/usr/bin/env python3
"""IWSLT15 English-Vietnamese (TED talks), word level, from Stanford's files.

As in the Explicit Sparse Transformer and Top-k Selective Attention papers:

* raw data: the preprocessed (already Moses-tokenised) files of the Stanford NMT
  project, ``train.{en,vi}`` (133K pairs), ``tst2012.{en,vi}`` (valid),
  ``tst2013.{en,vi}`` (test) and, optionally, ``vocab.{en,vi}``;
* no further tokenisation and no subword segmentation (word level);
* no length filter: only pairs with an empty side are dropped from train
  (``--max-len``/``--ratio`` to add one);
* dictionaries: Stanford's ``vocab.en`` (17,191 words) and ``vocab.vi`` (7,709)
  when present, which is the vocabulary of about 17,200 / 7,800 the papers
  report; otherwise every training word (``--no-stanford-vocab`` to force that);
* ``{valid,test}.raw.{en,vi}``: the references detokenised with sacremoses.

Examples::

    python -m fairseq_sparse.data.iwslt15_en_vi --raw ~/data/iwslt15.en-vi --out data/iwslt15.en-vi
    python -m fairseq_sparse.data.iwslt15_en_vi --download --out data/iwslt15.en-vi
"""

import argparse
import sys
from typing import List, Optional, Sequence

from fairseq_sparse.data import cli
from fairseq_sparse.data.job import Job, Pair
from fairseq_sparse.data.raw import Raw

DOWNLOADS = [f"iwslt15/{name}.{lang}" for name in ("train", "tst2012", "tst2013", "vocab")
             for lang in ("en", "vi")]   # configs/downloads.yaml
SRC, TGT = "en", "vi"


def build_parser() -> argparse.ArgumentParser:
    p = cli.base_parser(__doc__, "data/iwslt15.en-vi")
    p.add_argument("--no-stanford-vocab", action="store_true",
                   help="build the dictionaries from the training words instead of vocab.*")
    cli.add_filter_args(p, 0, 0)
    return p


def stanford(name: str) -> List[Pair]:
    """Stanford's plain files ``{name}.en`` / ``{name}.vi``."""
    return [(Raw(f"{name}.{SRC}", "plain"), Raw(f"{name}.{TGT}", "plain"))]


def build_job(args: argparse.Namespace) -> Job:
    return Job(
        name="iwslt15.en-vi", src=SRC, tgt=TGT,
        corpora={"train": stanford("train"), "valid": stanford("tst2012"), "test": stanford("tst2013")},
        tokenize=False, subword="none", clean_on="tok",
        max_len=args.max_len, ratio=args.ratio, joined_dictionary=False, detok_refs=True,
        dict_files={} if args.no_stanford_vocab else
        {SRC: Raw(f"vocab.{SRC}", "plain"), TGT: Raw(f"vocab.{TGT}", "plain")},
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    return cli.main_with(build_job, lambda args: DOWNLOADS, build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
