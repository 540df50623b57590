"""fairseq's attention masks as the attention paths read them: one boolean mask (True = hidden)
plus an optional additive bias, their rows for a chunk of queries, and the checks that let a
path take the kernel's causal shortcut instead of building a (T, S) mask.

The checks read the mask's values, which on a GPU stalls the host until the device has drained
its queue. fairseq's decoder builds its future mask once and hands views of that one tensor to
every layer at every step, so each answer is remembered per mask (``remembered``): a training or
decoding step asks the device nothing about a mask it has seen."""

import copy
import weakref
from typing import Any, Callable, Dict, Optional, Tuple, TypeVar

import torch
from torch import Tensor

from ..attention import AttentionContext


# answers about masks: (question, id of the mask's storage owner, view geometry, version) -> answer
_ANSWERS: Dict[Tuple, Tuple["weakref.ref[Tensor]", Any]] = {}
_MAX_ANSWERS = 256  # masks that change in place every call would otherwise add an entry each time


Answer = TypeVar("Answer")


def remembered(question: str, mask: Tensor, answer: Callable[[Tensor], Answer]) -> Answer:
    """``answer(mask)``, computed once per mask tensor and kept while that tensor lives (a yes or no, or
    what is built from the mask: the FlexAttention block mask every layer of a step shares).

    The key is the tensor that owns the mask's memory (a view's ``_base``), the view's offset,
    shape and strides, and the version counter that every in-place change bumps: a view cut
    afresh from fairseq's cached future mask each step finds the answer of the first step, and
    a changed or new mask is asked again.
    """
    owner = mask if mask._base is None else mask._base
    key = (question, id(owner), mask.storage_offset(), tuple(mask.shape), tuple(mask.stride()), mask._version)
    entry = _ANSWERS.get(key)
    if entry is not None and entry[0]() is owner:
        return entry[1]
    value = answer(mask)
    if len(_ANSWERS) >= _MAX_ANSWERS:
        _ANSWERS.clear()
    _ANSWERS[key] = (weakref.ref(owner, lambda _, key=key: _ANSWERS.pop(key, None)), value)
    return value


def is_future_mask(attn_mask: Tensor, num_queries: int, num_keys: int) -> bool:
    """True if fairseq's (T, S) attention mask hides exactly the keys after each query (T == S) and
    adds nothing to the others (remembered per mask: see the module's docstring)."""
    if attn_mask.dim() != 2 or num_queries != num_keys or attn_mask.shape != (num_queries, num_keys):
        return False
    return remembered("future", attn_mask, _hides_exactly_the_future)


def _hides_exactly_the_future(attn_mask: Tensor, rows_at_once: int = 256) -> bool:
    """Checked a few rows at a time (no (T, S) temporaries at length)."""
    num_queries, num_keys = attn_mask.shape
    keys = torch.arange(num_keys, device=attn_mask.device)
    for start in range(0, num_queries, rows_at_once):
        rows = attn_mask[start:start + rows_at_once]
        future = keys > torch.arange(start, start + rows.size(0), device=attn_mask.device)[:, None]
        hidden = rows if rows.dtype == torch.bool else rows <= -1e4
        if not torch.equal(hidden, future) or (rows.dtype != torch.bool and bool(rows.masked_fill(future, 0).ne(0).any())):
            return False
    return True


def attn_mask_rows(attn_mask: Optional[Tensor], rows: slice) -> Optional[Tensor]:
    """Rows ``rows`` of fairseq's (T, S) attention mask."""
    return None if attn_mask is None else attn_mask[rows]


def query_rows(x: Optional[Tensor], rows: slice) -> Optional[Tensor]:
    """Rows ``rows`` of a mask or bias broadcastable to (B, H, T, S) (unchanged where T is broadcast)."""
    return x if x is None or x.size(-2) == 1 else x[..., rows, :]


def query_rows_of_context(ctx: AttentionContext, rows: slice) -> AttentionContext:
    """``ctx`` for queries ``rows`` only: query positions are (B|1, 1, T)."""
    if ctx.query_positions is None:
        return ctx
    rows_ctx = copy.copy(ctx)
    rows_ctx.query_positions = ctx.query_positions[..., rows]
    return rows_ctx


def as_bool(mask: Optional[Tensor]) -> Optional[Tensor]:
    if mask is None or mask.dim() == 0:
        return None
    return mask if mask.dtype == torch.bool else mask != 0


def combine_masks(
    attn_mask: Optional[Tensor], key_padding_mask: Optional[Tensor], adds_bias: Optional[bool] = None
) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """Turn fairseq's masks into one boolean mask (True = hidden) and an optional score bias.

    attn_mask: (T, S), bool or additive float (fairseq's causal mask is -inf above
        the diagonal; the encoder layer uses -1e8). Entries <= -1e4 hide the key;
        any other non-zero float entries are kept as an additive bias.
    key_padding_mask: (B, S) bool, True at padding.
    adds_bias: whether a float attn_mask adds to keys it does not hide, when the caller knows
        (the rows of a chunk: asked of the whole mask once); None asks ``adds_to_visible_keys``.
    Returns a mask broadcastable to (B, H, T, S) and a bias of shape (1, 1, T, S) or None.
    """
    mask: Optional[Tensor] = None
    bias: Optional[Tensor] = None
    if attn_mask is not None:
        hidden = attn_mask if attn_mask.dtype == torch.bool else attn_mask <= -1e4
        if attn_mask.dtype != torch.bool:
            if adds_bias is None:
                adds_bias = adds_to_visible_keys(attn_mask)
            if adds_bias:
                bias = attn_mask.float().masked_fill(hidden, 0.0)[None, None]  # (fairseq's masks have none: no float copy then)
        mask = hidden[None, None]
    if key_padding_mask is not None:
        padding = key_padding_mask[:, None, None, :]
        mask = padding if mask is None else mask | padding
    return mask, bias


def adds_to_visible_keys(attn_mask: Tensor) -> bool:
    """True if a float attention mask adds a non-zero bias to a key it does not hide (remembered per
    mask, but in a scripted model)."""
    if torch.jit.is_scripting():
        return _reads_a_bias(attn_mask)
    return _remembered_bias(attn_mask)


def _reads_a_bias(attn_mask: Tensor) -> bool:
    return bool(((attn_mask != 0) & ~(attn_mask <= -1e4)).any())


@torch.jit.unused
def _remembered_bias(attn_mask: Tensor) -> bool:
    return remembered("bias", attn_mask, _reads_a_bias)
