"""Average the parameters of the last N checkpoints of a fairseq run (Vaswani et al., 2017).

    python -m fairseq_sparse.average_checkpoints SAVE_DIR --last 5 --by epoch --output avg.pt

``--by epoch`` averages ``checkpointN.pt`` (highest N last), ``--by update`` averages
``checkpoint_E_U.pt`` (highest U last). The pip wheel of fairseq does not ship its
``scripts/average_checkpoints.py``, hence this module; it loads through fairseq's
``checkpoint_utils`` (with this package's safe-loading allow-list) and writes a checkpoint
that fairseq-generate reads like any other: the newest checkpoint's config and training
state with the averaged ``model`` weights.
"""

import argparse
import re
import os
import sys
from pathlib import Path
from typing import List

import torch

from fairseq_sparse.core.errors import UsageError
from fairseq_sparse.core.models.options import integer

PATTERNS = {"epoch": re.compile(r"^checkpoint(\d+)\.pt$"), "update": re.compile(r"^checkpoint_\d+_(\d+)\.pt$")}


class AveragingError(Exception):
    """No checkpoint to average, or checkpoints that do not belong together."""


def last_checkpoints(save_dir: Path, last: int, by: str) -> List[Path]:
    """The ``last`` newest checkpoints of ``save_dir`` by epoch or update number, oldest first."""
    if by not in PATTERNS:
        raise AveragingError(f"--by must be one of {sorted(PATTERNS)}, got {by!r}")
    numbered = []
    for path in Path(save_dir).iterdir():
        match = PATTERNS[by].match(path.name)
        if match:
            numbered.append((int(match.group(1)), path))
    numbered.sort()
    return [path for _, path in numbered[-last:]]


def average(paths: List[Path]) -> dict:
    """The newest checkpoint's state with its ``model`` entries replaced by the mean over ``paths``."""
    from fairseq import checkpoint_utils

    import fairseq_sparse  # noqa: F401  (safe-loading allow-list for fairseq's checkpoint types)

    if not paths:
        raise AveragingError("no checkpoints to average")
    from fairseq_sparse.core.checkpoint_identity import CheckpointIdentity, differences

    sums = None
    state = None
    for path in paths:
        state = checkpoint_utils.load_checkpoint_to_cpu(str(path))
        params = state["model"]
        identity = CheckpointIdentity.of(state["cfg"], params)
        if sums is None:
            first = identity
            sums = {k: v.detach().double().clone() if v.is_floating_point() else v.clone() for k, v in params.items()}
            continue
        differ = differences(first, identity)
        if differ:
            # weights of two methods (top-k k = 4 and k = 2, top-k and softmax) average into a model of neither
            raise AveragingError(f"{path} is not the same model as {paths[0]}: " + "; ".join(
                f"{what} {theirs!r} there, {ours!r} in {paths[0].name}" for what, ours, theirs in differ))
        if params.keys() != sums.keys():
            raise AveragingError(f"{path} has other parameters than {paths[0]}: not from the same model")
        for k, v in params.items():
            if v.is_floating_point():
                sums[k] += v.double()
    from omegaconf import DictConfig, OmegaConf

    if isinstance(state.get("cfg"), DictConfig):
        # loading turned the saved plain dict into an OmegaConf object; save it back as fairseq does,
        # since the object pickles types that safe (weights-only) loading rejects
        state["cfg"] = OmegaConf.to_container(state["cfg"], resolve=True, enum_to_str=True)
    dtypes = {k: v.dtype for k, v in state["model"].items()}
    state["model"] = {k: (v / len(paths)).to(dtypes[k]) if v.is_floating_point() else v for k, v in sums.items()}
    # the optimizer state left in is the newest checkpoint's, not the average's: marked, so that a
    # continuation (python -m fairseq_sparse.train --continue-from) refuses to pair the two
    state.setdefault("extra_state", {})["averaged_from"] = [path.name for path in paths]
    return state


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("save_dir")
    parser.add_argument("--last", type=integer, required=True, help="number of newest checkpoints to average")
    parser.add_argument("--by", choices=sorted(PATTERNS), default="epoch")
    parser.add_argument("--output", required=True)
    return parser


def main(argv=None) -> Path:
    args = build_parser().parse_args(argv)
    if args.last < 1:
        sys.exit(f"average_checkpoints: error: --last must be positive, got {args.last}")
    try:
        paths = last_checkpoints(Path(args.save_dir), args.last, args.by)
        if not paths:
            raise AveragingError(f"no {args.by} checkpoints in {args.save_dir} "
                                 f"({'checkpointN.pt' if args.by == 'epoch' else 'checkpoint_E_U.pt'})")
        state = average(paths)
    except (AveragingError, FileNotFoundError, UsageError) as e:
        sys.exit(f"average_checkpoints: error: {e}")
    output = Path(args.output)
    partial = output.with_name(f".{output.name}.partial")
    torch.save(state, partial)
    os.replace(partial, output)  # a reader (or a resumed table) never sees half a checkpoint
    print(f"averaged {len(paths)} checkpoints ({', '.join(p.name for p in paths)}) into {args.output}")
    return Path(args.output)


if __name__ == "__main__":
    main()
