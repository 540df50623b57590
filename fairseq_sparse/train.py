"""``python -m fairseq_sparse.train``: ``fairseq-train`` with ``--bf16`` meaning bfloat16, not a TPU.

fairseq 0.12 reads ``--bf16`` as "train on a TPU" (``options.parse_args_and_arch`` sets ``--tpu``),
so ``fairseq-train --bf16`` on a GPU stops looking for ``torch_xla``. This entry point takes the
same arguments as ``fairseq-train``, keeps ``--tpu`` only when it was given, and runs fairseq's
own training loop (``fairseq_cli.train.main``, distributed launching included):

    python -m fairseq_sparse.train DATA --user-dir $(python -m fairseq_sparse --user-dir) --bf16 ...

It also continues a finished run with new parameters or a new criterion, its optimizer state and
learning-rate schedule carrying on (L0Drop's official fine-tune; see ``continue_training``):

    python -m fairseq_sparse.train DATA ... --l0drop --criterion label_smoothed_cross_entropy_l0drop \
        --continue-from base/checkpoint_last.pt --continue-updates 4500 --save-dir l0drop
"""

import argparse
import logging
import os
import sys
from typing import Optional, Sequence, Tuple

from fairseq import distributed_utils, options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq_cli import train

from .continue_training import Continuation, ContinuationError, prepare
from .core.errors import UsageError


def continuation_options(argv: Sequence[str]) -> Tuple[Optional[Continuation], list]:
    """``--continue-from``/``--continue-updates`` taken out of the arguments (fairseq does not know them)."""
    parser = argparse.ArgumentParser(prog="python -m fairseq_sparse.train", add_help=False, allow_abbrev=False)
    parser.add_argument("--continue-from", metavar="CHECKPOINT")
    parser.add_argument("--continue-updates", type=int, metavar="N")
    ours, rest = parser.parse_known_args(argv)
    if (ours.continue_from is None) != (ours.continue_updates is None):
        parser.error("--continue-from and --continue-updates go together")
    return (Continuation(ours.continue_from, ours.continue_updates) if ours.continue_from else None), rest


def parse(argv: Optional[Sequence[str]] = None):
    """fairseq-train's arguments as its config, with bfloat16 on the device the run asks for."""
    argv = list(sys.argv[1:] if argv is None else argv)
    _, argv = continuation_options(argv)
    args = options.parse_args_and_arch(options.get_training_parser(), input_args=argv)
    if args.bf16 and "--tpu" not in argv:
        args.tpu = False
    return convert_namespace_to_omegaconf(args)


def main(argv: Optional[Sequence[str]] = None) -> None:
    # fairseq-train's own log format (its module sets it on import, but importing fairseq's models
    # first, as the plugin does, has already configured logging: force it back)
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", datefmt="%Y-%m-%d %H:%M:%S",
                        level=os.environ.get("LOGLEVEL", "INFO").upper(), stream=sys.stdout, force=True)
    argv = list(sys.argv[1:] if argv is None else argv)
    continuation, _ = continuation_options(argv)
    cfg = parse(argv)
    if continuation is not None:
        try:
            prepare(cfg, continuation)
        except (ContinuationError, UsageError) as err:  # UsageError: the base model refuses this run's data
            sys.exit(f"fairseq_sparse.train: error: {err}")
    distributed_utils.call_main(cfg, train.main)


if __name__ == "__main__":
    main()
