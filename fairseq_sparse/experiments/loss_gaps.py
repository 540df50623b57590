"""A method's validation-loss gap to softmax, read where softmax reached the same loss.

Two runs whose softmax learns at another speed per epoch (another batch size, model size or
schedule) are compared poorly at equal epochs: a gap narrows as training goes on. This compares
each epoch's gap of one pair with the gap another pair had where its softmax was at the same
validation loss, linear between that pair's epochs. Curves are a table's ``NAME.curves.csv``.

    python -m fairseq_sparse.experiments.loss_gaps \\
        --pair results/study/study_diagnosis.curves.csv softmax_batch4 hard_batch4 1 \\
        --against results/study/study_de_en.curves.csv softmax hard 1 \\
        --against results/study/study_de_en.curves.csv softmax hard 2
"""

import argparse
import sys
from pathlib import Path
from statistics import mean
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_sparse.experiments.record import read_curves

Curve = Dict[int, float]  # epoch -> validation loss (base 2)


def read_pair(path: Path, softmax_row: str, method_row: str, seed: str) -> Tuple[Curve, Curve]:
    """Softmax's and the method's validation loss per epoch from a curves CSV (one seed of each)."""
    if not path.is_file():
        sys.exit(f"loss_gaps: error: no such curves file: {path}")
    curves: Dict[str, Curve] = {softmax_row: {}, method_row: {}}
    for line in read_curves(path):
        if line["row"] in curves and str(line["seed"]) == seed:
            if line["epoch"] in curves[line["row"]]:
                sys.exit(f"loss_gaps: error: {path} has two curves for row {line['row']!r}, seed {seed} "
                         "(a table of several datasets?)")
            curves[line["row"]][line["epoch"]] = line["valid_loss"]
    for row, curve in curves.items():
        if not curve:
            sys.exit(f"loss_gaps: error: {path} has no curve for row {row!r}, seed {seed}")
    return curves[softmax_row], curves[method_row]


def gaps(softmax: Curve, method: Curve) -> List[Tuple[int, float, float]]:
    """(epoch, softmax's loss, method's loss minus softmax's) at every epoch both have."""
    return [(e, softmax[e], method[e] - softmax[e]) for e in sorted(softmax) if e in method]


def gap_at_softmax_loss(softmax: Curve, method: Curve, loss: float) -> Optional[float]:
    """The pair's gap where its softmax first reached ``loss`` (linear between the two epochs around
    it); None if its softmax's curve never spans that loss."""
    points = gaps(softmax, method)
    for (e0, s0, g0), (e1, s1, g1) in zip(points, points[1:]):
        if e1 == e0 + 1 and s0 >= loss >= s1:
            return g0 if s0 == s1 else g0 + (s0 - loss) / (s0 - s1) * (g1 - g0)
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fairseq_sparse.experiments.loss_gaps",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", nargs=4, required=True, metavar=("CURVES", "SOFTMAX_ROW", "METHOD_ROW", "SEED"),
                        help="the pair whose gap is read at every epoch")
    parser.add_argument("--against", nargs=4, action="append", required=True,
                        metavar=("CURVES", "SOFTMAX_ROW", "METHOD_ROW", "SEED"),
                        help="a reference pair, read at the same softmax loss (repeat for several)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> List[Tuple[int, float, float, List[Optional[float]]]]:
    args = build_parser().parse_args(argv)
    softmax, method = read_pair(Path(args.pair[0]), *args.pair[1:])
    references = [read_pair(Path(path), *rows_and_seed) for path, *rows_and_seed in args.against]
    print("epoch  softmax  gap     | " + "  ".join(f"ref{i + 1}" for i in range(len(references)))
          + "  | gap minus the references' mean")
    table = []
    for epoch, loss, gap in gaps(softmax, method):
        theirs = [gap_at_softmax_loss(s, m, loss) for s, m in references]
        known = [g for g in theirs if g is not None]
        difference = f"{gap - mean(known):+.3f}" if known else "—"
        print(f"{epoch:5d}  {loss:7.3f}  {gap:+.3f}  | " + "  ".join("   —  " if g is None else f"{g:+.3f}" for g in theirs)
              + f"  | {difference}")
        table.append((epoch, loss, gap, theirs))
    for i, (path, soft_row, method_row, seed) in enumerate(args.against):
        print(f"ref{i + 1}: {path} {soft_row} / {method_row}, seed {seed}")
    return table


if __name__ == "__main__":
    main()
