"""``transformer_sparse``: fairseq's Transformer with a registered attention function per sublayer.

Only the small ``build_*`` hooks of fairseq's transformer are overridden; every
``forward`` is fairseq's own. The layers and options are in ``sparse_layers``, L0Drop's
gated encoder and compressed-memory decoder in ``l0drop``.
"""

import dataclasses
import logging

from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerConfig, TransformerModel
from fairseq.models.transformer_align import TransformerAlignModel
from fairseq.models.transformer import transformer_decoder, transformer_encoder
from fairseq.modules.fairseq_dropout import FairseqDropout
from fairseq.models.transformer.transformer_legacy import (
    base_architecture,
    transformer_iwslt_de_en,
    transformer_vaswani_wmt_en_de_big,
)

from ..checkpoint_identity import check_languages
from ..errors import CheckpointMismatchError, UsageError
from .l0drop import L0DropTransformerDecoder, L0DropTransformerEncoder
from .options import SparseModelOptions, set_default
from .sparse_layers import SparseTransformerDecoder, SparseTransformerEncoder

logger = logging.getLogger(__name__)

@register_model("transformer_sparse")
class SparseTransformerModel(TransformerModel):
    """Transformer whose encoder self-, decoder self- and cross-attention each run a
    registered attention function (``--encoder-attn-fn``, ``--decoder-attn-fn``,
    ``--cross-attn-fn``). All are model options, so ``--model-overrides`` can change
    them at generation time (e.g. decode a softmax-trained model with top-k)."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        SparseModelOptions.add_args(parser)

    @classmethod
    def build_model(cls, args, task):
        SparseModelOptions.fill_defaults(args)
        options = SparseModelOptions.from_cfg(args)  # one clear error for a bad option, before anything is built
        check_languages(args, task)  # the model's recorded languages against the data this command reads
        for note in options.ignored():
            logger.warning(f"ignored: {note}")
        unpenalised = options.unpenalised(getattr(args, "criterion", None))
        if unpenalised:
            logger.warning(unpenalised)
        # transformer_align's options choose its forward in a subclass: this class keeps fairseq's
        # own forward, which TorchScript compiles
        model_class = SparseTransformerAlignModel if options.aligns() else cls
        return answer_to_stock_dropout_names(super(SparseTransformerModel, model_class).build_model(args, task))

    def set_num_updates(self, num_updates):
        self.num_updates = num_updates  # read by criteria that schedule a weight (the L0 lambda ramp)
        super().set_num_updates(num_updates)

    def train(self, mode: bool = True):
        # fairseq's trainer calls this before the first step's forward: a setting that cannot train on this
        # device stops here, not in that forward (where the trainer would first save a crash.pt)
        if mode:
            cpu = next(self.parameters()).device.type == "cpu"
            flex = sorted({m.attn_fn for m in self.modules() if getattr(m, "trains_only_on_cuda", False)})
            if cpu and flex:
                raise UsageError(f"--attn-impl flex trains on CUDA only (FlexAttention has no backward pass on the "
                                 f"CPU), and this model's {', '.join(flex)} attention would run it on the CPU: train "
                                 "with --attn-impl auto there")
        return super().train(mode)

    def attention_summary(self) -> str:
        return SparseModelOptions.from_cfg(self.cfg).summary()

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
            missing = [k for k in own if k not in state_dict]
            unexpected = [k for k in state_dict if k not in own]
            # a model of other sizes has the same names: without shapes the message would say "0 missing, 0 unexpected"
            reshaped = [f"{k} {tuple(v.shape)} in the checkpoint, {tuple(own[k].shape)} here"
                        for k, v in state_dict.items() if k in own and hasattr(v, "shape") and v.shape != own[k].shape]
            raise CheckpointMismatchError(
                f"checkpoint parameters do not fit this transformer_sparse model ({self.attention_summary()}): "
                f"{len(missing)} missing (e.g. {missing[:3]}), {len(unexpected)} unexpected (e.g. {unexpected[:3]}), "
                f"{len(reshaped)} of another shape (e.g. {reshaped[:2]}). "
                "Was it trained with another --arch, other sizes, or attention functions that own parameters "
                "(rela_*, relu_rmsnorm, entmax_alpha)? Such functions cannot be swapped in or out with "
                "--model-overrides; functions without parameters (softmax, topk, hard, sparsemax, entmax15, relu) can."
            ) from err

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        encoder = L0DropTransformerEncoder if SparseModelOptions.from_cfg(cfg).uses_gated_encoder else SparseTransformerEncoder
        return encoder(cfg, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        decoder = L0DropTransformerDecoder if SparseModelOptions.from_cfg(cfg).uses_gated_encoder else SparseTransformerDecoder
        return decoder(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention)


class SparseTransformerAlignModel(SparseTransformerModel):
    """transformer_sparse with transformer_align's options (--alignment-layer, --alignment-heads,
    --full-context-alignment): fairseq's TransformerAlignModel forwards, which read them. Built by
    SparseTransformerModel.build_model when they are set; eager only, as stock's."""

    def __init__(self, args, encoder, decoder):
        super().__init__(args, encoder, decoder)
        options = SparseModelOptions.from_cfg(args)
        # read by transformer_align's forward_decoder
        self.alignment_layer, self.alignment_heads = options.alignment_layer, options.alignment_heads
        self.full_context_alignment = options.full_context_alignment
        layers = len(decoder.layers)
        if self.alignment_layer is not None and not 0 <= self.alignment_layer < layers:
            raise UsageError(f"--alignment-layer {self.alignment_layer}: the decoder has layers 0..{layers - 1}")

    def forward(self, src_tokens, src_lengths, prev_output_tokens, **kwargs):
        return TransformerAlignModel.forward(self, src_tokens, src_lengths, prev_output_tokens)

    def forward_decoder(self, prev_output_tokens, *args, **kwargs):
        return TransformerAlignModel.forward_decoder(self, prev_output_tokens, *args, **kwargs)


