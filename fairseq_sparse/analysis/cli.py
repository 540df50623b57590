"""``python -m fairseq_sparse.analysis SUBCOMMAND DATA --path CHECKPOINT [--split test] --out DIR``.

Subcommands: zero-weights, diversity, aer, l0drop, heatmap (attention of checkpoints) and
bible-alignments (gold alignments from the bible-alignments wheel). Each writes
``<name>.md`` and ``<name>.csv`` (and PNG figures) into ``--out``.

This module parses the command line and dispatches: each sub-command's computation is in
``head_stats`` (zero-weights, diversity), ``alignment_error``, ``pruning`` (l0drop) and ``heatmap``,
its files are written by ``pages``.
"""

import argparse
import logging
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch

from ..core.checkpoint_loading import CheckpointLoadError
from ..files import describe_os_error
from . import SUBLAYERS, pages
from .alignment_error import alignment_errors
from .collect import NotASparseModel, load
from .head_stats import diversity_rows, zero_weight_rows
from .heatmap import heatmaps
from .pruning import pruning_stats

# The sub-commands on one checkpoint: (computation on the model and task, writer of its files and result).
ON_ONE_CHECKPOINT: Dict[str, Tuple[Callable, Callable]] = {
    "zero-weights": (zero_weight_rows, pages.write_zero_weights),
    "diversity": (diversity_rows, pages.write_diversity),
    "aer": (alignment_errors, pages.write_aer),
    "l0drop": (pruning_stats, pages.write_l0drop),
}


def _common(p: argparse.ArgumentParser, multi_path: bool = False) -> None:
    p.add_argument("data", help="binarised data directory")
    if multi_path:
        p.add_argument("--path", required=True, nargs="+", help="checkpoints to compare side by side")
    else:
        p.add_argument("--path", required=True, help="checkpoint")
    p.add_argument("--split", default="test")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--max-tokens", type=int, default=4000)
    p.add_argument("--cpu", action="store_true", help="stay on the CPU even if a GPU is available")
    if multi_path:
        p.add_argument("--model-overrides", nargs="+", metavar="DICT",
                       help="fairseq's --model-overrides for each checkpoint, e.g. \"{'cross_attn_fn': 'topk'}\" (\"{}\": none)")
    else:
        p.add_argument("--model-overrides", default="{}", metavar="DICT",
                       help="as fairseq-generate's, e.g. \"{'cross_attn_fn': 'topk'}\" to analyse a model decoded with top-k")
    p.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float32",
                   help="run the model in this dtype, as trained with --fp16 / --bf16 (attention weights stay float32)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fairseq_sparse.analysis", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    # "sparsity", its former name, stays: "zero weights" says which sparsity (L0Drop's is "pruned")
    p = sub.add_parser("zero-weights", aliases=["sparsity"], help="share of zero attention weights, null rate and peak share per layer, head and sublayer")
    _common(p)
    p.add_argument("--max-sentences", type=int)
    p = sub.add_parser("diversity", help="generalised Jensen-Shannon divergence between heads")
    _common(p)
    p.add_argument("--max-sentences", type=int)
    p.add_argument("--tau", type=float, nargs="+", default=[1.0], help="temperatures: softmax(alpha ** tau)")
    p.add_argument("--renormalise", choices=["auto", "always", "never"], default="auto",
                   help="softmax re-normalisation of rows: auto = ReLA-family sublayers only")
    p = sub.add_parser("aer", help="alignment error rate of cross-attention against gold alignments")
    _common(p)
    p.add_argument("--max-sentences", type=int)
    p.add_argument("--gold", required=True, help="Pharaoh file, one line per sentence of the split (i-j sure, i?j possible)")
    p.add_argument("--gold-reversed", action="store_true", help="gold links are target-source, not source-target")
    p = sub.add_parser("l0drop", help="pruning rate by token type and summed attention per source word")
    _common(p)
    p.add_argument("--max-sentences", type=int)
    p.add_argument("--lang", choices=["en", "de"], help="source language for HanTa (default: the task's)")
    p = sub.add_parser("heatmap", help="attention of chosen sentences, checkpoints side by side")
    _common(p, multi_path=True)
    p.add_argument("--labels", nargs="+")
    p.add_argument("--sentences", type=int, nargs="+", default=[0])
    p.add_argument("--sublayer", choices=SUBLAYERS, default="cross")
    p.add_argument("--layer", type=int, default=0, help="0-based; -1: the last layer")
    p.add_argument("--head", default="mean", help="0-based head index or 'mean'")
    p = sub.add_parser("bible-alignments", help="gold Greek-English alignments (bible-alignments wheel) as Pharaoh + text")
    p.add_argument("--out-prefix", required=True)
    p.add_argument("--wheel", help="the bible_alignments-0.4.2 wheel (default: cached, else pip download)")
    p.add_argument("--max-verses", type=int)
    p.add_argument("--drop-punctuation", action="store_true", help="leave out the BSB tokens marked 'exclude'")
    return parser


def quiet_library_logs() -> None:
    """Keep INFO output (fairseq's, the package's) but not other libraries' DEBUG lines.

    Importing fairseq's models runs ``logging.basicConfig(level=logging.DEBUG)`` (in
    fairseq/models/wav2vec/wav2vec2_classification.py), which fairseq's own commands pre-empt by
    configuring logging first; without this, each figure printed ~130 DEBUG lines of matplotlib's
    font manager.
    """
    root = logging.getLogger()
    if root.level < logging.INFO:
        root.setLevel(logging.INFO)
    logging.getLogger("matplotlib").setLevel(logging.WARNING)


def bible_alignments(args: argparse.Namespace) -> int:
    from .bible_alignments import convert

    n = convert(args.out_prefix, Path(args.wheel) if args.wheel else None, args.max_verses, args.drop_punctuation)
    print(f"{n} verses written to {args.out_prefix}.{{grc,en,align,ids}}")
    return n


def analyse(args: argparse.Namespace):
    """Run the sub-command on its checkpoint(s) and write its files; what it found."""
    args.command = "zero-weights" if args.command == "sparsity" else args.command
    if args.command == "heatmap":
        return pages.write_heatmaps(heatmaps(args), args)
    compute, write = ON_ONE_CHECKPOINT[args.command]
    model, task = load(args.path, args.data, args.cpu, args.dtype, args.model_overrides)
    return write(compute(model, task, args), args)


def main(argv: Optional[List[str]] = None):
    args = build_parser().parse_args(argv)
    quiet_library_logs()
    if args.command == "bible-alignments":
        return bible_alignments(args)
    args.cpu = args.cpu or not torch.cuda.is_available()
    for path in (args.path if isinstance(args.path, list) else [args.path]):
        if not Path(path).is_file():
            sys.exit(f"analysis: error: no such checkpoint: {path}")
    try:
        result = analyse(args)
    except (CheckpointLoadError, NotASparseModel) as err:  # a checkpoint it cannot analyse: one line, no traceback
        sys.exit(f"analysis {args.command}: error: {err}")
    except OSError as err:  # a full disk, a read-only output folder: the path, no traceback
        sys.exit(f"analysis {args.command}: error: {describe_os_error(err)}")
    print(f"{args.command}: written to {args.out}")
    return result
