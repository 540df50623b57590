"""L0Drop for transformer_sparse: gated encoder outputs and the count-aware compressed decoder.

The same encoder serves the rule-based patterns (``--encoder-prune-pattern``), whose
fixed gates replace the learned ones.

The encoder and decoder wrap fairseq's own ``forward``s:

* the encoder gates its output (``--l0drop``; with ``--l0drop-every-layer`` also the
  output of every encoder layer but the last) and, at inference with compression on,
  hands the decoder Algorithm 1's compressed memory: one zero slot standing for the
  pruned encodings, then the kept ones weighted by their gate, with key counts;
* the decoder tells its cross-attention modules the key counts and passes the gate
  statistics to the criterion (``label_smoothed_cross_entropy_l0drop``).

Compressed decoding equals uncompressed decoding exactly when the cross-attention
function honours key counts (softmax, topk, hard, ReLA family); with any other, the
encoder decodes uncompressed and says so once.
"""

import contextlib
import logging
from typing import Dict, Iterator, List, Optional

import torch
from torch import Tensor

from ..attention import get_attention
from ..modules.l0drop import GateOutput, HardConcreteGate, compress_memory, source_attention
from ..modules.prune_patterns import RulePatternGate
from .options import SparseModelOptions
from .sparse_layers import SparseTransformerDecoder, SparseTransformerEncoder, SparseTransformerEncoderLayer, wrap_layer

logger = logging.getLogger(__name__)


class GatedEncoderLayer(SparseTransformerEncoderLayer):
    """An encoder layer whose output may pass through an L0Drop gate (``--l0drop-every-layer``)."""

    def __init__(self, cfg, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        self.l0drop_gate: Optional[HardConcreteGate] = None

    def forward(self, x, encoder_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor] = None):
        out = super().forward(x, encoder_padding_mask, attn_mask=attn_mask)
        if self.l0drop_gate is None:
            return out
        x, fc_result = out if isinstance(out, tuple) else (out, None)
        x, _ = self.l0drop_gate(x, encoder_padding_mask)  # its statistics: see collecting_gate_outputs
        return (x, fc_result) if isinstance(out, tuple) else x


@contextlib.contextmanager
def collecting_gate_outputs(gates: List[torch.nn.Module]) -> Iterator[List[GateOutput]]:
    """Within the block, a list that receives the GateOutput of every call of these gates, in call
    order: fairseq's encoder keeps only each layer's hidden states, so the inner gates' statistics of
    one forward pass are collected on the way out, not stored on layers."""
    collected: List[GateOutput] = []
    handles = [gate.register_forward_hook(lambda module, args, output: collected.append(output[1])) for gate in gates]
    try:
        yield collected
    finally:
        for handle in handles:
            handle.remove()


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
        inner_gates = [layer.l0drop_gate for layer in self.layers if getattr(layer, "l0drop_gate", None) is not None]
        with collecting_gate_outputs(inner_gates) as inner:
            out = super().forward(src_tokens, src_lengths, return_all_hiddens, token_embeddings)
        padding = out["encoder_padding_mask"][0] if out["encoder_padding_mask"] else src_tokens.eq(self.padding_idx)
        x, gate = self.l0drop_gate(out["encoder_out"][0], padding, src_tokens)
        out["l0drop_expected_l0"] = [gate.expected_l0 + sum(g.expected_l0 for g in inner)]
        out["l0drop_closed"] = [gate.closed]
        if self.training or not self.compress:
            # the official code hides pruned encodings in training only; at decoding they stay
            # attendable as zero vectors (its count_mask), as in the paper
            hide_pruned = self.mask_pruned and self.training
            mask = padding | (gate.gates == 0) if hide_pruned else padding
            out["encoder_out"], out["encoder_padding_mask"] = [x], [mask]
        else:
            memory, mask, counts = compress_memory(x, gate.gates, padding)
            out["encoder_out"], out["encoder_padding_mask"], out["encoder_key_counts"] = [memory], [mask], [counts]
            # what maps attention over the compressed slots back to source positions (--print-alignment)
            out["encoder_gates"], out["encoder_source_padding"] = [gate.gates], [padding]
        return out

    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order: Tensor):
        # Beam search reorders every step: carry the key counts along, and drop the gate
        # statistics, which only the criterion reads (from a forward pass, never reordered).
        reordered = super().reorder_encoder_out(encoder_out, new_order)
        for key in ("encoder_key_counts", "encoder_gates", "encoder_source_padding"):
            if encoder_out.get(key):
                reordered[key] = [encoder_out[key][0].index_select(0, new_order)]
        return reordered


@contextlib.contextmanager
def passing_key_counts(attention_modules: List[torch.nn.Module], counts: Optional[Tensor]) -> Iterator[None]:
    """Within the block, every call of these attention modules gets ``counts`` as its ``key_counts``
    argument (nothing changes when counts is None): fairseq's decoder layers call cross-attention with
    fixed arguments, so the counts ride along as a keyword added on the way in, not as module state."""

    def add_counts(module, args, kwargs):
        return args, {**kwargs, "key_counts": counts}

    handles = [m.register_forward_pre_hook(add_counts, with_kwargs=True) for m in attention_modules] if counts is not None else []
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


class L0DropTransformerDecoder(SparseTransformerDecoder):
    def extract_features(self, prev_output_tokens, encoder_out: Optional[Dict[str, List[Tensor]]] = None, **kwargs):
        # a compressed memory exists at inference only (training attends the uncompressed one), so no
        # backward pass, activation checkpointing's included, ever recomputes a call without the counts
        counts = encoder_out.get("encoder_key_counts") if encoder_out is not None else None
        cross = [layer.encoder_attn for layer in self.layers if layer.encoder_attn is not None]
        with passing_key_counts(cross, counts[0] if counts else None):
            return super().extract_features(prev_output_tokens, encoder_out=encoder_out, **kwargs)

    def forward(self, prev_output_tokens, encoder_out: Optional[Dict[str, List[Tensor]]] = None,
                incremental_state=None, **kwargs):
        x, extra = super().forward(prev_output_tokens, encoder_out=encoder_out, incremental_state=incremental_state, **kwargs)
        if encoder_out is not None and encoder_out.get("encoder_gates") and extra.get("attn") and extra["attn"][0] is not None:
            layer = kwargs.get("alignment_layer")
            attn_fn = self.layers[-1 if layer is None else layer].encoder_attn.attn_fn
            # hard retrieval's argmax takes the first of tied keys: the first pruned position
            extra["attn"] = [source_attention(extra["attn"][0], encoder_out["encoder_gates"][0],
                                              encoder_out["encoder_source_padding"][0], first_pruned_only=attn_fn == "hard")]
        if encoder_out is not None and encoder_out.get("l0drop_expected_l0"):
            extra["l0drop_expected_l0"] = encoder_out["l0drop_expected_l0"][0]
            extra["l0drop_closed"] = encoder_out["l0drop_closed"][0]
        return x, extra
