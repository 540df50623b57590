"""Gold word alignments as a split of a prepared dataset, for the alignment error rate of cross-attention
(ReLA, Section 6: Table 5 and Figure 4).

ReLA scores its WMT14 En-De models against RWTH's German-English gold alignments of Europarl
sentences (https://www-i6.informatik.rwth-aachen.de/goldAlignment/). Their host hands the archive
``DeEnGoldAlignment.tar.gz`` out after a registration form, under a licence that forbids passing it on,
so this command cannot fetch it: download it once in a browser and name it with ``--raw DIR`` (the
directory holding the archive, or its extracted ``DeEn/`` folder). The archive is checked against the
SHA-256 in ``RWTH_SHA256`` before use.

What the archive holds: ``DeEn/de`` and ``DeEn/en``, one tokenised sentence a line in Latin-1, and
``DeEn/alignmentDeEn.talp``, one line of links per sentence, 1-based German-English word indices,
``i-j`` a sure link and ``ipj`` a possible one. Lines empty in all three files (the archive ends with
one) are dropped; a line empty in only some of them is an error.

What is written into the prepared dataset ``--out`` (whose ``bpecodes`` and ``bin/dict.*`` it reuses):

- ``align.{src,tgt}``: the sentences in the dataset's direction, each word XML-escaped as the Moses
  tokeniser escapes and segmented with the dataset's BPE. The gold text is already tokenised and its
  word indices are what the links count, so it is not tokenised again: a hyphenated word stays one
  word, where a dataset prepared with ``tokenizer.perl -a`` split ``-`` in training.
- ``align.gold``: the links as Pharaoh lines in the dataset's direction, 0-based source-target word
  indices, ``i-j`` sure and ``i?j`` possible (``python -m fairseq_sparse.analysis aer --gold``);
- ``bin/align.*``: the split binarised with the dataset's dictionaries (``--split align``).

``--stand-in diagonal`` (the smoke profile, which has no gold alignments) links each word of the
dataset's tokenised test sentences to the source word at the same relative position instead: its
AER says only that the pipeline runs.

    python -m fairseq_sparse.data.gold_alignments --out data/wmt14.en-de --pair en-de --raw ~/rwth

Every file is written under a temporary name and renamed when complete; a second run rewrites them.
"""

import argparse
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Set, Tuple

from fairseq_sparse.data.binarise import binarise_extra_splits
from fairseq_sparse.data.cli import report_errors
from fairseq_sparse.data.download import digest_of
from fairseq_sparse.data.errors import PrepError
from fairseq_sparse.data.text import read_lines
from fairseq_sparse.files import write_atomically

RWTH_PAGE = "https://www-i6.informatik.rwth-aachen.de/goldAlignment/"
RWTH_ARCHIVE = "DeEnGoldAlignment.tar.gz"
# No hash is published by RWTH; this is the SHA-256 of the archive as a public project recorded it
# after fetching it (509 lines a file), the only one we found. A copy that differs is refused.
RWTH_SHA256 = "5aea49f44a9da4cf575d2dd303a8e12ebe7ba8b615ede7c28e7f8b0a0eb95793"
RWTH_FILES = {"de": "DeEn/de", "en": "DeEn/en", "links": "DeEn/alignmentDeEn.talp"}
SPLIT = "align"

Links = Set[Tuple[int, int]]


@dataclass
class GoldSentence:
    """One sentence pair with its links, in the dataset's direction: 0-based (source word, target word)."""

    source: List[str]
    target: List[str]
    sure: Links
    possible: Links  # possible only (a sure link is also possible, and is not repeated here)


