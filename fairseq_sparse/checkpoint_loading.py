"""Load fairseq checkpoints on torch >= 2.6 with the safe (weights-only) unpickler kept on.

torch >= 2.6 defaults ``torch.load`` to ``weights_only=True``; fairseq checkpoints
also hold an ``argparse.Namespace``, omegaconf configs and numpy scalars, which
the safe unpickler rejects. Rather than switching it off globally
(``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``), we allow-list exactly those types.
Importing this package (``--user-dir``, ``import fairseq_sparse``) applies it to
``fairseq-generate``, ``fairseq-interactive``, ``--restore-file`` and the hub interface.
"""

import argparse
import collections
import logging
import pickle
import re
import typing
from typing import List

import torch

logger = logging.getLogger(__name__)


def fairseq_checkpoint_types() -> List[type]:
    """The non-tensor types fairseq writes into checkpoints."""
    types: List = [argparse.Namespace, collections.OrderedDict, collections.defaultdict, typing.Any, dict, list]
    try:
        import omegaconf
        from omegaconf import nodes
        from omegaconf.base import ContainerMetadata, Metadata

        types += [omegaconf.DictConfig, omegaconf.ListConfig, ContainerMetadata, Metadata]
        types += [nodes.AnyNode, nodes.StringNode, nodes.IntegerNode, nodes.FloatNode, nodes.BooleanNode, nodes.EnumNode]
    except ImportError:  # omegaconf comes with fairseq; without it there is nothing to allow
        pass
    try:
        import numpy as np

        types += [np.dtype, np.ndarray, np.core.multiarray.scalar, np.core.multiarray._reconstruct]
        types += [type(np.dtype(t)) for t in ("float64", "float32", "int64", "int32", "bool")]
    except (ImportError, AttributeError):
        pass
    return types


def allow_fairseq_checkpoints() -> None:
    if hasattr(torch.serialization, "add_safe_globals"):
        torch.serialization.add_safe_globals(fairseq_checkpoint_types())


class CheckpointLoadError(RuntimeError):
    pass


def _explain_load_errors() -> None:
    """Make fairseq's checkpoint loader fail with one clear message instead of a raw unpickling trace."""
    from fairseq import checkpoint_utils

    original = checkpoint_utils.load_checkpoint_to_cpu
    if getattr(original, "_explains_errors", False):
        return

    def load_checkpoint_to_cpu(path, arg_overrides=None, load_on_all_ranks=False):
        try:
            return original(path, arg_overrides, load_on_all_ranks)
        except pickle.UnpicklingError as err:
            found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(err))
            culprit = found.group(1) if found else str(err).splitlines()[0]
            raise CheckpointLoadError(
                f"cannot load checkpoint {path} with torch's safe (weights-only) loader: it holds {culprit}, "
                "a type fairseq checkpoints do not normally hold and fairseq-sparse does not allow-list. If you trust the "
                "file, add the type with torch.serialization.add_safe_globals([...]) or load it once with "
                "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 and re-save it."
            ) from err

    load_checkpoint_to_cpu._explains_errors = True
    checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu


allow_fairseq_checkpoints()
_explain_load_errors()
