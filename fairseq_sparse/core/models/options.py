"""The options ``transformer_sparse`` adds to fairseq's transformer, each declared once: its
default, its command-line form and its check live in ``SparseModelOptions``.

fairseq hands a model its options as an ``argparse.Namespace`` (legacy ``add_args`` models) or as a
``TransformerConfig`` carrying them as extra attributes; ``SparseModelOptions.from_cfg`` reads either
into one checked, typed object. The command line declares no argparse defaults: architectures fill
the options a user left unset (``fill_defaults``), so a preset can choose its own.
"""

import argparse
import re
import typing
from dataclasses import dataclass, field, fields
from typing import Callable, List, Optional, Sequence, Union

from fairseq import utils

from ..errors import UsageError
from ..attention import (ATTN_IMPLS, DEFAULT_K, HARD_TRAIN_CHOICES, SUBLAYERS, attention_names, check_attn_impl,  # noqa: F401
                         check_hard_train, check_k, check_oow_window, get_attention)
from ..attention.structured import DEFAULT_PATTERN_SEED
from ..modules.l0drop import GATE_INITS, check_gate_init
from ..modules.prune_patterns import PATTERNS, check_pattern



KIND_NAMES = {bool: "True or False", int: "an integer", float: "a number", str: "a string"}
WHOLE_NUMBER = re.compile(r"[+-]?[0-9]+")


def integer(text: str) -> int:
    """argparse ``type`` of the integer options: digits only. Python's int() also takes '1_000', ' 8 ' and
    digits of other scripts ('٨'), which no one types meaning a number of keys."""
    if not WHOLE_NUMBER.fullmatch(text):
        raise argparse.ArgumentTypeError(f"must be a whole number written in digits, got {text!r}")
    return int(text)


def positive_int(text: str) -> int:
    """argparse ``type`` of the k options: a bad k stops fairseq-train in argument parsing, with
    one usage error line, instead of a traceback from model building (fairseq catches nothing)."""
    try:
        return check_k(integer(text))
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None


def option(default, help: Optional[str], *, type: Optional[Callable] = None,
           choices: Union[Sequence[str], Callable[[], Sequence[str]], None] = None,
           flag: bool = False, metavar: Optional[str] = None):
    """A model option. ``help=None``: set by the plugin itself, not on the command line.
    ``choices`` may be a function, read when the parser is built (the attention registry grows
    with ``--user-dir`` plugins of its own)."""
    return field(default=default, metadata=dict(help=help, type=type, choices=choices, flag=flag, metavar=metavar))


def _attn_fn(what: str):
    return option("softmax", f"attention function of the {what}", choices=attention_names, metavar="FN")


def _attn_k(what: str):
    return option(None, f"attended keys per query in the {what} for functions that take k (default: --attn-k)",
                  type=positive_int, metavar="K")


