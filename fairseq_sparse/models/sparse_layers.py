"""The sparse Transformer's layers: fairseq's encoder/decoder (layers) with each attention sublayer
built from a registered attention function, and the model options that choose them.

Only the small ``build_*`` hooks of fairseq's transformer are overridden; every ``forward`` is
fairseq's own. ``models.l0drop`` builds on these classes and ``models.sparse_transformer`` assembles
the model from both, so imports go one way.
"""

import argparse
import logging

from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import TransformerDecoderBase, TransformerEncoderBase
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from ..attention import attention_names, check_k, get_attention
from ..attention.structured import DEFAULT_PATTERN_SEED
from ..modules.sparse_multihead_attention import SparseMultiheadAttention

logger = logging.getLogger(__name__)

SUBLAYERS = ("encoder", "decoder", "cross")
DEFAULT_ATTN_FN = "softmax"
DEFAULT_ATTN_K = 8
HARD_TRAIN_CHOICES = ("sample", "argmax")


def positive_int(text: str) -> int:
    """argparse ``type`` of the k options: a bad k stops fairseq-train in argument parsing, with
    one usage error line, instead of a traceback from model building (fairseq catches nothing)."""
    try:
        return check_k(int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None


def add_sparse_attention_args(parser) -> None:
    """Options choosing the attention function of each sublayer.

    No argparse defaults: fairseq architectures fill unset options, so presets can
    set their own (see ``sparse_attention_defaults``).
    """
    names = attention_names()
    for sublayer, what in zip(SUBLAYERS, ("encoder self-attention", "decoder self-attention", "encoder-decoder attention")):
        parser.add_argument(f"--{sublayer}-attn-fn", choices=names, metavar="FN",
                            help=f"attention function of the {what} (default: {DEFAULT_ATTN_FN}); one of: {', '.join(names)}")
        parser.add_argument(f"--{sublayer}-attn-k", type=positive_int, metavar="K",
                            help=f"attended keys per query in the {what} for functions that take k (default: --attn-k)")
    parser.add_argument("--attn-k", type=positive_int, metavar="K",
                        help=f"attended keys per query for functions that take k, e.g. topk (default: {DEFAULT_ATTN_K})")
    parser.add_argument("--hard-train", choices=HARD_TRAIN_CHOICES,
                        help="how hard retrieval attention picks its key in training: sample from the softmax "
                             "(the paper) or take its argmax (default: sample)")
    parser.add_argument("--attn-pattern-seed", type=int, metavar="N",
                        help=f"seed of the random key choice of random/bigbird attention (default: {DEFAULT_PATTERN_SEED})")


def set_default(args, name: str, value) -> None:
    """Set ``args.name`` unless the user gave it (0 and '' count as given, to be rejected later)."""
    if getattr(args, name, None) is None:
        setattr(args, name, value)


def sparse_attention_defaults(args) -> None:
    set_default(args, "attn_k", DEFAULT_ATTN_K)
    for sublayer in SUBLAYERS:
        set_default(args, f"{sublayer}_attn_fn", DEFAULT_ATTN_FN)
        set_default(args, f"{sublayer}_attn_k", None)
    set_default(args, "hard_train", "sample")
    set_default(args, "attn_pattern_seed", DEFAULT_PATTERN_SEED)


def validate_sparse_attention_args(args) -> None:
    """Reject unknown function names and k <= 0 with one message naming the valid choices."""
    for sublayer in SUBLAYERS:
        fn = getattr(args, f"{sublayer}_attn_fn")
        try:
            get_attention(fn)
        except ValueError as err:
            raise ValueError(f"--{sublayer}-attn-fn: {err}") from None
        sublayer_k = getattr(args, f"{sublayer}_attn_k")
        if sublayer_k is not None:
            check_k(sublayer_k, f"--{sublayer}-attn-k")
    check_k(args.attn_k, "--attn-k")
    if args.hard_train not in HARD_TRAIN_CHOICES:
        raise ValueError(f"--hard-train must be one of {', '.join(HARD_TRAIN_CHOICES)}, got {args.hard_train!r}")


def build_sparse_attention(cfg, sublayer: str, embed_dim: int, num_heads: int, **kwargs) -> SparseMultiheadAttention:
    """The attention module of ``sublayer`` (encoder | decoder | cross) as configured in ``cfg``."""
    sublayer_k = getattr(cfg, f"{sublayer}_attn_k", None)
    return SparseMultiheadAttention(
        embed_dim,
        num_heads,
        attn_fn=getattr(cfg, f"{sublayer}_attn_fn", DEFAULT_ATTN_FN),
        attn_k=sublayer_k if sublayer_k is not None else getattr(cfg, "attn_k", DEFAULT_ATTN_K),
        hard_train=getattr(cfg, "hard_train", "sample"),
        pattern_seed=getattr(cfg, "attn_pattern_seed", DEFAULT_PATTERN_SEED),
        dropout=cfg.attention_dropout,
        **kwargs,
    )


class SparseTransformerEncoderLayer(TransformerEncoderLayerBase):
    def build_self_attention(self, embed_dim, cfg):
        return build_sparse_attention(
            cfg, "encoder", embed_dim, cfg.encoder.attention_heads, self_attention=True,
            q_noise=self.quant_noise, qn_block_size=self.quant_noise_block_size,
        )


class SparseTransformerDecoderLayer(TransformerDecoderLayerBase):
    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        if cfg.cross_self_attention:
            raise ValueError("transformer_sparse does not support --cross-self-attention")
        return build_sparse_attention(
            cfg, "decoder", embed_dim, cfg.decoder.attention_heads, self_attention=True,
            add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn,
            q_noise=self.quant_noise, qn_block_size=self.quant_noise_block_size,
        )

    def build_encoder_attention(self, embed_dim, cfg):
        return build_sparse_attention(
            cfg, "cross", embed_dim, cfg.decoder.attention_heads, kdim=cfg.encoder.embed_dim,
            vdim=cfg.encoder.embed_dim, encoder_decoder_attention=True,
            q_noise=self.quant_noise, qn_block_size=self.quant_noise_block_size,
        )


def wrap_layer(layer, cfg):
    """Activation checkpointing and FSDP wrapping, as fairseq's own build_*_layer do."""
    if cfg.checkpoint_activations:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    min_params_to_wrap = cfg.min_params_to_wrap if not cfg.checkpoint_activations else 0
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


class SparseTransformerEncoder(TransformerEncoderBase):
    def build_encoder_layer(self, cfg):
        return wrap_layer(SparseTransformerEncoderLayer(cfg, return_fc=self.return_fc), cfg)


class SparseTransformerDecoder(TransformerDecoderBase):
    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return wrap_layer(SparseTransformerDecoderLayer(cfg, no_encoder_attn), cfg)
