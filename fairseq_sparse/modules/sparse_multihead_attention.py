"""Multi-head attention that hands score -> output to a registered attention function.

It keeps fairseq's parameters (q/k/v/out projections), incremental-state layout
(``prev_key``/``prev_value`` as (B, H, S, d_h), ``prev_key_padding_mask``) and
``reorder_incremental_state``, so checkpoints and beam search behave as with the
stock module. Unlike the stock module it never takes fairseq's dense shortcut
(``F.multi_head_attention_forward``): the chosen method runs in training, in the
encoder and in incremental decoding.

Two paths compute it:

* fused, when no weights are requested and the method registers a *selection*
  (softmax, top-k, the structured patterns; see ``attention.registry``): softmax,
  and a pattern up to a 512-token block, run ``scaled_dot_product_attention``
  with the hidden keys as a boolean mask (log key counts as an additive one);
  selections that read scores (top-k), and patterns over long sequences, run in
  query chunks that keep bit masks, not float matrices, for the backward pass
  (``selected_softmax``);
* the registered function over float32 scores otherwise: weights requested (the
  decoder's alignment layer, the analysis tools), one query per call (incremental
  decoding, where stock fairseq is unfused too), and every other method.
"""

import dataclasses
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq.modules.multihead_attention import MultiheadAttention
from torch import Tensor

from ..attention import DEFAULT_K, HARD_TRAIN_CHOICES, AttentionContext, check_k, get_attention
from ..attention.functions import visible_keys
from ..attention.structured import DEFAULT_PATTERN_SEED
from .gathered_attention import GatheredSoftmax, plan_gathered
from .selected_softmax import ChunkPlan, SelectedSoftmaxInChunks

IncrementalState = Dict[str, Dict[str, Optional[Tensor]]]
# Query chunks of the chunked path hold at most this many (query, key) entries per chunk
# (float32 scores, or the int64 ranks of a pattern): 2**20 = 4 MiB of float32, so that a
# sentence-level batch (64 x 4 heads x 30 keys a query) is one chunk, whose weights are kept,
# not recomputed (top-k, one self-attention sublayer, forward + backward, 64 x 30 tokens: 147.6
# ms with 2**16-entry chunks, 143.1 with one chunk, softmax 132.3; at 8 x 120 tokens 97.4 / 80.3 /
# 75.5). Longer inputs gather their keys (gathered_attention) and do not come here.
SELECTION_CHUNK_ELEMENTS = 2**20
# A score-free selection (a structured pattern) goes to the fused kernel as a boolean mask up
# to this many (B x T x S) entries, a 512-token block; beyond, its selected keys are gathered
# (gathered_attention). Measured on CPU, one thread, causal self-attention, 512-d, 4 heads,
# forward + backward: window k=8 gathered 0.83x the masked kernel at 4 x 256 tokens, 1.45x at 2 x 512.
PATTERN_MASK_ELEMENTS = 2**18
# A selection that reads the scores (top-k, Top-k OOW) gathers its keys from this many keys on,
# and runs softmax over all keys in chunks below (same setting: top-k 0.94x at 64 keys, 1.04x
# at 128, 1.25x at 256, 1.54x at 512).
SCORED_GATHER_FROM_KEYS = 128


