"""Cut a prepared split into groups of equal size by source length, binarised beside it (ReLA, Figure 2).

ReLA's Figure 2 divides newstest2014 "into 10 disjoint groups uniformly according to source length" and
times decoding per group. Here the sentences of ``OUT/SPLIT.{src,tgt}`` (the text fairseq-preprocess
binarised: Moses-tokenised, BPE) are ordered by their number of source tokens (ties in file order) and cut
into ``--groups`` runs whose sizes differ by at most one; group g of N becomes the binarised split
``SPLIT_len{g}ofN`` of ``OUT/bin``, with the dataset's own dictionaries, so that
``fairseq-generate OUT/bin --gen-subset test_len3of10`` decodes the third-shortest tenth. The source
lengths of each group are written to ``OUT/bin/SPLIT_lengths_ofN.tsv`` (group, sentences, shortest,
longest, mean).

    python -m fairseq_sparse.data.length_groups --out data/wmt14.en-de --pair en-de --groups 10

Each group's files are written under a temporary name and renamed when complete, so a run cut short
leaves no partial split; a second run rewrites the groups.
"""

import argparse
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from fairseq_sparse.data.binarise import binarise_extra_splits
from fairseq_sparse.data.cli import report_errors
from fairseq_sparse.data.errors import PrepError
from fairseq_sparse.data.text import read_lines
from fairseq_sparse.files import write_atomically


def group_by_length(lengths: Sequence[int], groups: int) -> List[List[int]]:
    """Sentence indices ordered by length (ties in file order), cut into ``groups`` runs of sizes differing by
    at most one (the first ``len % groups`` runs one longer)."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    size, extra = divmod(len(order), groups)
    cut, start = [], 0
    for g in range(groups):
        end = start + size + (1 if g < extra else 0)
        cut.append(order[start:end])
        start = end
    return cut


def split_name(split: str, group: int, groups: int) -> str:
    """The binarised split of group ``group`` (1-based) of ``groups``."""
    return f"{split}_len{group}of{groups}"


def write_groups(out: Path, src: str, tgt: str, groups: int, split: str = "test") -> List[str]:
    """Write and binarise the length groups of ``out/split.{src,tgt}`` into ``out/bin``; returns the split names."""
    bin_dir = out / "bin"
    texts = {lang: out / f"{split}.{lang}" for lang in (src, tgt)}
    for path in texts.values():
        if not path.is_file():
            raise PrepError(f"{path}: no such file (prepare and binarise the dataset first)")
    sources, targets = list(read_lines(texts[src])), list(read_lines(texts[tgt]))
    if len(sources) != len(targets):
        raise PrepError(f"{texts[src]} has {len(sources)} lines but {texts[tgt]} has {len(targets)}")
    if len(sources) < groups:
        raise PrepError(f"{texts[src]}: {len(sources)} sentences cannot make {groups} groups")
    lengths = [len(line.split()) for line in sources]
    cut = group_by_length(lengths, groups)
    names = [split_name(split, g + 1, groups) for g in range(groups)]
    binarise_extra_splits(out, src, tgt, {name: ([sources[i] for i in indices], [targets[i] for i in indices])
                                          for name, indices in zip(names, cut)})
    rows = ["group\tsentences\tshortest\tlongest\tmean"]
    for name, indices in zip(names, cut):
        group_lengths = [lengths[i] for i in indices]
        rows.append(f"{name}\t{len(indices)}\t{min(group_lengths)}\t{max(group_lengths)}\t"
                    f"{sum(group_lengths) / len(group_lengths):.1f}")
    write_atomically(bin_dir / f"{split}_lengths_of{groups}.tsv", "\n".join(rows) + "\n")
    return names


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fairseq_sparse.data.length_groups",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the prepared dataset (its SPLIT.{src,tgt} and bin/)")
    parser.add_argument("--pair", required=True, help="source-target, e.g. en-de")
    parser.add_argument("--groups", type=int, default=10, help="number of groups (default: %(default)s)")
    parser.add_argument("--split", default="test", help="the split to cut (default: %(default)s)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.pair.count("-") != 1 or args.groups < 1:
        parser.error("--pair must be SRC-TGT and --groups positive")
    src, tgt = args.pair.split("-")

    def work() -> None:
        names = write_groups(Path(args.out), src, tgt, args.groups, args.split)
        print(f"{len(names)} length groups of {args.split} binarised into {Path(args.out) / 'bin'}: {', '.join(names)}")

    return report_errors(work)


if __name__ == "__main__":
    sys.exit(main())
