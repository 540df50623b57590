"""L0Drop for transformer_sparse: gated encoder outputs and the count-aware compressed decoder.

The same encoder serves the rule-based patterns (``--encoder-prune-pattern``), whose
fixed gates replace the learned ones.

The encoder and decoder wrap fairseq's own ``forward``s:

* the encoder gates its output (``--l0drop``; with ``--l0drop-every-layer`` also the
  output of every encoder layer but the last) and, at inference with compression on,
  hands the decoder Algorithm 1's compressed memory: one zero slot standing for the
  pruned encodings, then the kept ones weighted by their gate, with key counts in the
  padding mask's place, where fairseq's decoder layers read it for cross-attention;
* the decoder passes the gate statistics to the criterion
  (``label_smoothed_cross_entropy_l0drop``) and maps alignments back to source positions.

Compressed decoding equals uncompressed decoding exactly when the cross-attention
function honours key counts (softmax, topk, hard, ReLA family); with any other, the
encoder decodes uncompressed and says so once.
"""

import logging
from typing import Dict, List, Optional

from torch import Tensor

from ..errors import UsageError
from ..attention import get_attention
from ..modules.l0drop import HardConcreteGate, compress_memory, source_attention
from ..modules.prune_patterns import RulePatternGate
from .options import SparseModelOptions
from .sparse_layers import SparseTransformerDecoder, SparseTransformerEncoder, SparseTransformerEncoderLayer, wrap_layer

logger = logging.getLogger(__name__)


class GatedEncoderLayer(SparseTransformerEncoderLayer):
    """An encoder layer whose output may pass through an L0Drop gate (``--l0drop-every-layer``).

    A gated layer returns ``(x, expected L0 of its gate)``: fairseq's encoder collects each layer's
    second output in ``fc_results`` (with ``return_all_hiddens``), which is how the gates'
    penalty reaches the encoder's output, also through activation checkpointing.
    """

    def __init__(self, cfg, return_fc=False):
        if return_fc:
            raise UsageError("L0Drop gates after encoder layers use the layers' second output; return_fc is not supported")
        super().__init__(cfg, return_fc=False)
        self.l0drop_gate: Optional[HardConcreteGate] = None

    def forward(self, x, encoder_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor] = None):
        x = super().forward(x, encoder_padding_mask, attn_mask=attn_mask)
        if self.l0drop_gate is None:
            return x
        x, gate = self.l0drop_gate(x, encoder_padding_mask)
        return x, gate.expected_l0


class L0DropTransformerEncoder(SparseTransformerEncoder):
    def __init__(self, cfg, dictionary, embed_tokens, return_fc=False):
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        options = SparseModelOptions.from_cfg(cfg)
        if options.encoder_prune_pattern:
            self.l0drop_gate = RulePatternGate(options.encoder_prune_pattern, dictionary, options.encoder_prune_pos_table,
                                               table_stored=options.encoder_prune_pos_table_stored)
        else:
            self.l0drop_gate = HardConcreteGate(cfg.encoder.embed_dim, options.l0drop_gate_init)
        self.mask_pruned = options.l0drop_mask_pruned
        self.compress = options.l0drop_compress
        cross_fn = options.cross_attn_fn
        if self.compress and not get_attention(cross_fn).supports_key_counts:
            logger.warning(f"L0Drop: cross-attention function {cross_fn!r} cannot read a compressed memory "
                           "exactly; decoding uncompressed")
            self.compress = False
        if options.l0drop_every_layer:
            for layer in list(self.layers)[:-1]:
                layer.l0drop_gate = HardConcreteGate(cfg.encoder.embed_dim, options.l0drop_gate_init)

    def build_encoder_layer(self, cfg):
        return wrap_layer(GatedEncoderLayer(cfg, return_fc=self.return_fc), cfg)

    def forward(self, src_tokens, src_lengths: Optional[Tensor] = None, return_all_hiddens: bool = False,
                token_embeddings: Optional[Tensor] = None):
        gated_layers = any(getattr(layer, "l0drop_gate", None) is not None for layer in self.layers)
        out = super().forward(src_tokens, src_lengths, return_all_hiddens or gated_layers, token_embeddings)
        inner_expected_l0 = [l0 for l0 in out["fc_results"] if l0 is not None]
        if gated_layers and not return_all_hiddens:
            out["encoder_states"], out["fc_results"] = [], []
        padding = out["encoder_padding_mask"][0] if out["encoder_padding_mask"] else src_tokens.eq(self.padding_idx)
        x, gate = self.l0drop_gate(out["encoder_out"][0], padding, src_tokens)
        out["l0drop_expected_l0"] = [gate.expected_l0 + sum(inner_expected_l0)]
        out["l0drop_closed"] = [gate.closed]
        if self.training or not self.compress:
            # the official code hides pruned encodings in training only; at decoding they stay
            # attendable as zero vectors (its count_mask), as in the paper
            hide_pruned = self.mask_pruned and self.training
            mask = padding | (gate.gates == 0) if hide_pruned else padding
            out["encoder_out"], out["encoder_padding_mask"] = [x], [mask]
        else:
            # the key counts take the padding mask's place: fairseq's decoder hands it to every
            # cross-attention call as key_padding_mask (modules.l0drop.counted_padding)
            memory, counts = compress_memory(x, gate.gates, padding)
            out["encoder_out"], out["encoder_padding_mask"] = [memory], [counts]
            # what maps attention over the compressed slots back to source positions (--print-alignment)
            out["encoder_gates"], out["encoder_source_padding"] = [gate.gates], [padding]
        return out

    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order: Tensor):
        # Beam search reorders every step: carry the source-position map along, and drop the gate
        # statistics, which only the criterion reads (from a forward pass, never reordered).
        reordered = super().reorder_encoder_out(encoder_out, new_order)
        for key in ("encoder_gates", "encoder_source_padding"):
            if encoder_out.get(key):
                reordered[key] = [encoder_out[key][0].index_select(0, new_order)]
        return reordered


class L0DropTransformerDecoder(SparseTransformerDecoder):
    def forward(self, prev_output_tokens, encoder_out: Optional[Dict[str, List[Tensor]]] = None,
                incremental_state=None, **kwargs):
        x, extra = super().forward(prev_output_tokens, encoder_out=encoder_out, incremental_state=incremental_state, **kwargs)
        if encoder_out is not None and encoder_out.get("encoder_gates") and extra.get("attn") and extra["attn"][0] is not None:
            layer = kwargs.get("alignment_layer")
            spec = self.layers[-1 if layer is None else layer].encoder_attn.spec
            extra["attn"] = [source_attention(extra["attn"][0], encoder_out["encoder_gates"][0],
                                              encoder_out["encoder_source_padding"][0],
                                              first_pruned_only=spec.ties_to_first_key)]
        if encoder_out is not None and encoder_out.get("l0drop_expected_l0"):
            extra["l0drop_expected_l0"] = encoder_out["l0drop_expected_l0"][0]
            extra["l0drop_closed"] = encoder_out["l0drop_closed"][0]
        return x, extra
