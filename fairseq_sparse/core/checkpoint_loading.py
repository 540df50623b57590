"""Load fairseq checkpoints on torch >= 2.6 with the safe (weights-only) unpickler kept on.

torch >= 2.6 defaults ``torch.load`` to ``weights_only=True``; fairseq checkpoints
also hold an ``argparse.Namespace``, omegaconf configs and numpy scalars, which
the safe unpickler rejects. Rather than switching it off globally
(``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``), we allow-list exactly those types.
Importing this package (``--user-dir``, ``import fairseq_sparse``) applies it to
``fairseq-generate``, ``fairseq-interactive``, ``--restore-file`` and the hub interface.

The same wrapper of fairseq's loader turns the confusing errors of files that are not
checkpoints at all (empty, cut off, an HTML page from a failed download: EOFError,
IndexError, "weights only load failed") into one CheckpointLoadError naming the file,
and lets a ``pos``-pattern checkpoint decode without its word-type table file.
"""

import argparse
import collections
import logging
import os
import pickle
import re
import typing
import zipfile
from typing import List

import torch

from .errors import UsageError

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


def _first_line(err: BaseException) -> str:
    return (str(err).splitlines() or [type(err).__name__])[0]


def allow_fairseq_checkpoints() -> None:
    if hasattr(torch.serialization, "add_safe_globals"):
        torch.serialization.add_safe_globals(fairseq_checkpoint_types())


class CheckpointLoadError(UsageError, RuntimeError):
    """A file that cannot be loaded as a fairseq checkpoint (the message names it and says why)."""


ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format since torch 1.6: a zip archive
PICKLE_PROTO = 0x80  # the legacy format: a bare pickle, which starts with its protocol opcode


def not_a_checkpoint(path: str, what: str) -> CheckpointLoadError:
    return CheckpointLoadError(
        f"{path} is not a PyTorch checkpoint: {what}. Such a file is usually empty or truncated (an interrupted "
        "save, copy or download) or no checkpoint at all, e.g. an HTML page saved by a failed download: copy or "
        "download it again."
    )


def _describe_start(head: bytes) -> str:
    """What the first bytes of a file look like, for the error message."""
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff \t\r\n")
    if text.lower().startswith("<!doctype html") or "<html" in text.lower():
        return "it is an HTML page"
    if all(c.isprintable() or c.isspace() for c in text):
        return f"it is text starting {text[:40]!r}"
    return f"it starts with the bytes {head[:8].hex(' ')}"


def check_checkpoint_file(path: str) -> None:
    """Raise CheckpointLoadError unless ``path`` is shaped as torch.save writes (checked before unpickling,
    whose errors on such files are EOFError, IndexError, KeyError or a misleading 'weights only load failed')."""
    with open(path, "rb") as f:
        head = f.read(64)
    if not head:
        raise not_a_checkpoint(path, "the file is empty (0 bytes)")
    if head.startswith(ZIP_MAGIC):
        if not zipfile.is_zipfile(path):  # the central directory is written last: a cut-off file has none
            raise not_a_checkpoint(path, "its zip archive has no end (the file is cut off)")
    elif head[0] != PICKLE_PROTO:
        raise not_a_checkpoint(path, _describe_start(head))


def _use_stored_tables(state: dict) -> None:
    """A pos-pattern model built from this state takes its word-type table from the state, not the
    table file it was trained with (which need not exist where the checkpoint is decoded)."""
    from .modules.prune_patterns import use_stored_table  # here: this module is imported before the models

    if state.get("args") is not None:
        use_stored_table(state["args"])
    if state.get("cfg") is not None and state["cfg"].get("model") is not None:
        use_stored_table(state["cfg"]["model"])


def _group_option_names(group) -> List[str]:
    if isinstance(group, argparse.Namespace):
        return list(vars(group))
    try:
        return list(group.keys())
    except AttributeError:
        return []


def known_option_names(cfg) -> set:
    """Every option a checkpoint's config has (any group), and every option its model class declares now
    (an option added since the checkpoint was saved can still be overridden)."""
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_DATACLASS_REGISTRY

    names = set()
    for group in cfg.keys():
        names.add(group)
        names.update(_group_option_names(cfg[group]))
    model = cfg.get("model")
    arch = getattr(model, "_name", None) or getattr(model, "arch", None) if model is not None else None
    model_class = ARCH_MODEL_REGISTRY.get(arch)
    if model_class is not None and hasattr(model_class, "add_args"):
        parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
        model_class.add_args(parser)
        names.update(action.dest for action in parser._actions)
    dataclass = MODEL_DATACLASS_REGISTRY.get(arch)
    if dataclass is not None:
        names.update(dataclass.__dataclass_fields__)
    return names


def _current_value(cfg, name: str):
    for group in cfg.keys():
        section = cfg[group]
        values = vars(section) if isinstance(section, argparse.Namespace) else section
        try:
            if name in values:
                return values[name]
        except TypeError:  # a group that is a plain value
            continue
    return None