@dataclass
class SparseModelOptions:
    encoder_attn_fn: str = _attn_fn("encoder self-attention")
    decoder_attn_fn: str = _attn_fn("decoder self-attention")
    cross_attn_fn: str = _attn_fn("encoder-decoder attention")
    encoder_attn_k: Optional[int] = _attn_k("encoder self-attention")
    decoder_attn_k: Optional[int] = _attn_k("decoder self-attention")
    cross_attn_k: Optional[int] = _attn_k("encoder-decoder attention")
    attn_k: int = option(DEFAULT_K, "attended keys per query for functions that take k, e.g. topk",
                         type=positive_int, metavar="K")
    hard_train: str = option(HARD_TRAIN_CHOICES[0], "how hard retrieval attention picks its key in training: sample from "
                             "the softmax (the paper) or take its argmax", choices=HARD_TRAIN_CHOICES)
    attn_impl: str = option(ATTN_IMPLS[0], "how attention is computed: auto (the fastest path of the device that equals "
                            "the method: fused kernels, query chunks recomputed in the backward pass, gathered keys, "
                            "Triton kernels), reference (each method's registered function over (T, S) float32 "
                            "scores everywhere, the definition; for checking a result) or flex (block, window, dilated, "
                            "global, random and BigBird through PyTorch's FlexAttention, on CUDA; every other method "
                            "as auto)", choices=ATTN_IMPLS)
    attn_pattern_seed: int = option(DEFAULT_PATTERN_SEED, "seed of the random key choice of random/bigbird attention",
                                    type=integer, metavar="N")
    topk_oow_window: Optional[int] = option(
        None, "keys in the window of Top-k (OOW) (topk_oow), at most its sublayer's k; the other k - N are the top "
        "scores outside the window (default: a window of ceil(k/2))", type=positive_int, metavar="N")
    l0drop: bool = option(False, "L0Drop: hard-concrete gates on the encoder outputs (train with "
                          "--criterion label_smoothed_cross_entropy_l0drop)", flag=True)
    l0drop_every_layer: bool = option(False, "also gate the output of every encoder layer (the paper's ablation)",
                                      flag=True)
    l0drop_gate_init: str = option("official", "initial gate parameters: official (the official code: Glorot-uniform "
                                   "w, zero bias; gates start about half open) or open (w = 0, bias 3: every gate "
                                   "starts open, the penalty's push 14x weaker)", choices=GATE_INITS, metavar="INIT")
    l0drop_compress: bool = option(True, "decode from the compressed encoder memory of Algorithm 1; "
                                   "--model-overrides \"{'l0drop_compress': False}\" decodes uncompressed",
                                   type=utils.eval_bool, metavar="BOOL")
    l0drop_mask_pruned: bool = option(False, "in training, hide pruned encodings from cross-attention (the official "
                                      "code) instead of keeping them attendable as zero vectors (the paper, default); "
                                      "decoding is the same either way: the zero slot with its count (Algorithm 1)",
                                      flag=True)
    encoder_prune_pattern: Optional[str] = option(
        None, "prune encoder outputs by a fixed rule instead of learned gates (L0Drop paper, section 7): group (keep "
        "every other token), freq (the 100 most frequent types), inv_freq (the rarest types covering 40%% of tokens), "
        "pos (function words, punctuation, MD/EX and subword continuations; needs --encoder-prune-pos-table)",
        choices=PATTERNS)
    encoder_prune_pos_table: Optional[str] = option(
        None, "word types the pos pattern prunes, one a line (python -m fairseq_sparse.data.pos_prune_table)", metavar="FILE")
    # set on a loaded checkpoint's options: its pos table is a buffer of the state, the file is not read
    encoder_prune_pos_table_stored: bool = option(False, None)
    # fairseq's transformer_align (Garg et al., 2019), on every transformer_sparse architecture
    alignment_layer: Optional[int] = option(
        None, "decoder layer whose cross-attention is supervised with alignments, 0 the bottommost (as "
        "transformer_align; unset: fairseq's default, the last layer)", type=integer, metavar="N")
    alignment_heads: Optional[int] = option(
        None, "heads of that cross-attention averaged into the alignment (as transformer_align; unset: all)",
        type=positive_int, metavar="N")
    full_context_alignment: bool = option(
        False, "supervise the alignment conditioned on the full target context (as transformer_align)", flag=True)

    @classmethod
    def add_args(cls, parser) -> None:
        for option in fields(cls):
            meta = option.metadata
            if meta["help"] is None:
                continue
            name = "--" + option.name.replace("_", "-")
            shown = f" (default: {option.default})" if option.default is not None and not meta["flag"] else ""
            if meta["flag"]:
                # default None, not False: an architecture may turn a flag on by default
                parser.add_argument(name, action="store_true", default=None, help=meta["help"])
                continue
            choices = meta["choices"]() if callable(meta["choices"]) else meta["choices"]
            listed = f"; one of: {', '.join(choices)}" if choices is not None and meta["metavar"] else ""
            parser.add_argument(name, type=meta["type"], choices=choices, metavar=meta["metavar"],
                                help=meta["help"] + shown + listed)

    @classmethod
    def fill_defaults(cls, args) -> None:
        """Give every option the user left unset its default (0 and '' count as set, to be rejected)."""
        for option in fields(cls):
            set_default(args, option.name, option.default)

    @classmethod
    def from_cfg(cls, cfg) -> "SparseModelOptions":
        """The checked options of a Namespace or TransformerConfig; unset ones take their defaults
        (a checkpoint saved before an option existed lacks it)."""
        given = {option.name: getattr(cfg, option.name, None) for option in fields(cls)}
        options = cls(**{name: value for name, value in given.items() if value is not None})
        options.validate()
        return options

    @classmethod
    def from_command_line(cls, argv: Sequence[str]) -> "SparseModelOptions":
        """The options a ``fairseq-train`` command line gives its model, with what its architecture
        (``--arch``) presets; options of fairseq's own are ignored."""
        from fairseq.models import ARCH_CONFIG_REGISTRY  # filled as fairseq and this plugin register models

        parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
        parser.add_argument("--arch", "-a", default="transformer_sparse")
        cls.add_args(parser)
        args, _ = parser.parse_known_args(list(argv))
        if args.arch in ARCH_CONFIG_REGISTRY:
            ARCH_CONFIG_REGISTRY[args.arch](args)
        return cls.from_cfg(args)

    def validate(self) -> None:
        """Reject values of another type, unknown function names, k <= 0 and conflicting options with one
        message each."""
        for option in fields(self):
            value, kind = getattr(self, option.name), option_kind(option.name)
            if value is not None and (isinstance(value, bool) != (kind is bool) or not isinstance(value, kind)):
                raise UsageError(f"--{option.name.replace('_', '-')}: {value!r} is a {type(value).__name__}, the "
                                 f"option takes {KIND_NAMES.get(kind, kind.__name__)}")
        for sublayer in SUBLAYERS:
            try:
                get_attention(self.attn_fn_of(sublayer))
            except ValueError as err:
                raise UsageError(f"--{sublayer}-attn-fn: {err}") from None
            sublayer_k = getattr(self, f"{sublayer}_attn_k")
            if sublayer_k is not None:
                check_k(sublayer_k, f"--{sublayer}-attn-k")
        check_k(self.attn_k, "--attn-k")
        if self.topk_oow_window is not None:
            check_k(self.topk_oow_window, "--topk-oow-window")
            for sublayer in SUBLAYERS:
                if get_attention(self.attn_fn_of(sublayer)).uses_oow_window:
                    check_oow_window(self.topk_oow_window, self.attn_k_of(sublayer), f"the {sublayer} self-attention's")
        check_hard_train(self.hard_train)
        check_attn_impl(self.attn_impl)
        check_gate_init(self.l0drop_gate_init)
        if self.encoder_prune_pattern is not None:
            check_pattern(self.encoder_prune_pattern)
        if self.encoder_prune_pattern and (self.l0drop or self.l0drop_every_layer):
            raise UsageError("--encoder-prune-pattern replaces L0Drop's learned gates: use it without --l0drop")

    def unpenalised(self, criterion: Optional[str]) -> Optional[str]:
        """A warning when L0Drop's gates train under a criterion without the L0 penalty (they then stay open)."""
        if self.l0drop and criterion and not criterion.endswith("_l0drop"):
            return (f"--l0drop with --criterion {criterion}: the gates get no L0 penalty and stay open; "
                    "train with --criterion label_smoothed_cross_entropy_l0drop (--l0-lambda 0 for no penalty)")
        return None

    def ignored(self) -> List[str]:
        """Options given a value that nothing in this model reads (e.g. --attn-k 4 with softmax everywhere).
        Only values other than the default are reported: fairseq fills defaults in, so a default cannot
        be told from an option given on the command line (or stored in a checkpoint)."""
        specs = {sublayer: get_attention(self.attn_fn_of(sublayer)) for sublayer in SUBLAYERS}
        functions = ", ".join(f"{sublayer} {spec.name}" for sublayer, spec in specs.items())
        notes = [f"--{sublayer}-attn-k {getattr(self, f'{sublayer}_attn_k')}: the {sublayer} function "
                 f"{spec.name} does not take k" for sublayer, spec in specs.items()
                 if getattr(self, f"{sublayer}_attn_k") is not None and not spec.uses_k]
        if self.attn_k != DEFAULT_K and not any(
                spec.uses_k and getattr(self, f"{sublayer}_attn_k") is None for sublayer, spec in specs.items()):
            notes.append(f"--attn-k {self.attn_k}: no sublayer takes it ({functions})")
        for name, value, default, uses in (("hard-train", self.hard_train, HARD_TRAIN_CHOICES[0], "uses_hard_train"),
                                           ("attn-pattern-seed", self.attn_pattern_seed, DEFAULT_PATTERN_SEED,
                                            "uses_pattern_seed"),
                                           ("topk-oow-window", self.topk_oow_window, None, "uses_oow_window")):
            if value != default and not any(getattr(spec, uses) for spec in specs.values()):
                notes.append(f"--{name} {value}: no sublayer's function reads it ({functions})")
        gated = [("--l0drop-gate-init " + self.l0drop_gate_init, self.l0drop_gate_init != GATE_INITS[0]),
                 ("--l0drop-mask-pruned", self.l0drop_mask_pruned), ("--l0drop-every-layer", self.l0drop_every_layer)]
        notes += [f"{option}: without --l0drop there are no gates" for option, given in gated if given and not self.l0drop]
        if not self.l0drop_compress and not self.uses_gated_encoder:
            notes.append("l0drop_compress False: nothing prunes the encoder outputs, there is nothing to compress")
        if self.encoder_prune_pos_table and self.encoder_prune_pattern != "pos":
            notes.append(f"--encoder-prune-pos-table: read by --encoder-prune-pattern pos only (here "
                         f"{self.encoder_prune_pattern})")
        return notes

    def attn_fn_of(self, sublayer: str) -> str:
        return getattr(self, f"{sublayer}_attn_fn")

    def oow_window_of(self, sublayer: str) -> Optional[int]:
        """Top-k (OOW)'s window in ``sublayer``: None where its function has none or none is given (ceil(k/2))."""
        return self.topk_oow_window if get_attention(self.attn_fn_of(sublayer)).uses_oow_window else None

    def attn_k_of(self, sublayer: str) -> int:
        sublayer_k = getattr(self, f"{sublayer}_attn_k")
        return sublayer_k if sublayer_k is not None else self.attn_k

    def aligns(self) -> bool:
        """Whether transformer_align's options are set (else every forward is fairseq's transformer's)."""
        return self.alignment_layer is not None or self.alignment_heads is not None or bool(self.full_context_alignment)

    @property
    def uses_gated_encoder(self) -> bool:
        return bool(self.l0drop or self.encoder_prune_pattern)

    def summary(self) -> str:
        return ", ".join(f"{sublayer}={self.attn_fn_of(sublayer)}" for sublayer in SUBLAYERS)


def option_kind(name: str) -> Optional[type]:
    """The type of one of SparseModelOptions' values (int for Optional[int]); None for a name it does not have."""
    hints = typing.get_type_hints(SparseModelOptions)
    if name not in hints:
        return None
    kinds = [kind for kind in typing.get_args(hints[name]) if kind is not type(None)] or [hints[name]]
    return kinds[0]


def set_default(args, name: str, value) -> None:
    """Set ``args.name`` unless the user gave it (0 and '' count as given, to be rejected later)."""
    if getattr(args, name, None) is None:
        setattr(args, name, value)

