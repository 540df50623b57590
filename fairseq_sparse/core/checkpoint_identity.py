"""What a checkpoint is, and the requests that contradict it.

A checkpoint's identity is what its parameters were trained to be: the language pair, the attention
method (and k, and what else the method reads, such as Top-k (OOW)'s window) of each sublayer, L0Drop and
its gates, and the architecture's shape. fairseq compares none of it with what a command asks: ``fairseq-generate
--source-lang en --target-lang de`` decodes English through a de-en model's German embeddings when the
dictionaries happen to be of one size, ``--model-overrides "{'l0drop': True}"`` decodes with gates
fresh from their initialisation, and averaging a top-k checkpoint with a softmax one gives weights of
neither. Every command that reads a checkpoint reads it through fairseq's loader (and builds it
through the model's ``build_model``), where this module's checks run:

* overrides (``--model-overrides``, the hub's keyword arguments, the analyses' overrides) may change
  how the trained parameters are used, never what they are: an override is refused where it changes the
  languages or the shape, or a method whose parameters the checkpoint does not have exactly (L0Drop's
  gates, ``rela_*``'s norms, ``entmax_alpha``'s alphas); ``checked_overrides``;
* the languages a model was trained on against the data a command reads (``check_languages``, from the
  model's ``build_model``: a half-given pair at training is refused there too);
* averaging refuses checkpoints whose identities differ in anything (``differences``).
"""

import argparse
import logging
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from .attention import SUBLAYERS, get_attention
from .attention.structured import topk_oow_split
from .errors import UsageError

logger = logging.getLogger(__name__)

LANGUAGES = (("source_lang", "source language"), ("target_lang", "target language"))
# the options that fix the parameters' number and shapes (and how the heads split them); not
# share_decoder_input_output_embed, which fairseq's transformer sets while it builds a model of
# --share-all-embeddings (a command line and the checkpoint of the same model would differ in it)
SHAPE = ("arch", "encoder_layers", "decoder_layers", "encoder_embed_dim", "decoder_embed_dim",
         "encoder_ffn_embed_dim", "decoder_ffn_embed_dim", "encoder_attention_heads", "decoder_attention_heads",
         "share_all_embeddings")
GATED = ("l0drop", "l0drop_every_layer")
# a learned L0Drop gate's parameters (a rule pattern's gate holds word-type tables, no parameters)
GATE_PARAMETER = "l0drop_gate.log_alpha."


def _get(cfg, name: str):
    if cfg is None:
        return None
    if isinstance(cfg, argparse.Namespace):
        return getattr(cfg, name, None)
    try:
        return cfg.get(name)
    except AttributeError:
        return getattr(cfg, name, None)


def sublayer_method(options, sublayer: str) -> str:
    """A sublayer's method as it is shown and compared: the function, with what of the options it reads."""
    spec = get_attention(options.attn_fn_of(sublayer))
    reads = [f"k={options.attn_k_of(sublayer)}"] if spec.uses_k else []
    reads += [f"hard_train={options.hard_train}"] if spec.uses_hard_train else []
    reads += [f"attn_pattern_seed={options.attn_pattern_seed}"] if spec.uses_pattern_seed else []
    # the window as it splits k (a window of ceil(k/2) given explicitly is the default, and shown as it)
    window, k = options.oow_window_of(sublayer), options.attn_k_of(sublayer)
    reads += [f"topk_oow_window={window}"] if window is not None and window != topk_oow_split(k)[0] else []
    return " ".join([spec.name, *reads])


@dataclass(frozen=True)
class CheckpointIdentity:
    """What a model configuration (and, where given, its parameters) is; every entry (what, value)."""

    entries: Tuple[Tuple[str, object], ...]

    @classmethod
    def of(cls, cfg, parameters: Optional[Dict[str, object]] = None) -> "CheckpointIdentity":
        """``cfg``: a checkpoint's ``cfg`` (its ``model`` and ``task`` groups), or a model's own options."""
        from .models.options import SparseModelOptions  # here: the models import this module

        model, task = (_get(cfg, "model"), _get(cfg, "task")) if _get(cfg, "model") is not None else (cfg, None)
        entries: List[Tuple[str, object]] = []
        for name, what in LANGUAGES:
            entries.append((what, _get(model, name) or _get(task, name)))  # None: not recorded (guessed at training)
        entries += [(f"--{name.replace('_', '-')}", _get(model, name)) for name in SHAPE]
        options = SparseModelOptions.from_cfg(model)
        entries += [(f"{sublayer} attention", sublayer_method(options, sublayer)) for sublayer in SUBLAYERS]
        entries += [(f"--{name.replace('_', '-')}", bool(getattr(options, name))) for name in GATED]
        entries.append(("--encoder-prune-pattern", options.encoder_prune_pattern))
        if parameters is not None:
            entries.append(("L0Drop gate parameters", sum(GATE_PARAMETER in key for key in parameters)))
        return cls(tuple(entries))


