"""The sparse Transformer's layers: fairseq's encoder/decoder (layers) with each attention sublayer
built from a registered attention function, as the model options (``options``) choose.

Only the small ``build_*`` hooks of fairseq's transformer are overridden; every ``forward`` is
fairseq's own. ``models.l0drop`` builds on these classes and ``models.sparse_transformer`` assembles
the model from both, so imports go one way.
"""

import logging

from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import TransformerDecoderBase, TransformerEncoderBase
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from ..attention import get_attention
from ..errors import UsageError
from ..modules.sparse_multihead_attention import SparseMultiheadAttention
from .options import SparseModelOptions

logger = logging.getLogger(__name__)

def build_sparse_attention(cfg, sublayer: str, embed_dim: int, num_heads: int, **kwargs) -> SparseMultiheadAttention:
    """The attention module of ``sublayer`` (encoder | decoder | cross) as configured in ``cfg``."""
    options = SparseModelOptions.from_cfg(cfg)
    return SparseMultiheadAttention(
        embed_dim,
        num_heads,
        attn_fn=options.attn_fn_of(sublayer),
        attn_k=options.attn_k_of(sublayer),
        hard_train=options.hard_train,
        pattern_seed=options.attn_pattern_seed,
        oow_window=options.oow_window_of(sublayer),
        impl=options.attn_impl,
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
        # --cross-self-attention: fairseq's layer puts the source states before the target prefix as the
        # keys of the decoder's self-attention (one distribution over both), which is then no self-attention
        if cfg.cross_self_attention:
            fn = SparseModelOptions.from_cfg(cfg).attn_fn_of("decoder")
            if get_attention(fn).self_attention_only:
                raise UsageError(
                    f"--cross-self-attention: decoder self-attention function {fn!r} is a pattern over the positions "
                    "of one sequence, and with --cross-self-attention the decoder's self-attention attends over the "
                    "source states and the target prefix together; choose another --decoder-attn-fn")
        return build_sparse_attention(
            cfg, "decoder", embed_dim, cfg.decoder.attention_heads, self_attention=not cfg.cross_self_attention,
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
