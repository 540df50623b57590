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
    """Softmax's and the method's validation loss per epoch from a curves CSV (one seed of each). A row
    is ``ROW`` or ``ROW@RUN``: a model trained again by the same command has a curve per run, and
    which one to read must be named."""
    if not path.is_file():
        sys.exit(f"loss_gaps: error: no such curves file: {path}")
    return read_curve(path, softmax_row, seed), read_curve(path, method_row, seed)


def read_curve(path: Path, row_and_run: str, seed: str) -> Curve:
    row, _, wanted = row_and_run.partition("@")
    runs: Dict[int, Curve] = {}
    for line in read_curves(path):
        if line["row"] == row and str(line["seed"]) == seed:
            curve = runs.setdefault(line["run"], {})
            if line["epoch"] in curve:
                sys.exit(f"loss_gaps: error: {path} has two curves for row {row!r}, seed {seed} "
                         "(a table of several datasets?)")
            curve[line["epoch"]] = line["valid_loss"]
    if not runs:
        sys.exit(f"loss_gaps: error: {path} has no curve for row {row!r}, seed {seed}")
    if not wanted:
        if len(runs) > 1:
            sys.exit(f"loss_gaps: error: {path} has {len(runs)} runs of row {row!r}, seed {seed} (its command "
                     f"trained again): name one as {row}@RUN, RUN one of {', '.join(map(str, sorted(runs)))}")
        return next(iter(runs.values()))
    if not wanted.isdigit() or int(wanted) not in runs:
        sys.exit(f"loss_gaps: error: {path} has no run {wanted!r} of row {row!r}, seed {seed} "
                 f"(it has {', '.join(map(str, sorted(runs)))})")
    return runs[int(wanted)]


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
                        help="the pair whose gap is read at every epoch (a row: ROW or ROW@RUN)")
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
