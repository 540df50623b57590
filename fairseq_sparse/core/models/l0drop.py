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

import torch
from torch import Tensor

from ..errors import UsageError
from ..attention import get_attention
from ..modules.l0drop import HardConcreteGate, compress_memory, source_map
from ..modules.prune_patterns import RulePatternGate
from .options import SparseModelOptions
from .sparse_layers import SparseTransformerDecoder, SparseTransformerEncoder, SparseTransformerEncoderLayer, wrap_layer

logger = logging.getLogger(__name__)


class GatedEncoderLayer(SparseTransformerEncoderLayer):
    """An encoder layer whose output may pass through an L0Drop gate (``--l0drop-every-layer``).

    A gated layer returns ``(x, expected L0 of its gate)``: fairseq's encoder collects each layer's
    second output in ``fc_results`` (with ``return_all_hiddens``), which is how the gates'
    penalty reaches the encoder's output, also through activation checkpointing. Only encoders
    with such gates build these layers.
    """

    def __prepare_scriptable__(self):
        # fairseq's encoder collects no layer's second output under TorchScript (forward_scriptable)
        raise UsageError("a model with L0Drop gates after every encoder layer (--l0drop-every-layer) cannot be "
                         "compiled by TorchScript: fairseq's encoder does not pass a layer's second output when "
                         "scripted. Decode it with the eager model")

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
        self.gated_layers = options.l0drop_every_layer
        self.compress = options.l0drop_compress
        cross_fn = options.cross_attn_fn
        # how attention over the compressed memory's zero slot maps back to the pruned source positions
        self.ties_to_first_key = get_attention(cross_fn).ties_to_first_key
        if self.compress and not get_attention(cross_fn).supports_key_counts:
            logger.warning(f"L0Drop: cross-attention function {cross_fn!r} cannot read a compressed memory "
                           "exactly; decoding uncompressed")
            self.compress = False
        if self.compress and getattr(cfg, "cross_self_attention", False):
            # the decoder's self-attention reads the memory too, and it has no count of the merged keys
            logger.warning("L0Drop: with --cross-self-attention the decoder's self-attention reads the encoder "
                           "memory without its key counts; decoding uncompressed")
            self.compress = False
        if options.l0drop_every_layer:
            for layer in list(self.layers)[:-1]:
                layer.l0drop_gate = HardConcreteGate(cfg.encoder.embed_dim, options.l0drop_gate_init)

    def build_encoder_layer(self, cfg):
        if SparseModelOptions.from_cfg(cfg).l0drop_every_layer:
            return wrap_layer(GatedEncoderLayer(cfg, return_fc=self.return_fc), cfg)
        return super().build_encoder_layer(cfg)

    def forward(self, src_tokens, src_lengths: Optional[Tensor] = None, return_all_hiddens: bool = False,
                token_embeddings: Optional[Tensor] = None):
        # forward_scriptable is fairseq's encoder forward (super() does not script)
        out = self.forward_scriptable(src_tokens, src_lengths, return_all_hiddens or self.gated_layers, token_embeddings)
        padding = out["encoder_padding_mask"][0]
        x, gate = self.l0drop_gate(out["encoder_out"][0], padding, src_tokens)
        expected_l0 = gate.expected_l0
        if self.gated_layers:
            expected_l0 = expected_l0 + self._layers_expected_l0(out, return_all_hiddens)
        out["l0drop_expected_l0"] = [expected_l0]
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
            out["encoder_source_map"] = [source_map(gate.gates, padding, memory.size(0) - 1, self.ties_to_first_key)]
        return out

    @torch.jit.unused  # only with gates after the layers, which do not script (GatedEncoderLayer)
    def _layers_expected_l0(self, out: Dict[str, List[Tensor]], return_all_hiddens: bool) -> Tensor:
        """The expected L0 of the gates after the encoder layers, (B, T), from fairseq's fc_results."""
        expected_l0 = sum(l0 for l0 in out["fc_results"] if l0 is not None)
        if not return_all_hiddens:  # asked for by this encoder, not by its caller
            out["encoder_states"], out["fc_results"] = [], []
        return expected_l0

    @torch.jit.export
    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order: Tensor):
        """Beam search's reorder of every entry: (T, B, C) ones along dim 1, (B, ...) ones along dim 0.

        The source-position map (--print-alignment from a compressed memory) moves with the memory; the
        gate statistics, which only the criterion reads (from a forward pass), are dropped.
        """
        reordered: Dict[str, List[Tensor]] = {}
        for key, values in encoder_out.items():
            if key == "l0drop_expected_l0" or key == "l0drop_closed" or key == "fc_results":
                continue  # (fairseq's reorder drops fc_results too: it may hold None)
            dim = 1 if key == "encoder_out" or key == "encoder_states" else 0
            reordered[key] = [value.index_select(dim, new_order) for value in values]
        return reordered


class L0DropTransformerDecoder(SparseTransformerDecoder):
    def extract_features(
        self,
        prev_output_tokens,
        encoder_out: Optional[Dict[str, List[Tensor]]],
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        full_context_alignment: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
    ):
        # extract_features_scriptable is fairseq's (super() does not script)
        x, extra = self.extract_features_scriptable(prev_output_tokens, encoder_out, incremental_state,
                                                    full_context_alignment, alignment_layer, alignment_heads)
        if encoder_out is None:
            return x, extra
        attn = extra["attn"][0]
        source_maps = encoder_out.get("encoder_source_map")
        if attn is not None and source_maps is not None and len(source_maps) > 0:
            source = torch.bmm(attn, source_maps[0].to(attn.dtype))
            extra["attn"] = torch.jit.annotate(List[Optional[Tensor]], [source])
        expected_l0 = encoder_out.get("l0drop_expected_l0")
        if expected_l0 is not None and len(expected_l0) > 0:  # for the criterion
            extra["l0drop_expected_l0"] = torch.jit.annotate(List[Optional[Tensor]], [expected_l0[0]])
            extra["l0drop_closed"] = torch.jit.annotate(List[Optional[Tensor]], [encoder_out["l0drop_closed"][0]])
        return x, extra
