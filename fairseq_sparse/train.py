"""``python -m fairseq_sparse.train``: ``fairseq-train`` with ``--bf16`` meaning bfloat16, not a TPU.

fairseq 0.12 reads ``--bf16`` as "train on a TPU" (``options.parse_args_and_arch`` sets ``--tpu``),
so ``fairseq-train --bf16`` on a GPU stops looking for ``torch_xla``. This entry point takes the
same arguments as ``fairseq-train``, keeps ``--tpu`` only when it was given, and runs fairseq's
own training loop (``fairseq_cli.train.main``, distributed launching included):

    python -m fairseq_sparse.train DATA --user-dir $(python -m fairseq_sparse --user-dir) --bf16 ...
"""

import logging
import os
import sys
from typing import Optional, Sequence

from fairseq import distributed_utils, options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq_cli import train


def parse(argv: Optional[Sequence[str]] = None):
    """fairseq-train's arguments as its config, with bfloat16 on the device the run asks for."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = options.parse_args_and_arch(options.get_training_parser(), input_args=argv)
    if args.bf16 and "--tpu" not in argv:
        args.tpu = False
    return convert_namespace_to_omegaconf(args)


def main(argv: Optional[Sequence[str]] = None) -> None:
    # fairseq-train's own log format (its module sets it on import, but importing fairseq's models
    # first, as the plugin does, has already configured logging: force it back)
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", datefmt="%Y-%m-%d %H:%M:%S",
                        level=os.environ.get("LOGLEVEL", "INFO").upper(), stream=sys.stdout, force=True)
    distributed_utils.call_main(parse(argv), train.main)


if __name__ == "__main__":
    main()