def _decode(data: bytes) -> str:
    """RWTH's files are Latin-1 (its English file is ASCII, so either reading agrees); UTF-8 is
    tried first for copies re-encoded by hand."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def read_rwth_files(raw: Path) -> Tuple[Dict[str, List[str]], str]:
    """The three files of RWTH's corpus under ``raw`` (the archive, checked against its hash, or its
    extracted ``DeEn/`` folder), as lines; and where they were read."""
    archives = sorted(raw.rglob(RWTH_ARCHIVE)) if raw.is_dir() else []
    if archives:
        archive = archives[0]
        seen = digest_of(archive)
        if seen != RWTH_SHA256:
            raise PrepError(f"{archive}: SHA-256 {seen} is not the archive's {RWTH_SHA256} "
                            f"(a cut or different download: fetch it again from {RWTH_PAGE})")
        try:
            with tarfile.open(archive, "r:gz") as tar:
                members = {key: tar.extractfile(name) for key, name in RWTH_FILES.items()}
                return {key: _decode(m.read()).split("\n") for key, m in members.items()}, str(archive)
        except (KeyError, tarfile.TarError, AttributeError) as error:
            raise PrepError(f"{archive}: not RWTH's archive ({error})") from None
    found = sorted(raw.rglob(Path(RWTH_FILES["links"]).name)) if raw.is_dir() else []
    if not found:
        raise PrepError(f"{raw}: neither {RWTH_ARCHIVE} nor its DeEn/alignmentDeEn.talp is there (the archive "
                        f"needs a browser: register at {RWTH_PAGE}, download it and pass its directory with --raw)")
    folder = found[0].parent
    lines = {}
    for key, name in RWTH_FILES.items():
        path = folder / Path(name).name
        if not path.is_file():
            raise PrepError(f"{path}: no such file (RWTH's DeEn/ folder has de, en and alignmentDeEn.talp)")
        lines[key] = _decode(path.read_bytes()).split("\n")
    return lines, str(folder)


def parse_talp(line: str, german: int, english: int, where: str) -> Tuple[Links, Links]:
    """One line of ``.talp`` links (1-based German-English, ``i-j`` sure, ``ipj`` possible) as 0-based
    (sure, possible-only) German-English links; an index outside the sentence is an error."""
    sure: Links = set()
    possible: Links = set()
    for link in line.split():
        separator = "p" if "p" in link else "-"
        parts = link.split(separator)
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise PrepError(f"{where}: {link!r} is not a link (i-j sure or ipj possible)")
        i, j = int(parts[0]), int(parts[1])
        if not (1 <= i <= german and 1 <= j <= english):
            raise PrepError(f"{where}: link {link} is outside the sentence ({german} German and {english} "
                            f"English words, indices from 1)")
        (sure if separator == "-" else possible).add((i - 1, j - 1))
    return sure, possible - sure


def rwth_sentences(raw: Path, src: str, tgt: str) -> Tuple[List[GoldSentence], str]:
    """RWTH's sentences and links in the direction ``src``-``tgt`` (de-en or en-de)."""
    if {src, tgt} != {"de", "en"}:
        raise PrepError(f"RWTH's gold alignments are German-English; the dataset is {src}-{tgt}")
    lines, where = read_rwth_files(raw)
    counts = {key: len(value) for key, value in lines.items()}
    if len(set(counts.values())) != 1:
        raise PrepError(f"{where}: the files have different numbers of lines ({counts})")
    sentences = []
    for n, (de, en, links) in enumerate(zip(lines["de"], lines["en"], lines["links"]), 1):
        if not (de.strip() or en.strip() or links.strip()):
            continue
        if not (de.strip() and en.strip()):
            raise PrepError(f"{where}: line {n} is empty on one side only")
        german, english = de.split(), en.split()
        sure, possible = parse_talp(links, len(german), len(english), f"{where}: {RWTH_FILES['links']} line {n}")
        if src == "de":
            sentences.append(GoldSentence(german, english, sure, possible))
        else:
            flip = lambda links_: {(j, i) for i, j in links_}  # noqa: E731
            sentences.append(GoldSentence(english, german, flip(sure), flip(possible)))
    if not sentences:
        raise PrepError(f"{where}: no sentence")
    return sentences, where


