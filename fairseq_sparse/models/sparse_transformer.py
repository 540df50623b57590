"""``transformer_sparse``: fairseq's Transformer with a registered attention function per sublayer.

Only the small ``build_*`` hooks of fairseq's transformer are overridden; every
``forward`` is fairseq's own.
"""

import logging

from fairseq.distributed import fsdp_wrap
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
)
from fairseq.models.transformer.transformer_legacy import (
    base_architecture,
    transformer_iwslt_de_en,
    transformer_vaswani_wmt_en_de_big,
)
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from ..attention import attention_names, check_k, get_attention
from ..modules.sparse_multihead_attention import SparseMultiheadAttention

logger = logging.getLogger(__name__)

SUBLAYERS = ("encoder", "decoder", "cross")
DEFAULT_ATTN_FN = "softmax"
DEFAULT_ATTN_K = 8
DEFAULT_PATTERN_SEED = 1
HARD_TRAIN_CHOICES = ("sample", "argmax")


def add_sparse_attention_args(parser) -> None:
    """Options choosing the attention function of each sublayer.

    No argparse defaults: fairseq architectures fill unset options, so presets can
    set their own (see ``sparse_attention_defaults``).
    """
    names = attention_names()
    for sublayer, what in zip(SUBLAYERS, ("encoder self-attention", "decoder self-attention", "encoder-decoder attention")):
        parser.add_argument(f"--{sublayer}-attn-fn", choices=names, metavar="FN",
                            help=f"attention function of the {what} (default: {DEFAULT_ATTN_FN}); one of: {', '.join(names)}")
        parser.add_argument(f"--{sublayer}-attn-k", type=int, metavar="K",
                            help=f"attended keys per query in the {what} for functions that take k (default: --attn-k)")
    parser.add_argument("--attn-k", type=int, metavar="K",
                        help=f"attended keys per query for functions that take k, e.g. topk (default: {DEFAULT_ATTN_K})")
    parser.add_argument("--hard-train", choices=HARD_TRAIN_CHOICES,
                        help="how hard retrieval attention picks its key in training: sample from the softmax "
                             "(the paper) or take its argmax (default: sample)")
    parser.add_argument("--attn-pattern-seed", type=int, metavar="N",
                        help=f"seed of the random key choice of random/bigbird attention (default: {DEFAULT_PATTERN_SEED})")


def _set_default(args, name: str, value) -> None:
    """Set ``args.name`` unless the user gave it (0 and '' count as given, to be rejected later)."""
    if getattr(args, name, None) is None:
        setattr(args, name, value)


def sparse_attention_defaults(args) -> None:
    _set_default(args, "attn_k", DEFAULT_ATTN_K)
    for sublayer in SUBLAYERS:
        _set_default(args, f"{sublayer}_attn_fn", DEFAULT_ATTN_FN)
        _set_default(args, f"{sublayer}_attn_k", None)
    _set_default(args, "hard_train", "sample")
    _set_default(args, "attn_pattern_seed", DEFAULT_PATTERN_SEED)


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