def differences(one: CheckpointIdentity, other: CheckpointIdentity) -> List[Tuple[str, object, object]]:
    """(what, one's value, other's value) where they differ; a language that one of them does not record
    is not a difference (checkpoints trained before languages were recorded)."""
    theirs = dict(other.entries)
    found = []
    for what, value in one.entries:
        if what not in theirs or value == theirs[what]:
            continue
        if what in dict(LANGUAGES).values() and (value is None or theirs[what] is None):
            continue
        found.append((what, value, theirs[what]))
    return found


def _parameters_differ(what: str, trained, asked) -> bool:
    """Whether serving ``asked`` instead of ``trained`` needs parameters the checkpoint lacks (or leaves some
    unused): every change of languages or shape, of L0Drop's gates, or of an attention function that owns
    parameters (a change of k, of hard retrieval's training pick or of the implementation keeps them)."""
    if what.endswith(" attention"):
        old, new = get_attention(str(trained).split()[0]), get_attention(str(asked).split()[0])
        return old.name != new.name and (old.owns_parameters or new.owns_parameters)
    return what != "--encoder-prune-pattern"


def _why(what: str, asked) -> str:
    if what in ("--l0drop", "--l0drop-every-layer"):
        return ("it has no such L0Drop gates, which would decode from their initialisation" if asked else
                "the gates it was trained with would be left out")
    if what.endswith(" attention"):
        return "the two functions do not have the same parameters"
    if what in dict(LANGUAGES).values():
        return "its embeddings were trained on its own language pair"
    return "its parameters were trained in that shape"


def check_overrides(trained: CheckpointIdentity, asked: CheckpointIdentity, overrides: dict, path: str) -> None:
    """Refuse overrides that make the checkpoint's parameters something they were not trained as."""
    for what, old, new in differences(trained, asked):
        if _parameters_differ(what, old, new):
            raise UsageError(f"--model-overrides {overrides}: {path} was trained with {what} {old!r}, not {new!r}: "
                             f"{_why(what, new)}")


def check_languages(model_cfg, task) -> None:
    """The languages a model records (its training command's, or those it was trained on) against those of the
    data ``task`` reads; a model that records none (trained before they were recorded) is given the task's."""
    task_cfg = getattr(task, "cfg", None) or getattr(task, "args", None)
    reading = {name: _get(task_cfg, name) for name, _ in LANGUAGES}
    if None in reading.values():  # a task without a language pair (or a stand-in in tests)
        return
    data = _get(task_cfg, "data")
    recorded = {name: _get(model_cfg, name) for name, _ in LANGUAGES}
    given = {name: value for name, value in recorded.items() if value is not None}
    if len(given) == 1:  # only at training: fairseq then guesses the whole pair from the data's file names
        (name, value), = given.items()
        other = "--target-lang" if name == "source_lang" else "--source-lang"
        option = "--" + name.replace("_", "-")
        if value != reading[name]:
            raise UsageError(f"{option} {value} without {other}: fairseq guesses the pair from the file names in "
                             f"{data} ({reading['source_lang']}-{reading['target_lang']}) and would not use {value}; "
                             "give both --source-lang and --target-lang")
        guessed = reading["target_lang" if name == "source_lang" else "source_lang"]
        logger.warning(f"{option} {value} without {other}: {other} {guessed} guessed from the file names in {data}")
    elif not given:
        logger.info(f"language pair {reading['source_lang']}-{reading['target_lang']} guessed from the file names "
                    f"in {data} (no --source-lang / --target-lang given, none recorded in the model); recorded in "
                    "the model's config from here on")
    else:
        for name, what in LANGUAGES:
            if recorded[name] != reading[name]:
                raise UsageError(f"the model was trained {recorded['source_lang']}->{recorded['target_lang']}, this "
                                 f"command reads {reading['source_lang']}->{reading['target_lang']} from {data} "
                                 f"({what} {recorded[name]!r} in the checkpoint, {reading[name]!r} asked): give "
                                 f"--source-lang {recorded['source_lang']} --target-lang {recorded['target_lang']}")
    # recorded where training guessed them (the checkpoint's config is this namespace): later commands compare
    for name in reading:
        if recorded[name] is None:
            _set(model_cfg, name, reading[name])


def _set(cfg, name: str, value) -> None:
    try:
        setattr(cfg, name, value)
    except (AttributeError, KeyError, ValueError):  # a struct config without the field: nothing is recorded
        pass
