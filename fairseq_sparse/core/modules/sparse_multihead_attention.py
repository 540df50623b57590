"""Multi-head attention that hands score -> output to a registered attention function.

It keeps fairseq's parameters (q/k/v/out projections), incremental-state layout (``prev_key``/
``prev_value`` as (B, H, S, d_h), ``prev_key_padding_mask``) and ``reorder_incremental_state``, so
checkpoints and beam search behave as with the stock module. Unlike the stock module it never takes
fairseq's dense shortcut (``F.multi_head_attention_forward``): the chosen method runs in training,
in the encoder and in incremental decoding.

Five paths compute it:

* fused, when no weights are requested and the method registers a *selection* (softmax, top-k, the
  structured patterns; see ``attention.registry``): softmax, and a pattern up to a 512-token block,
  run ``scaled_dot_product_attention`` with the hidden keys as a boolean mask (log key counts as an
  additive one); selections that read scores (top-k), and patterns over long sequences, run in query
  chunks that keep bit masks, not float matrices, for the backward pass (``selected_softmax``);
* the registered function over float32 scores otherwise: weights requested (the decoder's alignment
  layer, the analysis tools), one query per call (incremental decoding, where stock fairseq is
  unfused too), and every other method; over long sequences a chunk of queries at a time,
  recomputed in the backward pass (``function_in_chunks``), so that no (T, S) tensor is kept.

* one kernel for a decoding step of hard retrieval, ReLA and top-k (``AttentionSpec.decoding_kernel``, where
  Triton's kernels run): scores, selection and output in one launch, no (B, H, 1, S) intermediate.

* one kernel forward and two backward for every query of a ReLA or top-k call (``AttentionSpec.sequence_kernel``,
  where Triton's kernels run): FlashAttention-style tiles, no (T, S) tensor written or kept.

* with ``--attn-impl flex``, the position-only patterns through FlexAttention with a block mask
  (``flex_patterns``), where no weights, dropout or counted memory are asked for.

TorchScript compiles the second path only (``torch.jit.is_scripting()`` branches; the fused path's
autograd Functions serve training), calling the function through ``function_module``.
"""

from typing import Dict, Optional, Tuple

import torch
from fairseq.modules.multihead_attention import MultiheadAttention
from torch import Tensor

from ..errors import UsageError
from ..attention import (
    ATTN_IMPLS, DEFAULT_K, HARD_TRAIN_CHOICES, AttentionContext, check_attn_impl, check_hard_train, check_k,
    check_oow_window, function_module, get_attention,
)
from ..attention.structured import DEFAULT_PATTERN_SEED
from ..kernels.decoding_step import MAX_KEYS as MAX_DECODING_KEYS
from ..kernels.device import runs_fused
from ..kernels.tiles import sequence_kernel_fits
from .attention_masks import as_bool, combine_masks, is_future_mask
from .l0drop import counted_padding
from .function_in_chunks import function_chunks, function_in_chunks
from .flex_patterns import flex_pattern_attention, takes_flex
from .fused_softmax import selected_softmax