@register_model("transformer_sparse")
class SparseTransformerModel(TransformerModel):
    """Transformer whose encoder self-, decoder self- and cross-attention each run a
    registered attention function (``--encoder-attn-fn``, ``--decoder-attn-fn``,
    ``--cross-attn-fn``). All are model options, so ``--model-overrides`` can change
    them at generation time (e.g. decode a softmax-trained model with top-k)."""

    @classmethod
    def add_args(cls, parser):
        from .l0drop import add_l0drop_args

        super().add_args(parser)
        add_sparse_attention_args(parser)
        add_l0drop_args(parser)

    @classmethod
    def build_model(cls, args, task):
        from .l0drop import l0drop_defaults, uses_gated_encoder

        sparse_attention_defaults(args)
        l0drop_defaults(args)
        validate_sparse_attention_args(args)
        # fairseq builds the criterion right after the model, from the same task: this lets
        # label_smoothed_cross_entropy_l0drop refuse a model without gates at start-up
        task.model_has_l0drop_gates = uses_gated_encoder(args)
        return super().build_model(args, task)

    def set_num_updates(self, num_updates):
        self.num_updates = num_updates  # read by criteria that schedule a weight (the L0 lambda ramp)
        super().set_num_updates(num_updates)

    def attention_summary(self) -> str:
        cfg = self.cfg
        return ", ".join(f"{s}={getattr(cfg, f'{s}_attn_fn', DEFAULT_ATTN_FN)}" for s in SUBLAYERS)

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        own = self.state_dict()
        new_gates = [key for key in own if "l0drop_gate" in key and key not in state_dict]
        if new_gates:
            # fine-tuning a model trained without L0Drop: its gates start from their (open) initialisation
            logger.info(f"L0Drop: {len(new_gates)} gate parameters are not in the checkpoint; initialising them")
            state_dict = {**state_dict, **{key: own[key] for key in new_gates}}
        try:
            return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)
        except RuntimeError as err:
            missing = [k for k in self.state_dict() if k not in state_dict]
            unexpected = [k for k in state_dict if k not in self.state_dict()]
            raise RuntimeError(
                f"checkpoint parameters do not fit this transformer_sparse model ({self.attention_summary()}): "
                f"{len(missing)} missing (e.g. {missing[:3]}), {len(unexpected)} unexpected (e.g. {unexpected[:3]}). "
                "Was it trained with another --arch, other sizes, or attention functions that own parameters "
                "(rela_*, relu_rmsnorm, entmax_alpha)? Such functions cannot be swapped in or out with "
                "--model-overrides; functions without parameters (softmax, topk, hard, sparsemax, entmax15, relu) can."
            ) from err

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        from .l0drop import L0DropTransformerEncoder, uses_gated_encoder

        cfg = TransformerConfig.from_namespace(args)
        encoder = L0DropTransformerEncoder if uses_gated_encoder(cfg) else SparseTransformerEncoder
        return encoder(cfg, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        from .l0drop import L0DropTransformerDecoder, uses_gated_encoder

        cfg = TransformerConfig.from_namespace(args)
        decoder = L0DropTransformerDecoder if uses_gated_encoder(cfg) else SparseTransformerDecoder
        return decoder(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention)


# Architectures: the papers' model sizes, then method presets.


@register_model_architecture("transformer_sparse", "transformer_sparse")
def sparse_base_architecture(args):
    """Transformer base (Vaswani et al., 2017): 6+6 layers, 512/2048, 8 heads."""
    sparse_attention_defaults(args)
    base_architecture(args)


@register_model_architecture("transformer_sparse", "transformer_sparse_wmt_en_de_big")
def sparse_big_architecture(args):
    """Transformer big: 6+6 layers, 1024/4096, 16 heads, dropout 0.3."""
    sparse_attention_defaults(args)
    transformer_vaswani_wmt_en_de_big(args)


@register_model_architecture("transformer_sparse", "transformer_sparse_iwslt_de_en")
def sparse_iwslt_architecture(args):
    """fairseq's IWSLT14 De-En model: 6+6 layers, 512/1024, 4 heads."""
    sparse_attention_defaults(args)
    transformer_iwslt_de_en(args)


@register_model_architecture("transformer_sparse", "transformer_sparse_mini")
def sparse_mini_architecture(args):
    """The Top-k paper's 2+2-layer Fr-En model (IWSLT sizes, two layers each side)."""
    args.encoder_layers = getattr(args, "encoder_layers", 2)
    args.decoder_layers = getattr(args, "decoder_layers", 2)
    sparse_iwslt_architecture(args)


def _preset(name, base, doc, **attention):
    """Register an architecture that fixes attention functions on top of ``base`` sizes."""

    def architecture(args):
        for key, value in attention.items():
            _set_default(args, key, value)
        base(args)

    architecture.__doc__ = doc
    register_model_architecture("transformer_sparse", name)(architecture)
    return architecture


_preset("transformer_topk_iwslt_de_en", sparse_iwslt_architecture,
        "Explicit Sparse Transformer on IWSLT14 De-En: top-8 in every sublayer.",
        encoder_attn_fn="topk", decoder_attn_fn="topk", cross_attn_fn="topk", attn_k=8)
_preset("transformer_hard_wmt_en_de", sparse_base_architecture,
        "Hard retrieval decoder self- and cross-attention, Transformer base.",
        decoder_attn_fn="hard", cross_attn_fn="hard")
_preset("transformer_rela_wmt_en_de", sparse_base_architecture,
        "ReLA-g in every sublayer, Transformer base (ReLA Table 1 row 7).",
        encoder_attn_fn="rela_g", decoder_attn_fn="rela_g", cross_attn_fn="rela_g")
_preset("transformer_sparsemax_iwslt_de_en", sparse_iwslt_architecture,
        "Sparsemax in every sublayer, IWSLT sizes.",
        encoder_attn_fn="sparsemax", decoder_attn_fn="sparsemax", cross_attn_fn="sparsemax")
_preset("transformer_entmax15_iwslt_de_en", sparse_iwslt_architecture,
        "1.5-entmax in every sublayer, IWSLT sizes.",
        encoder_attn_fn="entmax15", decoder_attn_fn="entmax15", cross_attn_fn="entmax15")