class SparseMultiheadAttention(MultiheadAttention):
    """fairseq-compatible multi-head attention running ``attn_fn`` from the registry.

    Cross-attention keys/values are projected once per sentence (first decoding
    step) and read from the incremental state afterwards.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        attn_fn: str = "softmax",
        attn_k: int = DEFAULT_K,
        hard_train: str = HARD_TRAIN_CHOICES[0],
        pattern_seed: int = DEFAULT_PATTERN_SEED,
        **kwargs,
    ):
        if kwargs.get("add_bias_kv") or kwargs.get("add_zero_attn"):
            raise ValueError("SparseMultiheadAttention does not support add_bias_kv / add_zero_attn")
        if kwargs.get("xformers_att_config"):
            raise ValueError("SparseMultiheadAttention does not run through xformers")
        kwargs.pop("xformers_att_config", None)
        super().__init__(embed_dim, num_heads, **kwargs)
        self.spec = get_attention(attn_fn)
        self.attn_fn = attn_fn
        if self.spec.self_attention_only and not self.self_attention:
            raise ValueError(f"attention function {attn_fn!r} is defined for self-attention only, not encoder-decoder attention")
        self.pattern_seed = pattern_seed
        self.attn_k = check_k(attn_k)
        if hard_train not in HARD_TRAIN_CHOICES:
            raise ValueError(f"hard_train must be one of {', '.join(HARD_TRAIN_CHOICES)}, got {hard_train!r}")
        self.hard_train = hard_train
        self.output_norm = (
            self.spec.build_output_norm(embed_dim, self.head_dim) if self.spec.build_output_norm else None
        )
        self.head_params = self.spec.build_head_params(num_heads) if self.spec.build_head_params else None

    def extra_repr(self) -> str:
        k = f", k={self.attn_k}" if self.spec.uses_k else ""
        return f"attn_fn={self.attn_fn}{k}, heads={self.num_heads}"

    def set_beam_size(self, beam_size: int) -> None:
        # The cache keeps one row per hypothesis (no beam folding: functions see plain
        # (B x beam) batches); the beam size tells reorder_incremental_state which rows
        # belong to one sentence.
        self.beam_size = beam_size

    def reorder_incremental_state(self, incremental_state: Optional[IncrementalState], new_order: Tensor):
        """Reorder the cache as beam search reorders hypotheses (rows of B x beam)."""
        saved = self._get_input_buffer(incremental_state)
        if not saved:
            return incremental_state
        rows = next((value.size(0) for value in saved.values() if value is not None), None)
        if self.encoder_decoder_attention and _moves_within_sentences(new_order, rows, self.beam_size):
            # every hypothesis of a sentence has the same cross-attention cache (keys and values
            # of that sentence's encoder output): a reorder within sentences changes nothing
            return incremental_state
        for key, value in saved.items():
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
    ) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
        """Project (or read from the cache) keys and values: each (B, H, S, d_h)."""
        saved = self._get_input_buffer(incremental_state) if incremental_state is not None else None
        if saved is not None and static_kv and "prev_key" in saved:
            return saved["prev_key"], saved["prev_value"], saved.get("prev_key_padding_mask")

        source = query if self.self_attention else key
        k = self._split_heads(self.k_proj(source))
        v = self._split_heads(self.v_proj(source))
        if incremental_state is None:
            return k, v, _as_bool(key_padding_mask)

        if saved is not None and "prev_key" in saved and not static_kv:
            k = torch.cat([saved["prev_key"], k], dim=2)
            v = torch.cat([saved["prev_value"], v], dim=2)
        key_padding_mask = self._append_prev_key_padding_mask(
            key_padding_mask=key_padding_mask,
            prev_key_padding_mask=saved.get("prev_key_padding_mask") if saved else None,
            batch_size=k.size(0),
            src_len=k.size(2),
            static_kv=static_kv,
        )
        key_padding_mask = _as_bool(key_padding_mask)  # fairseq's helper returns floats
        saved = saved if saved is not None else {}
        saved["prev_key"], saved["prev_value"] = k, v
        saved["prev_key_padding_mask"] = key_padding_mask
        self._set_input_buffer(incremental_state, saved)
        return k, v, key_padding_mask

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
        key_counts: Optional[Tensor] = None,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """query: (T, B, E); key/value: (S, B, E_kv). Returns (T, B, E) and weights.

        Weights are (B, T, S) averaged over heads, or (H, B, T, S) with
        ``need_head_weights``, as in fairseq. ``key_counts`` (B, S): how many encodings each
        key stands for (L0Drop's compressed memory, passed by its decoder); None: one each.
        """
        if before_softmax:
            raise NotImplementedError("before_softmax is not defined for sparse attention functions")
        need_weights = need_weights or need_head_weights
        tgt_len, bsz, embed_dim = query.shape

        q = self._split_heads(self.q_proj(query))  # unscaled: the kernel of the fused path scales it
        k, v, key_padding_mask = self._keys_and_values(query, key, key_padding_mask, incremental_state, static_kv)
        ctx = AttentionContext(
            k=self.attn_k,
            training=self.training,
            need_weights=need_weights,
            dropout=self.dropout_module,
            hard_train=self.hard_train,
            head_params=self.head_params,
            self_attention=self.self_attention,
            seed=self.pattern_seed,
        )
        if key_counts is not None:
            if not self.spec.supports_key_counts:
                raise ValueError(f"attention function {self.attn_fn!r} cannot read a compressed (counted) memory")
            ctx.key_counts = key_counts[:, None, None, :].float()
        if self.spec.uses_positions:
            ctx.query_positions, ctx.key_positions = self._positions(key_padding_mask, k.size(2), tgt_len, incremental_state)
        # One query per call (incremental decoding) has no (T, S) matrix to save: the plain
        # function is as lean and, measured on CPU, faster than the fused kernel there.
        if self.spec.selection is not None and not need_weights and tgt_len > 1:
            out, weights = self._selected_softmax(q, k, v, ctx, (attn_mask, key_padding_mask)), None
        else:
            mask, bias = _combine_masks(attn_mask, key_padding_mask)
            scores = torch.matmul(q * self.scaling, k.transpose(-1, -2)).float()  # (B, H, T, S)
            if bias is not None:
                scores = scores + bias
            out, weights = self.spec.fn(scores, v, mask, ctx)

        out = out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, embed_dim)
        if self.output_norm is not None:
            out = self.output_norm(out)
        out = self.out_proj(out)

        if not need_weights or weights is None:
            return out, None
        weights = weights.transpose(0, 1)  # (H, B, T, S)
        return out, (weights if need_head_weights else weights.mean(dim=0))

    def _selected_softmax(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext,
                          masks: Tuple[Optional[Tensor], Optional[Tensor]]) -> Tensor:
        """Softmax over the keys ``spec.selection`` leaves, without (B, H, T, S) float matrices.

        q: (B, H, T, d_h), not yet scaled; k, v: (B, H, S, d_h). Returns (B, H, T, d_h).
        ``masks``: fairseq's (attn_mask, key_padding_mask), of which ``mask`` and ``bias`` are made.
        Selections that read scores, and patterns whose mask would exceed
        PATTERN_MASK_ELEMENTS (long sequences), run chunk by chunk
        (``SelectedSoftmaxInChunks``); the others become a boolean mask of
        ``scaled_dot_product_attention`` (softmax: just the padding and causal mask).
        """
        is_pattern = self.spec.selection is not visible_keys
        pattern_mask_entries = q.size(0) * q.size(2) * k.size(2)  # a score-free selection's (B, 1, T, S) mask
        if self.spec.selection_reads_scores:
            at_length = k.size(2) >= SCORED_GATHER_FROM_KEYS
        else:
            at_length = is_pattern and pattern_mask_entries > PATTERN_MASK_ELEMENTS
        if at_length and ctx.key_counts is None:
            gathered = self._gathered_softmax(q, k, v, ctx, masks)
            if gathered is not None:
                return gathered
        attn_mask, key_padding_mask = masks
        if (not is_pattern and key_padding_mask is None and attn_mask is not None and ctx.key_counts is None
                and _is_future_mask(attn_mask, q.size(2), k.size(2))):
            # softmax under fairseq's future mask alone: the kernel's is_causal, no (T, S) mask built
            return F.scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=True, dropout_p=self._dropout_p(),
                                                  scale=self.scaling)
        mask, bias = _combine_masks(attn_mask, key_padding_mask)
        if self.spec.selection_reads_scores or (is_pattern and pattern_mask_entries > PATTERN_MASK_ELEMENTS):
            rows = self._query_chunks(q, k)
            plan = ChunkPlan(
                select=self.spec.selection, rows=rows,
                # the chunks' masks are cut from fairseq's own masks, so that the backward pass keeps
                # no (T, S) mask of its own alive
                mask_rows=lambda r: _combine_masks(_attn_mask_rows(masks[0], r), masks[1])[0],
                bias_rows=lambda r: _query_rows(bias, r),
                context_rows=lambda r: ctx if len(rows) == 1 else _query_rows_of_context(ctx, r),
                scale=self.scaling, dropout=self.dropout_module, dropout_p=self._dropout_p(),
            )
            return SelectedSoftmaxInChunks.apply(q, k, v, plan)
        with torch.no_grad():  # shape and device only: the selection never reads the placeholder
            placeholder = q.new_zeros(()).expand(q.size(0), 1, q.size(2), k.size(2))
            hidden = self.spec.selection(placeholder, mask, ctx)
        empty_rows = None
        if hidden is not None:
            empty_rows = hidden.all(dim=-1, keepdim=True)
            if bool(empty_rows.any()):
                # A query with no key left gets output 0 (the registry's contract): inside the
                # kernel it attends to every key (no softmax of -inf only, so no NaN in either
                # pass), and it is zeroed afterwards, which also zeroes its gradient.
                hidden = hidden & ~empty_rows
            else:
                empty_rows = None  # the usual case: no extra pass over the output
        additive = bias
        if ctx.key_counts is not None:  # c identical keys: exp(s + log c) = c exp(s)
            log_counts = ctx.key_counts.clamp(min=1).log()  # count-0 slots are hidden anyway
            additive = log_counts if additive is None else additive + log_counts
        if additive is not None:
            attn_mask = additive.to(q.dtype)
            if hidden is not None:
                attn_mask = attn_mask.masked_fill(hidden, float("-inf"))
        else:
            attn_mask = None if hidden is None else ~hidden
        causal = attn_mask is not None and _is_causal(attn_mask)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=None if causal else attn_mask, is_causal=causal,
                                             dropout_p=self._dropout_p(), scale=self.scaling)
        return out if empty_rows is None else out.masked_fill(empty_rows, 0.0)

    def _gathered_softmax(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext,
                          masks: Tuple[Optional[Tensor], Optional[Tensor]]) -> Optional[Tensor]:
        """The selection's keys gathered (``gathered_attention``), where the masks allow it:
        none or fairseq's causal mask, beside padding. None: take the other paths."""
        attn_mask, key_padding_mask = masks
        causal = attn_mask is not None
        if causal and not _is_future_mask(attn_mask, q.size(2), k.size(2)):
            return None
        plan = plan_gathered(
            self.spec, q, k, ctx, causal,
            mask_rows=lambda r: _combine_masks(_attn_mask_rows(attn_mask, r), key_padding_mask)[0],
            context_rows=lambda r: _query_rows_of_context(ctx, r),
            key_padding_mask=key_padding_mask, scale=self.scaling, dropout_p=self._dropout_p(),
        )
        return None if plan is None else GatheredSoftmax.apply(q, k, v, plan)

    def _dropout_p(self) -> float:
        dropout = self.dropout_module
        return dropout.p if (dropout.training or dropout.apply_during_inference) else 0.0

    def _query_chunks(self, q: Tensor, k: Tensor) -> List[slice]:
        """Slices of the queries with at most SELECTION_CHUNK_ELEMENTS (B x H x S per query) entries each."""
        bsz, heads, tgt_len, _ = q.shape
        per_query = bsz * heads * k.size(2)
        chunk = max(1, SELECTION_CHUNK_ELEMENTS // max(1, per_query))
        return [slice(start, min(start + chunk, tgt_len)) for start in range(0, tgt_len, chunk)]

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
            steps = saved.get("query_offset")
            if steps is None:
                steps = torch.zeros(key_positions.size(0), dtype=torch.long, device=device)
            query_positions = query_positions + steps[:, None, None]
            saved["query_offset"] = steps + tgt_len
            self._set_input_buffer(incremental_state, saved)
        return query_positions, key_positions


def _is_causal(allowed: Tensor) -> bool:
    """True if a boolean mask of allowed keys is exactly the causal mask of a full pass,
    (1, 1, T, T) lower-triangular: the kernel then needs no mask (and no copy of one)."""
    if allowed.dtype != torch.bool or allowed.dim() != 4 or allowed.shape[:2] != (1, 1) or allowed.size(-1) != allowed.size(-2):
        return False
    return bool(torch.equal(allowed, torch.ones_like(allowed).tril_()))


def _is_future_mask(attn_mask: Tensor, num_queries: int, num_keys: int, rows_at_once: int = 256) -> bool:
    """True if fairseq's (T, S) attention mask hides exactly the keys after each query (T == S) and
    adds nothing to the others; checked a few rows at a time (no (T, S) temporaries at length)."""
    if attn_mask.dim() != 2 or num_queries != num_keys or attn_mask.shape != (num_queries, num_keys):
        return False
    keys = torch.arange(num_keys, device=attn_mask.device)
    for start in range(0, num_queries, rows_at_once):
        rows = attn_mask[start:start + rows_at_once]
        future = keys > torch.arange(start, start + rows.size(0), device=attn_mask.device)[:, None]
        hidden = rows if rows.dtype == torch.bool else rows <= -1e4
        if not torch.equal(hidden, future) or (rows.dtype != torch.bool and bool(rows.masked_fill(future, 0).ne(0).any())):
            return False
    return True


def _moves_within_sentences(new_order: Tensor, rows: Optional[int], beam_size: int) -> bool:
    """True if ``new_order`` keeps the number of rows and sends each row to a row of its own
    sentence (rows are sentences x ``beam_size`` hypotheses).

    Without a beam size (fairseq 0.12's SequenceGenerator never passes one down to a
    TransformerModel's decoder), a reorder that keeps the number of rows is taken to stay
    within sentences, as beam search's do and as stock fairseq's MultiheadAttention assumes.
    """
    if rows is None or new_order.size(0) != rows:
        return False
    if beam_size <= 1:
        return True
    own = torch.arange(rows, device=new_order.device) // beam_size
    return bool(torch.equal(new_order // beam_size, own))


def _attn_mask_rows(attn_mask: Optional[Tensor], rows: slice) -> Optional[Tensor]:
    """Rows ``rows`` of fairseq's (T, S) attention mask."""
    return None if attn_mask is None else attn_mask[rows]


def _query_rows(x: Optional[Tensor], rows: slice) -> Optional[Tensor]:
    """Rows ``rows`` of a mask or bias broadcastable to (B, H, T, S) (unchanged where T is broadcast)."""
    return x if x is None or x.size(-2) == 1 else x[..., rows, :]


def _query_rows_of_context(ctx: AttentionContext, rows: slice) -> AttentionContext:
    """``ctx`` for queries ``rows`` only: query positions are (B|1, 1, T)."""
    if ctx.query_positions is None:
        return ctx
    return dataclasses.replace(ctx, query_positions=ctx.query_positions[..., rows])


def _as_bool(mask: Optional[Tensor]) -> Optional[Tensor]:
    if mask is None or mask.dim() == 0:
        return None
    return mask if mask.dtype == torch.bool else mask != 0


def _combine_masks(
    attn_mask: Optional[Tensor], key_padding_mask: Optional[Tensor]
) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """Turn fairseq's masks into one boolean mask (True = hidden) and an optional score bias.

    attn_mask: (T, S), bool or additive float (fairseq's causal mask is -inf above
        the diagonal; the encoder layer uses -1e8). Entries <= -1e4 hide the key;
        any other non-zero float entries are kept as an additive bias.
    key_padding_mask: (B, S) bool, True at padding.
    Returns a mask broadcastable to (B, H, T, S) and a bias of shape (1, 1, T, S) or None.
    """
    mask, bias = None, None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            mask = attn_mask
        else:
            mask = attn_mask <= -1e4
            if bool(((attn_mask != 0) & ~mask).any()):  # (fairseq's masks have none: no float copy then)
                bias = attn_mask.float().masked_fill(mask, 0.0)[None, None]
        mask = mask[None, None]
    if key_padding_mask is not None:
        padding = key_padding_mask[:, None, None, :]
        mask = padding if mask is None else mask | padding
    return mask, bias