IncrementalState = Dict[str, Dict[str, Optional[Tensor]]]
class SparseMultiheadAttention(MultiheadAttention):
    """fairseq-compatible multi-head attention running ``attn_fn`` from the registry.

    Cross-attention keys/values are projected once per sentence (first decoding
    step) and read from the incremental state afterwards.
    """

    # read in Python only (the printout, the trainer's check): TorchScript compiles no property listed here
    __jit_unused_properties__ = ["runs_impl", "trains_only_on_cuda"]
    oow_window: Optional[int]  # Top-k (OOW)'s window (None: ceil(k/2)); typed for TorchScript, which reads it

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        attn_fn: str = "softmax",
        attn_k: int = DEFAULT_K,
        hard_train: str = HARD_TRAIN_CHOICES[0],
        pattern_seed: int = DEFAULT_PATTERN_SEED,
        impl: str = ATTN_IMPLS[0],
        oow_window: Optional[int] = None,
        **kwargs,
    ):
        if kwargs.get("add_bias_kv") or kwargs.get("add_zero_attn"):
            raise UsageError("SparseMultiheadAttention does not support add_bias_kv / add_zero_attn")
        if kwargs.get("xformers_att_config"):
            raise UsageError("SparseMultiheadAttention does not run through xformers")
        kwargs.pop("xformers_att_config", None)
        super().__init__(embed_dim, num_heads, **kwargs)
        self.spec = get_attention(attn_fn)
        self.attn_fn = attn_fn
        if self.spec.self_attention_only and not self.self_attention:
            raise UsageError(f"attention function {attn_fn!r} is defined for self-attention only, not encoder-decoder attention")
        self.pattern_seed = pattern_seed
        self.attn_k = check_k(attn_k)
        if oow_window is not None and not self.spec.uses_oow_window:
            raise UsageError(f"attention function {attn_fn!r} has no window to size: oow_window is Top-k (OOW)'s")
        self.oow_window = None if oow_window is None else check_oow_window(oow_window, self.attn_k)
        self.hard_train = check_hard_train(hard_train)
        self.output_norm = (
            self.spec.build_output_norm(embed_dim, self.head_dim) if self.spec.build_output_norm else None
        )
        self.head_params = self.spec.build_head_params(num_heads) if self.spec.build_head_params else None
        self.impl = check_attn_impl(impl)
        if self.impl == "reference" and self.output_norm is not None and hasattr(self.output_norm, "kernel"):
            self.output_norm.kernel = False
        # what a scripted forward reads of the spec (TorchScript cannot read the spec itself)
        self.attention_function = function_module(self.spec)
        self.uses_positions = self.spec.uses_positions

    def __prepare_scriptable__(self):
        # torch.jit.script calls this on every submodule first: one clear error, not TorchScript's complaint
        if not self.spec.scriptable:
            raise UsageError(
                f"attention function {self.attn_fn!r} cannot be compiled by TorchScript (it runs a library "
                "TorchScript cannot compile). Decode with the eager model (fairseq-generate, fairseq-interactive, "
                "the hub interface), or choose a scriptable function for this sublayer"
            )
        return self

    def __getstate__(self):
        # pickle cannot name the spec's factory-built functions: keep the name (torch.save(model), deepcopy)
        state = self.__dict__.copy()
        del state["spec"]
        return state

    def __setstate__(self, state):
        state.setdefault("impl", ATTN_IMPLS[0])  # a module pickled before --attn-impl existed
        state.setdefault("oow_window", None)  # or before --topk-oow-window
        super().__setstate__(state)
        self.spec = get_attention(self.attn_fn)

    def extra_repr(self) -> str:
        k = f", k={self.attn_k}" if self.spec.uses_k else ""
        window = f", window={self.oow_window}" if self.oow_window is not None else ""
        impl = f", impl={self.runs_impl}" if self.runs_impl != ATTN_IMPLS[0] else ""
        return f"attn_fn={self.attn_fn}{k}{window}, heads={self.num_heads}{impl}"

    @property
    def runs_impl(self) -> str:
        """The implementation this module runs: ``flex`` computes only the patterns that say their selection
        as a block mask, every other method as ``auto`` (what the model's printout shows)."""
        return ATTN_IMPLS[0] if self.impl == "flex" and self.spec.flex_mask is None else self.impl

    @property
    def trains_only_on_cuda(self) -> bool:
        """FlexAttention has no backward pass on the CPU."""
        return self.runs_impl == "flex"

    def set_beam_size(self, beam_size: int) -> None:
        # The cache keeps one row per hypothesis (no beam folding: functions see plain
        # (B x beam) batches); the beam size tells reorder_incremental_state which rows
        # belong to one sentence.
        self.beam_size = beam_size

    def reorder_incremental_state(self, incremental_state: Optional[IncrementalState], new_order: Tensor):
        """Reorder the cache as beam search reorders hypotheses (rows of B x beam)."""
        saved = self._get_input_buffer(incremental_state)
        if len(saved) == 0:
            return incremental_state
        rows: Optional[int] = None
        for value in saved.values():
            if value is not None and rows is None:
                rows = value.size(0)
        if self.encoder_decoder_attention and _moves_within_sentences(new_order, rows, self.beam_size):
            # every hypothesis of a sentence has the same cross-attention cache (keys and values
            # of that sentence's encoder output): a reorder within sentences changes nothing
            return incremental_state
        for key in list(saved.keys()):
            value = saved[key]
            if value is not None:
                saved[key] = value.index_select(0, new_order)
        return self._set_input_buffer(incremental_state, saved)

    def _split_heads(self, x: Tensor) -> Tensor:
        """(L, B, E) -> (B, H, L, d_h)"""
        length, bsz, _ = x.shape
        return x.view(length, bsz, self.num_heads, self.head_dim).permute(1, 2, 0, 3)

    def _keys_and_values(
        self,
        query: Tensor,
        key: Optional[Tensor],
        key_padding_mask: Optional[Tensor],
        incremental_state: Optional[IncrementalState],
        static_kv: bool,
    ) -> Tuple[Tensor, Tensor, Optional[Tensor], Optional[Tensor]]:
        """Project (or read from the cache) keys and values, each (B, H, S, d_h), the padding mask and
        the key counts of a counted memory, (B, 1, 1, S) float (L0Drop's: ``counted_padding``)."""
        if incremental_state is not None and static_kv:
            saved = self._get_input_buffer(incremental_state)
            prev_key, prev_value = saved.get("prev_key"), saved.get("prev_value")
            if prev_key is not None and prev_value is not None:
                # the memory is the same every step: so are its mask and counts (no per-step work)
                return prev_key, prev_value, saved.get("prev_key_padding_mask"), saved.get("prev_key_counts")

        key_padding_mask, counts = counted_padding(key_padding_mask)
        key_counts = None if counts is None else counts[:, None, None, :].float()
        source = query
        if not self.self_attention:
            assert key is not None, "encoder-decoder attention needs keys"
            source = key
        k = self._split_heads(self.k_proj(source))
        v = self._split_heads(self.v_proj(source))
        if incremental_state is None:
            return k, v, as_bool(key_padding_mask), key_counts

        saved = self._get_input_buffer(incremental_state)
        prev_key, prev_value = saved.get("prev_key"), saved.get("prev_value")
        if prev_key is not None and prev_value is not None and not static_kv:
            k = torch.cat([prev_key, k], dim=2)
            v = torch.cat([prev_value, v], dim=2)
        key_padding_mask = self._append_prev_key_padding_mask(
            key_padding_mask=key_padding_mask,
            prev_key_padding_mask=saved.get("prev_key_padding_mask"),
            batch_size=k.size(0),
            src_len=k.size(2),
            static_kv=static_kv,
        )
        key_padding_mask = as_bool(key_padding_mask)  # fairseq's helper returns floats
        saved["prev_key"] = k
        saved["prev_value"] = v
        saved["prev_key_padding_mask"] = key_padding_mask
        if key_counts is not None:
            saved["prev_key_counts"] = key_counts
        self._set_input_buffer(incremental_state, saved)
        return k, v, key_padding_mask, key_counts

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[IncrementalState] = None,
        need_weights: bool = True,
        static_kv: bool = False,
        attn_mask: Optional[Tensor] = None,
        before_softmax: bool = False,
        need_head_weights: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """query: (T, B, E); key/value: (S, B, E_kv). Returns (T, B, E) and weights.

        Weights are (B, T, S) averaged over heads, or (H, B, T, S) with
        ``need_head_weights``, as in fairseq. ``key_padding_mask`` (B, S) may be L0Drop's counted
        memory: how many encodings each key stands for, an integer tensor (``counted_padding``).
        """
        if before_softmax:
            raise NotImplementedError("before_softmax is not defined for sparse attention functions")
        need_weights = need_weights or need_head_weights
        tgt_len, bsz, embed_dim = query.shape

        q = self._split_heads(self.q_proj(query))  # unscaled: the kernel of the fused path scales it
        k, v, key_padding_mask, key_counts = self._keys_and_values(query, key, key_padding_mask, incremental_state, static_kv)
        ctx = AttentionContext(
            k=self.attn_k,
            training=self.training,
            need_weights=need_weights,
            dropout_p=self.attention_dropout_p(),
            hard_train=self.hard_train,
            head_params=None if self.head_params is None else self.head_params(),
            self_attention=self.self_attention,
            seed=self.pattern_seed,
            oow_window=self.oow_window,
        )
        if key_counts is not None:
            if not torch.jit.is_scripting():
                self._check_reads_key_counts()
            ctx.key_counts = key_counts
        if self.uses_positions:
            positions = self._positions(key_padding_mask, k.size(2), tgt_len, incremental_state)
            ctx.query_positions, ctx.key_positions = positions[0], positions[1]
        # One query per call (incremental decoding) has no (T, S) matrix to save: the plain
        # function is as lean and, measured on CPU, faster than the fused kernel there.
        if torch.jit.is_scripting():
            out, weights = self._attend(q, k, v, ctx, attn_mask, key_padding_mask)
        elif self.impl == "reference":
            out, weights = self._attend(q, k, v, ctx, attn_mask, key_padding_mask)
        elif self._decodes_in_one_kernel(tgt_len, k.size(2), ctx, attn_mask):
            out, weights = self.spec.decoding_kernel(q, k, v, key_padding_mask, ctx.key_counts, self.scaling, ctx.k), None
        elif self._attends_in_sequence_kernel(tgt_len, k.size(2), ctx, attn_mask, q):
            out = self.spec.sequence_kernel(q, k, v, key_padding_mask, ctx.key_counts, self.scaling, attn_mask is not None,
                                            ctx.dropout_p, ctx.k)
            weights = None
        elif takes_flex(self, tgt_len, k.size(2), ctx, attn_mask):
            out, weights = flex_pattern_attention(self, q, k, v, ctx, attn_mask, key_padding_mask), None
        elif self.spec.selection is not None and not need_weights and tgt_len > 1:
            out, weights = selected_softmax(self, q, k, v, ctx, (attn_mask, key_padding_mask)), None
        elif not need_weights and function_chunks(q, k) is not None:
            out, weights = function_in_chunks(self, q, k, v, ctx, (attn_mask, key_padding_mask)), None
        else:
            out, weights = self._attend(q, k, v, ctx, attn_mask, key_padding_mask)

        out = out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, embed_dim)
        if self.output_norm is not None:
            out = self.output_norm(out)
        out = self.out_proj(out)

        if not need_weights or weights is None:
            return out, None
        weights = weights.transpose(0, 1)  # (H, B, T, S)
        return out, (weights if need_head_weights else weights.mean(dim=0))

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, attn_mask: Optional[Tensor], key_padding_mask: Optional[Tensor]
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """The registered function over float32 scores: (B, H, T, d_h) output and (B, H, T, S) weights."""
        mask, bias = combine_masks(attn_mask, key_padding_mask)
        scores = torch.matmul(q * self.scaling, k.transpose(-1, -2)).float()  # (B, H, T, S)
        if bias is not None:
            scores = scores + bias
        if torch.jit.is_scripting():
            return self.attention_function(scores, v, mask, ctx)
        return self.spec.fn(scores, v, mask, ctx)

    @torch.jit.unused
    def _decodes_in_one_kernel(self, tgt_len: int, num_keys: int, ctx: AttentionContext, attn_mask: Optional[Tensor]) -> bool:
        """A decoding step of a method with a kernel for it (``AttentionSpec.decoding_kernel``), where kernels run."""
        return (self.spec.decoding_kernel is not None and tgt_len == 1 and not ctx.need_weights and attn_mask is None
                and not ctx.training and ctx.dropout_p == 0.0 and not torch.is_grad_enabled()
                and num_keys <= MAX_DECODING_KEYS and runs_fused(self.q_proj.weight.device))

    @torch.jit.unused
    def _attends_in_sequence_kernel(self, tgt_len: int, num_keys: int, ctx: AttentionContext,
                                    attn_mask: Optional[Tensor], q: Tensor) -> bool:
        """A call of several queries of a method with a kernel for it (``AttentionSpec.sequence_kernel``), where
        kernels run, with no weights requested and no attention mask but fairseq's future mask, and where the
        kernel's tiles fit the device for q's dtype and head size (else a notice, once, and the reference path)."""
        takes = self.spec.sequence_kernel_takes
        return (self.spec.sequence_kernel is not None and tgt_len > 1 and not ctx.need_weights
                and (takes is None or takes(ctx.key_counts, ctx.k)) and runs_fused(self.q_proj.weight.device)
                and (attn_mask is None or is_future_mask(attn_mask, tgt_len, num_keys))
                and sequence_kernel_fits(self.spec.sequence_kernel, q))

    def attention_dropout_p(self) -> float:
        """The attention dropout rate where it applies (training, or fairseq's --retain-dropout), else 0."""
        dropout = self.dropout_module
        return dropout.p if (dropout.training or dropout.apply_during_inference) else 0.0

    def _check_reads_key_counts(self) -> None:
        if not self.spec.supports_key_counts:
            raise UsageError(f"attention function {self.attn_fn!r} cannot read a compressed (counted) memory")

    def _positions(
        self, key_padding_mask: Optional[Tensor], num_keys: int, tgt_len: int, incremental_state: Optional[IncrementalState]
    ) -> Tuple[Tensor, Tensor]:
        """Real-token positions of queries (B|1, 1, T) and keys (B|1, 1, S).

        Padding is not counted, so a left-padded source numbers its tokens as the lone
        sentence would. Self-attention queries are the last T keys. Cross-attention
        queries are target steps: 0..T-1 in a full pass; in incremental decoding a
        per-sentence step counter kept in the incremental state (reordered with it).
        """
        device = self.q_proj.weight.device
        if key_padding_mask is None:
            key_positions = torch.arange(num_keys, device=device)[None, None, :]
        else:
            key_positions = ((~key_padding_mask).long().cumsum(dim=-1) - 1)[:, None, :]
        if self.self_attention:
            return key_positions[..., -tgt_len:], key_positions
        query_positions = torch.arange(tgt_len, device=device)[None, None, :]
        if incremental_state is not None:
            saved = self._get_input_buffer(incremental_state)
            offset = saved.get("query_offset")
            steps = torch.zeros(key_positions.size(0), dtype=torch.long, device=device) if offset is None else offset
            query_positions = query_positions + steps[:, None, None]
            saved["query_offset"] = steps + tgt_len
            self._set_input_buffer(incremental_state, saved)
        return query_positions, key_positions


def _moves_within_sentences(new_order: Tensor, rows: Optional[int], beam_size: int) -> bool:
    """True if ``new_order`` keeps the number of rows (sentences x ``beam_size`` hypotheses).

    Beam search permutes hypotheses within their sentence and drops finished sentences; it never
    sends a hypothesis to another sentence. So, as stock fairseq's MultiheadAttention does, a
    reorder that keeps the number of rows is taken to stay within sentences, without reading
    ``new_order`` (which would stall a GPU's host at every decoding step and layer).
    """
    return rows is not None and new_order.size(0) == rows
