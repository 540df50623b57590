#!/usr/bin/env python3
"""WMT news translation data (2014, 2016, 2017, 2018), one script for all pairs.

    python -m fairseq_sparse.data.wmt --year 14 --pair en-de --raw DIR --out data/wmt14.en-de
    python -m fairseq_sparse.data.wmt --year 14 --pair en-de --char --raw DIR --out data/wmt14.en-de.char
    python -m fairseq_sparse.data.wmt --year 14 --pair en-fr --download --out data/wmt14.en-fr
    python -m fairseq_sparse.data.wmt --year 16 --pair ro-en --raw DIR --out data/wmt16.ro-en
    python -m fairseq_sparse.data.wmt --year 17 --pair de-en --raw DIR --out data/wmt17.de-en
    python -m fairseq_sparse.data.wmt --year 18 --pair zh-en --raw DIR --out data/wmt18.zh-en
    python -m fairseq_sparse.data.wmt --year 18 --pair en-fi --raw DIR --out data/wmt18.en-fi

``--pair src-tgt`` gives the direction of the binarised data and of the test set
(WMT SGML files are per direction); the training data is the same both ways.

Raw data (``--raw DIR``: the official archives extracted anywhere below DIR, files
are found by name; ``--download``: fetched from the official URLs, see ``--list``):

* 2014 en-de (Vaswani et al.'s 4.5M pairs, fairseq's ``prepare-wmt14en2de.sh
  --icml17``): europarl-v7, commoncrawl, news-commentary-v9;
  valid newstest2013, test newstest2014 (``test-full``);
* 2014 en-fr (36M pairs, fairseq's ``prepare-wmt14en2fr.sh``): europarl-v7,
  commoncrawl, UN (undoc.2000), news-commentary-v9, giga-fren;
  valid newstest2013, test newstest2014;
* 2016 en-ro (608K pairs): europarl-v8, SETIMES2; valid newsdev2016, test
  newstest2016;
* 2017 {cs,de,fi,lv,ru,tr,zh}-en, both directions (the 12+ directions of the hard
  retrieval attention paper): the organisers' *preprocessed* data
  (``preprocessed/{pair}/corpus.tc.*.gz``: tokenised, truecased, cleaned;
  ``dev.tgz``: newstest2016 / newsdev2017 ``.tc``; ``true.tgz``: truecasing models),
  test newstest2017 from ``test.tgz`` (SGML), Moses-tokenised and truecased here
  with the organisers' models (Chinese test text: split into characters, which
  differs from the organisers' segmentation of the Chinese training side);
* 2018 zh-en (the parallel data without the registration-only CWMT part, which
  ``--extra-train`` adds): news-commentary-v13, UN v1.0; valid newstest2017, test
  newstest2018; Chinese split into characters before Moses tokenisation (no
  Chinese word segmenter is used); separate dictionaries;
* 2018 en-fi (3.3M pairs): europarl-v8, ParaCrawl v1 (zipporah-cleaned),
  rapid2016, wiki headlines; valid newstest2017, test newstest2018.

Processing (papers: joint BPE with 32K merges for WMT14 En-De/En-Fr, WMT16,
WMT17 and WMT18, newstest of the previous year as valid, official test set of
the year): Moses punctuation normalisation and tokenisation (``-a`` for 2014 as in
fairseq's recipes), joint BPE learnt on train (``--merges``, default 32000), then
Moses cleaning of train after BPE (ratio 1.5, 1-250 tokens; 2017: 1-256 tokens,
no ratio, as in the hard retrieval attention paper).  ``--subword spm`` trains a
joint sentencepiece model instead (``--vocab-size``).  ``--char`` (2014 en-de):
character level, the Moses-normalised untokenised text split into characters with
``▁`` for the spaces (up to 1024 characters a side).  ``--valid-sets`` /
``--test-sets`` (comma-separated) override the evaluation sets, e.g.
``newstest2012,newstest2013`` (the hard retrieval paper's WMT14 valid set).
"""

import argparse
import sys
from typing import List, Optional, Sequence

from fairseq_sparse.data import cli
from fairseq_sparse.data.errors import PrepError
from fairseq_sparse.data.job import Job, Pair
from fairseq_sparse.data.raw import Raw