def stock_name(module_class: type) -> str:
    """The name stock fairseq gives the dropout modules of the class a module of ours stands in for:
    its nearest fairseq ancestor, through fairseq's own renaming (TransformerEncoderBase ->
    TransformerEncoder; its layers keep TransformerEncoderLayerBase, as stock's do)."""
    stock = next(c for c in module_class.__mro__ if c.__module__.startswith("fairseq."))
    return transformer_decoder.module_name_fordropout(transformer_encoder.module_name_fordropout(stock.__name__))


def answer_to_stock_dropout_names(model):
    """Name every dropout module as stock fairseq names its counterpart, so fairseq's
    ``--retain-dropout-modules NAMES`` keeps on exactly the dropouts it keeps on in stock fairseq's
    transformer (fairseq names them after the owner's class: ours would be SparseTransformerEncoder,
    SparseMultiheadAttention, ...)."""
    for owner in model.modules():
        for child in owner.children():
            if isinstance(child, FairseqDropout) and child.module_name == type(owner).__name__:
                child.module_name = stock_name(type(owner))
    return model


# Architectures: the papers' model sizes, then method presets.


@register_model_architecture("transformer_sparse", "transformer_sparse")
def sparse_base_architecture(args):
    """Transformer base (Vaswani et al., 2017): 6+6 layers, 512/2048, 8 heads."""
    SparseModelOptions.fill_defaults(args)
    base_architecture(args)


@register_model_architecture("transformer_sparse", "transformer_sparse_wmt_en_de_big")
def sparse_big_architecture(args):
    """Transformer big: 6+6 layers, 1024/4096, 16 heads, dropout 0.3."""
    SparseModelOptions.fill_defaults(args)
    transformer_vaswani_wmt_en_de_big(args)


@register_model_architecture("transformer_sparse", "transformer_sparse_iwslt_de_en")
def sparse_iwslt_architecture(args):
    """fairseq's IWSLT14 De-En model: 6+6 layers, 512/1024, 4 heads."""
    SparseModelOptions.fill_defaults(args)
    transformer_iwslt_de_en(args)


@register_model_architecture("transformer_sparse", "transformer_sparse_mini")
def sparse_mini_architecture(args):
    """The Top-k paper's 2+2-layer Fr-En model (IWSLT sizes, two layers each side)."""
    args.encoder_layers = getattr(args, "encoder_layers", 2)
    args.decoder_layers = getattr(args, "decoder_layers", 2)
    sparse_iwslt_architecture(args)


def _preset(name, base, doc, **attention):
    """Register an architecture that fixes attention functions on top of ``base`` sizes."""
    unknown = set(attention) - {option.name for option in dataclasses.fields(SparseModelOptions)}
    if unknown:
        raise ValueError(f"architecture {name}: {sorted(unknown)} are not transformer_sparse options")

    def architecture(args):
        for key, value in attention.items():
            set_default(args, key, value)
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