def diagonal_stand_in(out: Path, src: str, tgt: str, split: str = "test") -> Tuple[List[GoldSentence], str]:
    """The dataset's tokenised ``split`` sentences, each target word linked (sure) to the source word at
    its relative position: a stand-in with the gold's shape, for running the pipeline without gold data."""
    paths = [out / f"{split}.tok.{lang}" for lang in (src, tgt)]
    for path in paths:
        if not path.is_file():
            raise PrepError(f"{path}: no such file (prepare the dataset first)")
    sentences = []
    for source, target in zip(*(list(read_lines(path)) for path in paths)):
        s, t = source.split(), target.split()
        if s and t:
            links = {(min(len(s) - 1, j * len(s) // len(t)), j) for j in range(len(t))}
            sentences.append(GoldSentence(s, t, links, set()))
    if not sentences:
        raise PrepError(f"{paths[0]}: no sentence pair to stand in for gold alignments")
    return sentences, f"diagonal stand-in on {paths[0].parent / (split + '.tok.*')}"


def pharaoh(sentence: GoldSentence) -> str:
    """The links as one Pharaoh line: ``i-j`` sure, ``i?j`` possible only, sorted."""
    return " ".join([f"{i}-{j}" for i, j in sorted(sentence.sure)] + [f"{i}?{j}" for i, j in sorted(sentence.possible)])


def segmenter(out: Path):
    """The dataset's own segmentation of one tokenised line: each word XML-escaped as Moses escapes it,
    then its BPE (``out/bpecodes``). Sentencepiece datasets are refused: the AER merges ``@@`` pieces."""
    from sacremoses import MosesTokenizer

    from fairseq_sparse.data.subwords import bpe_encoder

    codes = out / "bpecodes"
    if not codes.is_file():
        raise PrepError(f"{codes}: no such file (gold alignments need a BPE dataset, prepared first; "
                        f"the alignment analysis merges subwords by their @@ markers)")
    escape, bpe = MosesTokenizer(lang="en").escape_xml, bpe_encoder(codes)
    return lambda words: bpe(" ".join(escape(w) for w in words))


def write_gold_split(out: Path, src: str, tgt: str, sentences: Sequence[GoldSentence]) -> None:
    """``align.{src,tgt}``, ``align.gold`` and ``bin/align.*`` of ``out`` (see the module's text)."""
    segment = segmenter(out)
    sources = [segment(s.source) for s in sentences]
    targets = [segment(s.target) for s in sentences]
    binarise_extra_splits(out, src, tgt, {SPLIT: (sources, targets)})
    write_atomically(out / f"{SPLIT}.{src}", "".join(line + "\n" for line in sources))
    write_atomically(out / f"{SPLIT}.{tgt}", "".join(line + "\n" for line in targets))
    write_atomically(out / f"{SPLIT}.gold", "".join(pharaoh(s) + "\n" for s in sentences))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fairseq_sparse.data.gold_alignments",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the prepared BPE dataset (its bpecodes and bin/)")
    parser.add_argument("--pair", required=True, help="the dataset's source-target, e.g. en-de")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--raw", metavar="DIR", help=f"the directory holding {RWTH_ARCHIVE} or its DeEn/ folder")
    where.add_argument("--download", action="store_true",
                       help=f"read {RWTH_ARCHIVE} from OUT/raw, where the datasets' --download puts their files "
                            "(it cannot be fetched by a script: its host needs a browser and a registration)")
    where.add_argument("--stand-in", choices=["diagonal"],
                       help="no gold data: diagonal links on the dataset's test sentences (a pipeline check)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.pair.count("-") != 1:
        parser.error("--pair must be SRC-TGT")
    src, tgt = args.pair.split("-")
    out = Path(args.out)

    def work() -> None:
        if args.download and not any((out / "raw").rglob(RWTH_ARCHIVE)):
            raise PrepError(f"{RWTH_ARCHIVE} cannot be downloaded by a script: register at {RWTH_PAGE}, download "
                            f"it in a browser and put it into {out / 'raw'} (or pass its directory with --raw)")
        if args.stand_in:
            sentences, where = diagonal_stand_in(out, src, tgt)
        else:
            sentences, where = rwth_sentences(out / "raw" if args.download else Path(args.raw), src, tgt)
        write_gold_split(out, src, tgt, sentences)
        links = sum(len(s.sure) + len(s.possible) for s in sentences)
        print(f"{len(sentences)} gold-aligned sentences ({links} links) from {where}: {out / (SPLIT + '.gold')}, "
              f"binarised as split {SPLIT} in {out / 'bin'}")

    return report_errors(work)


if __name__ == "__main__":
    sys.exit(main())