# (year, "xx-yy" sorted as the corpora name them) -> what the dataset is made of.
# train: corpus prefixes; the files are f"{prefix}.{lang}" (optionally .gz).
DATASETS = {
    (14, "de-en"): dict(
        train=["europarl-v7.de-en", "commoncrawl.de-en", "news-commentary-v9.de-en"],
        valid="newstest2013", test="newstest2014", aggressive=True,
        downloads=["wmt13/training-parallel-europarl-v7.tgz", "wmt13/training-parallel-commoncrawl.tgz",
                   "wmt14/training-parallel-nc-v9.tgz", "wmt14/dev.tgz", "wmt14/test-full.tgz"]),
    (14, "en-fr"): dict(
        train=["europarl-v7.fr-en", "commoncrawl.fr-en", "undoc.2000.fr-en",
               "news-commentary-v9.fr-en", "giga-fren.release2.fixed"],
        valid="newstest2013", test="newstest2014", aggressive=True,
        downloads=["wmt13/training-parallel-europarl-v7.tgz", "wmt13/training-parallel-commoncrawl.tgz",
                   "wmt13/training-parallel-un.tgz", "wmt14/training-parallel-nc-v9.tgz",
                   "wmt10/training-giga-fren.tar", "wmt14/dev.tgz", "wmt14/test-full.tgz"]),
    (16, "en-ro"): dict(
        train=["europarl-v8.ro-en", "SETIMES.en-ro|SETIMES2.en-ro"],
        valid="newsdev2016", test="newstest2016",
        downloads=["wmt16/training-parallel-ep-v8.tgz", "opus/SETIMES2.en-ro.txt.zip",
                   "wmt16/dev-romanian-updated.tgz", "wmt16/test.tgz"]),
    (18, "en-zh"): dict(
        train=["news-commentary-v13.zh-en", "UNv1.0.en-zh"],
        valid="newstest2017", test="newstest2018", joined=False, ratio=0,
        downloads=["wmt18/training-parallel-nc-v13.tgz", "un/UNv1.0.en-zh.tar.gz", "wmt18/dev.tgz",
                   "wmt18/test.tgz"]),
    (18, "en-fi"): dict(
        train=["europarl-v8.fi-en", "paracrawl-release1.en-fi.zipporah0-dedup-clean",
               "rapid2016.en-fi", "titles.fi-en"],
        valid="newstest2017", test="newstest2018",
        downloads=["wmt16/training-parallel-ep-v8.tgz", "paracrawl/release1.en-fi.zipporah0-dedup-clean.tgz",
                   "wmt18/rapid2016.tgz", "wmt15/wiki-titles.tgz", "wmt18/dev.tgz", "wmt18/test.tgz"]),
}
WMT17_PAIRS = ("cs-en", "de-en", "fi-en", "lv-en", "ru-en", "tr-en", "zh-en")
WMT17_NEW = ("lv", "zh")  # first year at WMT17: newsdev2017 is their dev set


def _key(pair: str) -> str:
    """A pair as ``DATASETS`` names it: its languages sorted."""
    return "-".join(sorted(pair.split("-")))


def supported() -> List[str]:
    """Every ``year src-tgt`` this script prepares, sorted."""
    out = []
    for year, key in DATASETS:
        a, b = key.split("-")
        out += [f"{year} {a}-{b}", f"{year} {b}-{a}"]
    for p in WMT17_PAIRS:
        a, b = p.split("-")
        out += [f"17 {a}-{b}", f"17 {b}-{a}"]
    return sorted(out)


def eval_raw(name: str, lang: str, src: str, tgt: str) -> Raw:
    """The file of one side of a WMT dev/test set, by the organisers' names:
    ``newstest2014-deen-src.de.sgm``, ``newstest2013-src.de.sgm``, ``newstest2013.de``."""
    d, r = f"{src}{tgt}", f"{tgt}{src}"
    if lang == src:
        cands = [f"{name}-{d}-src.{lang}.sgm", f"{name}-{r}-src.{lang}.sgm",
                 f"{name}-{r}-ref.{lang}.sgm", f"{name}-{d}-ref.{lang}.sgm"]
    else:
        cands = [f"{name}-{d}-ref.{lang}.sgm", f"{name}-{r}-ref.{lang}.sgm",
                 f"{name}-{r}-src.{lang}.sgm", f"{name}-{d}-src.{lang}.sgm"]
    cands += [f"{name}-src.{lang}.sgm", f"{name}-ref.{lang}.sgm", f"{name}.{lang}"]
    return Raw("|".join(cands), "auto")