def check_override_type(name: str, value, path: str, cfg) -> None:
    """Refuse a value of another type than the option's: Python takes True for 1 and 1.0 for 1, which no
    user means (``{'attn_k': True}`` would decode with k = 1)."""
    from .models.options import KIND_NAMES, option_kind  # here: this module is imported before the models

    kind = option_kind(name)
    if kind is None:  # an option of fairseq's: the type of the value the checkpoint has
        current = _current_value(cfg, name)
        kind = None if current is None else bool if isinstance(current, bool) else type(current)
    if kind is None or value is None:
        return
    wrong = (isinstance(value, bool) != (kind is bool) or
             (kind is int and not isinstance(value, int)) or
             (kind is float and not isinstance(value, (int, float))) or
             (kind is str and not isinstance(value, str)))
    if wrong:
        raise UsageError(f"--model-overrides: {name}={value!r} is a {type(value).__name__}, the option takes "
                         f"{KIND_NAMES.get(kind, kind.__name__)} (checkpoint {path})")


def apply_checked_overrides(state: dict, overrides: dict, path: str) -> None:
    """``--model-overrides`` as fairseq applies them, after refusing a name that no option has, a value of
    another type than the option's, and a change the checkpoint's parameters were not trained for
    (checkpoint_identity)."""
    import difflib

    from fairseq.dataclass.utils import overwrite_args_by_name

    from .checkpoint_identity import CheckpointIdentity, check_overrides

    known = known_option_names(state["cfg"])
    for name, value in overrides.items():
        if name in known:
            check_override_type(name, value, path, state["cfg"])
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1)
        raise UsageError(f"--model-overrides: {name!r} is no option of fairseq or of the model in {path}"
                         + (f"; did you mean {close[0]!r}?" if close else ""))
    trained = CheckpointIdentity.of(state["cfg"], state["model"])
    if state.get("args") is not None:
        for name, value in overrides.items():
            setattr(state["args"], name, value)
    overwrite_args_by_name(state["cfg"], overrides)
    check_overrides(trained, CheckpointIdentity.of(state["cfg"], state["model"]), overrides, path)


def _explain_load_errors() -> None:
    """Make fairseq's checkpoint loader fail with one clear message instead of a raw unpickling trace."""
    from fairseq import checkpoint_utils

    original = checkpoint_utils.load_checkpoint_to_cpu
    if getattr(original, "_explains_errors", False):
        return

    def load_checkpoint_to_cpu(path, arg_overrides=None, load_on_all_ranks=False):
        if os.path.isfile(path):  # remote paths (fairseq's PathManager) are left to fairseq
            check_checkpoint_file(path)
        try:
            # overrides are applied here, after their names are checked: fairseq sets any name on a model
            # config held as a Namespace, so a misspelt option would be ignored without a word
            state = original(path, None, load_on_all_ranks)
        except pickle.UnpicklingError as err:
            found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(err))
            if not found:
                raise not_a_checkpoint(path, f"torch cannot unpickle it ({_first_line(err)})") from err
            raise CheckpointLoadError(
                f"cannot load checkpoint {path} with torch's safe (weights-only) loader: it holds {found.group(1)}, "
                "a type fairseq checkpoints do not normally hold and fairseq-sparse does not allow-list. If you trust the "
                "file, add the type with torch.serialization.add_safe_globals([...]) or load it once with "
                "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 and re-save it."
            ) from err
        except EOFError as err:
            raise not_a_checkpoint(path, "it ends before its data does (the file is cut off)") from err
        except RuntimeError as err:
            if "corrupted" not in str(err):  # torch's words for a cut-off zip or legacy file
                raise
            raise not_a_checkpoint(path, f"torch finds it damaged ({_first_line(err)})") from err
        if arg_overrides:
            apply_checked_overrides(state, arg_overrides, path)
        _use_stored_tables(state)
        return state

    load_checkpoint_to_cpu._explains_errors = True
    checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu


def _explain_unknown_architectures() -> None:
    """Make building a model of an unregistered architecture (a checkpoint of another plugin, or of
    fairseq-sparse loaded without it) one clear error: fairseq's own message has a formatting bug and
    ends in ``IndexError: Replacement index 1 out of range for positional args tuple``."""
    from fairseq import models

    original = models.build_model
    if getattr(original, "_explains_errors", False):
        return

    def build_model(cfg, task, from_checkpoint=False):
        name = getattr(cfg, "_name", None) or getattr(cfg, "arch", None)
        if name and name not in models.ARCH_MODEL_REGISTRY and name not in models.MODEL_DATACLASS_REGISTRY:
            raise CheckpointLoadError(
                f"no model architecture {name!r} is registered: a checkpoint trained with a --user-dir plugin "
                "needs the same plugin to load it (--user-dir DIR, or import the plugin before loading). "
                "fairseq-sparse registers transformer_sparse and its presets (transformer_sparse_mini, ...)."
            )
        return original(cfg, task, from_checkpoint)

    build_model._explains_errors = True
    models.build_model = build_model


allow_fairseq_checkpoints()
_explain_load_errors()
_explain_unknown_architectures()