def build_job(args: argparse.Namespace) -> Job:
    """The job of ``--year``/``--pair``; a PrepError for a pair this script does not prepare."""
    try:
        src, tgt = args.pair.split("-")
    except ValueError:
        raise PrepError(f"--pair must look like en-de, not {args.pair!r}") from None
    year = args.year % 100
    if f"{year} {src}-{tgt}" not in supported():
        raise PrepError(f"WMT{year} {args.pair} is not prepared by this script; supported: "
                        + ", ".join(supported()))
    if args.char and (year, _key(args.pair)) != (14, "de-en"):
        raise PrepError("--char is only defined for WMT14 en-de / de-en")
    extra = [(Raw(f"{p}.{src}"), Raw(f"{p}.{tgt}")) for p in args.extra_train]

    def evals(names: str) -> List[Pair]:
        return [(eval_raw(s, src, src, tgt), eval_raw(s, tgt, src, tgt)) for s in cli.comma_separated(names)]

    common_kw = dict(merges=args.merges, vocab_size=args.vocab_size,
                     subword="char" if args.char else args.subword)
    if year == 17:
        pair = "-".join(sorted((src, tgt), key=lambda l: l == "en"))   # xx-en
        other = pair.split("-")[0]
        valid = args.valid_sets or ("newsdev2017" if other in WMT17_NEW else "newstest2016")
        test = args.test_sets or "newstest2017"
        tc = lambda s, l: Raw(f"{s}.tc.{l}", "plain")  # noqa: E731
        return Job(
            name=f"wmt17.{src}-{tgt}", src=src, tgt=tgt,
            corpora={"train": [(Raw(f"corpus.tc.{src}", "plain"), Raw(f"corpus.tc.{tgt}", "plain"))] + extra,
                     "valid": [(tc(s, src), tc(s, tgt)) for s in cli.comma_separated(valid)],
                     "test": evals(test)},
            tokenize=False, truecase_splits=("test",),
            truecase_models={l: Raw(f"truecase-model.{l}", "plain") for l in (src, tgt)},
            clean_on="subword", max_len=args.max_len if args.max_len is not None else 256,
            ratio=args.ratio if args.ratio is not None else 0, joined_dictionary=True,
            **common_kw)
    recipe = DATASETS[year, _key(args.pair)]
    char = args.char
    return Job(
        name=f"wmt{year}.{src}-{tgt}" + (".char" if char else ""), src=src, tgt=tgt,
        corpora={"train": [(Raw(f"{p}.{src}" if "|" not in p else "|".join(f"{q}.{src}" for q in p.split("|"))),
                            Raw(f"{p}.{tgt}" if "|" not in p else "|".join(f"{q}.{tgt}" for q in p.split("|"))))
                           for p in recipe["train"]] + extra,
                 "valid": evals(args.valid_sets or recipe["valid"]),
                 "test": evals(args.test_sets or recipe["test"])},
        aggressive_dash=recipe.get("aggressive", False),
        clean_on="subword",
        max_len=args.max_len if args.max_len is not None else (1024 if char else 250),
        ratio=args.ratio if args.ratio is not None else recipe.get("ratio", 1.5),
        joined_dictionary=recipe.get("joined", True) and not args.separate_dictionaries,
        **common_kw)


def downloads(args: argparse.Namespace) -> List[str]:
    """The official files of ``--year``/``--pair`` (``--download``): ids of ``configs/downloads.yaml``."""
    src, tgt = args.pair.split("-")
    year = args.year % 100
    if year == 17:
        pair = "-".join(sorted((src, tgt), key=lambda l: l == "en"))
        return [f"wmt17/preprocessed/{pair}/{name}" for name in
                [f"corpus.tc.{l}.gz" for l in pair.split("-")] + ["dev.tgz", "true.tgz"]] + ["wmt17/test.tgz"]
    return DATASETS[year, _key(args.pair)]["downloads"]


def build_parser() -> argparse.ArgumentParser:
    p = cli.base_parser(__doc__, "data/wmt")
    p.add_argument("--year", type=int, required=True, choices=(14, 16, 17, 18, 2014, 2016, 2017, 2018))
    p.add_argument("--pair", required=True, help="src-tgt, e.g. en-de, ro-en, zh-en")
    p.add_argument("--char", action="store_true", help="character level (WMT14 en-de only)")
    p.add_argument("--subword", choices=("bpe", "spm"), default="bpe")
    p.add_argument("--merges", type=int, default=32000, help="joint BPE merges (default 32000)")
    p.add_argument("--vocab-size", type=int, default=32000,
                   help="sentencepiece vocabulary with --subword spm (default 32000)")
    p.add_argument("--valid-sets", help="comma-separated dev sets (default: see above)")
    p.add_argument("--test-sets", help="comma-separated test sets (default: see above)")
    p.add_argument("--extra-train", action="append", default=[], metavar="PREFIX",
                   help="another plain parallel corpus PREFIX.{src,tgt} below the raw "
                        "directory (repeatable), e.g. the CWMT corpora for zh-en")
    p.add_argument("--separate-dictionaries", action="store_true",
                   help="one dictionary per language (default: joined, except zh-en)")
    p.add_argument("--max-len", type=int, default=None,
                   help="drop training pairs longer than this after BPE (default 250; "
                        "2017: 256; --char: 1024; 0: no limit)")
    p.add_argument("--ratio", type=float, default=None,
                   help="drop training pairs with a larger length ratio (default 1.5; "
                        "2017 and zh-en: none, Chinese characters vs English words; 0: no limit)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args, _ = parser.parse_known_args(argv)
    if args.out == "data/wmt" and "--out" not in (argv if argv is not None else sys.argv[1:]):
        parser.set_defaults(out=f"data/wmt{args.year % 100}.{args.pair}" + (".char" if args.char else ""))
    return cli.main_with(build_job, downloads, parser, argv)


if __name__ == "__main__":
    sys.exit(main())
