"""A registry of plain attention functions.

An attention function maps masked attention scores and values to an output and
(optionally) the attention weights::

    fn(scores, values, mask, ctx) -> (output, weights)

    scores:  (*, H, T, S)  scaled dot products q.k / sqrt(d_h), float32
    values:  (*, H, S, D)  broadcastable against the leading dims of ``scores``
    mask:    bool, broadcastable to ``scores``; True marks a key the query must
             not see (causal future, padding). ``None`` means nothing is masked.
    ctx:     :class:`AttentionContext` (positions, k, training mode, dropout, ...)
    output:  (*, H, T, D)
    weights: (*, H, T, S) or None (None only when ``ctx.need_weights`` is False)

A function never returns NaN for a query whose keys are all masked: its output row
is zero.

A function that is softmax over a subset of the keys (softmax itself, top-k, the
structured patterns) also registers that subset as a *selection*::

    select(scores, mask, ctx) -> hidden

    hidden:  bool, broadcastable to ``scores``; True where the key is not attended
             (a superset of ``mask``). Score-free selections (``selection_reads_scores``
             False) receive a zero-stride placeholder with the right shape and device.

When no weights are requested the attention module then computes the output with a
fused kernel (``scaled_dot_product_attention``) over the keys the selection leaves,
in query chunks for selections that read scores, instead of calling ``fn``; at length
the selected keys are gathered instead (``modules/gathered_attention``: top-k reads the
scores once, a pattern with a ``selection_band`` evaluates only the keys in that band).
The paths agree to float tolerance (tests/core/modules/test_fused_attention.py). ``register_selection``
registers such a method from its selection alone. Functions that need parameters of their own (a learned alpha, a
normalisation of the head outputs) declare builders in the register call; the
attention module owns the resulting modules and hands them over in ``ctx``.

Adding a method costs one function and one ``@register_attention`` line. The function is typed as
above (``mask: Optional[Tensor]``, ``ctx: AttentionContext``): TorchScript compiles it into scripted
models, through ``function_module``; one it cannot compile registers ``scriptable=False``.
"""

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from torch import Tensor, nn

from ..errors import UsageError

AttentionOutput = Tuple[Tensor, Optional[Tensor]]


# Attended keys per query of the functions that take k (top-k, the patterns), when none is given.
DEFAULT_K = 8
# How hard retrieval picks its key in training: sample from the softmax (the paper) or take its argmax.
HARD_TRAIN_CHOICES = ("sample", "argmax")
# How an attention module computes its method (--attn-impl): auto, the fastest path of the device that
# equals the method (fused kernels, query chunks, gathered keys, Triton kernels); reference, the
# registered function over (T, S) float32 scores everywhere (the definition, for checking a result);
# flex, the position-only patterns through PyTorch's FlexAttention with a block mask (CUDA; forward only on
# a CPU), every other method as auto: not auto's choice until a GPU has measured it against auto's paths.
ATTN_IMPLS = ("auto", "reference", "flex")


class AttentionContext:
    """Everything an attention function may need besides scores, values and mask.

    A plain class of tensors and numbers (not a dataclass), so that TorchScript compiles it with
    the functions that read it. TorchScript does not narrow an optional attribute after a test:
    a function reads one into a local first (``counts = ctx.key_counts; if counts is not None``).
    """

    def __init__(
        self,
        k: int = DEFAULT_K,
        training: bool = False,
        need_weights: bool = True,
        dropout_p: float = 0.0,
        hard_train: str = "sample",
        head_params: Optional[Tensor] = None,
        self_attention: bool = True,
        query_positions: Optional[Tensor] = None,
        key_positions: Optional[Tensor] = None,
        seed: int = 0,
        key_counts: Optional[Tensor] = None,
        oow_window: Optional[int] = None,
    ):
        self.k = k
        self.training = training
        self.need_weights = need_weights
        # attention dropout rate where it applies (training, or fairseq's --retain-dropout), else 0
        self.dropout_p = dropout_p
        self.hard_train = hard_train  # how `hard` picks its key in training (HARD_TRAIN_CHOICES)
        # what the function's build_head_params module returns this call (entmax_alpha: one alpha per head)
        self.head_params = head_params
        self.self_attention = self_attention
        # Only for functions registered with uses_positions=True. Positions count real
        # tokens (padding excluded), so left-padded sources and incremental decoding see
        # the same numbers as a lone, unpadded sentence in a full forward pass.
        self.query_positions = query_positions  # (B or 1, 1, T) long
        self.key_positions = key_positions  # (B or 1, 1, S) long; -1 at left padding
        self.seed = seed  # for functions with random patterns
        # Multiplicity of each key, (B or 1, 1, 1, S) float, or None (every key once). L0Drop's
        # compressed memory stands one zero slot in for its c pruned encodings; a function
        # registered with supports_key_counts must treat it exactly as c identical keys.
        self.key_counts = key_counts
        # keys of Top-k (OOW)'s window (--topk-oow-window), the rest of k picked by score; None: ceil(k/2)
        self.oow_window = oow_window


class PatternGeometry:
    """Which keys each query of one call may see, in the terms a FlexAttention mask_mod reads.

    Every tensor is expanded to the batch (no copy), so that ``mask_mod(b, h, q_idx, kv_idx)`` indexes it
    with any sentence b. Positions count real tokens as ``AttentionContext``'s do.
    """

    def __init__(self, query_positions: Tensor, key_positions: Tensor, key_padding: Optional[Tensor], causal: bool,
                 batch: int):
        # batch: the call's sentences, which FlexAttention hands to mask_mod as b even where every
        # sentence has the same positions (no padding: positions of shape (1, ...))
        self.query_positions = query_positions.expand(batch, -1)  # (B, T) long
        self.key_positions = key_positions.expand(batch, -1)  # (B, S) long, -1 at left padding
        self.key_padding = None if key_padding is None else key_padding.expand(batch, -1)  # (B, S) bool, True at padding
        self.causal = causal  # no query sees a key after it (fairseq's future mask)
        # self-attention queries are the last T keys: query i is key i + future_offset
        self.future_offset = self.key_positions.size(1) - self.query_positions.size(1)
        # (B, T): the position of the last key each query may see (its own under a causal mask)
        if causal:
            self.last_visible = self.query_positions
        else:
            self.last_visible = self.key_positions.amax(dim=1, keepdim=True).expand_as(self.query_positions)

    @property
    def batch_size(self) -> int:
        return self.key_positions.size(0)

    def visible(self, b: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        """True where query q_idx of sentence b may see key kv_idx (neither padding nor future)."""
        seen = kv_idx >= 0  # every key, as a bool of kv_idx's shape
        if self.key_padding is not None:
            seen = seen & ~self.key_padding[b, kv_idx]
        if self.causal:
            seen = seen & (kv_idx <= q_idx + self.future_offset)
        return seen


# The sublayers of a transformer, in fairseq's order.
SUBLAYERS = ("encoder", "decoder", "cross")


@dataclass(frozen=True)
class AttentionSpec:
    name: str
    fn: Callable[[Tensor, Tensor, Optional[Tensor], AttentionContext], AttentionOutput]
    uses_k: bool = False
    # Where its paper puts it (the benchmarks' and the GPU report's rows; hard retrieval: decoder self + cross).
    # A self-attention-only function never sits in cross-attention, whatever this says.
    placement: Tuple[str, ...] = SUBLAYERS
    # Each query's weights sum to 1 (0 with no key left); False for ReLA and its ablations, whose rows are
    # rectified scores (the analysis re-normalises them before comparing distributions).
    weights_are_probabilities: bool = True
    # Its selection is the k largest visible scores of each query (top-k): the gathered path finds them
    # with one torch.topk per chunk instead of evaluating the selection over every key.
    selection_is_top_k: bool = False
    # reads ctx.hard_train (--hard-train) / ctx.seed (--attn-pattern-seed) / ctx.oow_window (--topk-oow-window):
    # otherwise those options are ignored
    uses_hard_train: bool = False
    uses_pattern_seed: bool = False
    uses_oow_window: bool = False
    # Builds a module applied to the concatenated head outputs, (T, B, embed_dim),
    # before the output projection (ReLA's normalisation). Called as (embed_dim, head_dim).
    build_output_norm: Optional[Callable[[int, int], nn.Module]] = None
    # Builds a module of per-head parameters, called as (num_heads,); what its forward() returns is
    # handed to `fn` as ctx.head_params.
    build_head_params: Optional[Callable[[int], nn.Module]] = None
    # ctx.query_positions / ctx.key_positions are filled in (a little work per call).
    uses_positions: bool = False
    # Defined only for self-attention: using it in encoder-decoder attention is an error.
    self_attention_only: bool = False
    # Honours ctx.key_counts, so L0Drop's compressed decoding is exact with it.
    supports_key_counts: bool = False
    # Gives all the weight of tied keys to the first of them (an argmax): L0Drop's alignments map
    # the weight of its zero slot (c tied keys) to the first pruned position, not c shares.
    ties_to_first_key: bool = False
    # The function is softmax over the keys this selection leaves (see the module docstring).
    selection: Optional[Callable[[Tensor, Optional[Tensor], AttentionContext], Optional[Tensor]]] = None
    selection_reads_scores: bool = False
    # For a score-free selection: every key it leaves lies within band(k) real-token positions
    # of its query (block, window, dilated), so at length only those candidates are evaluated.
    selection_band: Optional[Callable[[int], int]] = None
    # At most this many keys per query, for k (block, window, dilated: k), so that the gathered path
    # sizes its slots without reading a count from the device.
    selection_width: Optional[Callable[[int], int]] = None
    # One decoding step as one kernel where the kernels run (kernels.device.runs_fused): called as (q, k, v,
    # key_padding_mask, key_counts, scaling, k) with one query, q, k, v (B, H, 1|S, d_h), where `fn` would run
    # with no requested weights, no attention mask, no dropout and no gradient, and equal to it there
    # (kernels.decoding_step: hard retrieval's argmax and gather, ReLA's rectified sum, top-k's softmax).
    decoding_kernel: Optional[Callable[..., Tensor]] = None
    # Every query of a call as one kernel forward and backward where the kernels run: called as (q, k, v,
    # key_padding_mask, key_counts, scaling, causal, dropout_p, k) with q (B, H, T, d_h), T > 1, where `fn` would
    # run with no requested weights and no attention mask but fairseq's future mask (causal), and equal to it
    # there, its dropout drawn by the kernel; no (T, S) tensor kept for the backward pass
    # (kernels.rectified_attention: ReLA's rectified sum; kernels.topk_attention: top-k's threshold, then
    # FlashAttention over the keys it keeps).
    sequence_kernel: Optional[Callable[..., Tensor]] = None
    # (key_counts, k) -> whether the sequence kernel computes such a call; None: every call it is asked for.
    sequence_kernel_takes: Optional[Callable[[Optional[Tensor], int], bool]] = None
    # Its selection as a FlexAttention mask_mod, for a selection that reads no scores: called as
    # (PatternGeometry, AttentionContext) once per call, returns mask_mod(b, h, q_idx, kv_idx) -> bool, True
    # where the query attends to the key, equal to ~selection (--attn-impl flex: modules.flex_patterns).
    flex_mask: Optional[Callable[..., Callable[..., Tensor]]] = None
    # TorchScript compiles `fn` (typed arguments, no Python-only constructs on its inference path);
    # False for functions of libraries that TorchScript cannot compile (the entmax package)
    scriptable: bool = True
    description: str = ""

    @property
    def owns_parameters(self) -> bool:
        """It builds modules of its own (ReLA's output norm, alpha-entmax's alphas)."""
        return self.build_output_norm is not None or self.build_head_params is not None

    @property
    def sublayers(self) -> Tuple[str, ...]:
        """Where it runs in the benchmarks: its paper's placement, never cross-attention if self-attention only."""
        return tuple(s for s in self.placement if not (self.self_attention_only and s == "cross"))


_REGISTRY: Dict[str, AttentionSpec] = {}


def register_attention(name: str, **capabilities):
    """Decorator adding an attention function to the registry under ``name``; ``capabilities``
    are ``AttentionSpec``'s fields after ``fn`` (an unknown one is a TypeError)."""

    def wrap(fn):
        if name in _REGISTRY:
            raise ValueError(f"attention function {name!r} is registered twice")
        if "<locals>" in fn.__qualname__:
            # functions built by a factory (the ReLA variants, the selections) share one qualified
            # name, under which TorchScript would compile only the first of them
            fn.__qualname__ = f"{fn.__qualname__}_{name}"
        description = (fn.__doc__ or "").strip().split("\n")[0]
        _REGISTRY[name] = AttentionSpec(name=name, fn=fn, description=description, **capabilities)
        return fn

    return wrap


def function_module(spec: AttentionSpec) -> nn.Module:
    """``spec.fn`` as a module without parameters: the form in which TorchScript compiles an attention
    module's call of its function (a scripted module cannot hold a plain Python function).

    One class per function, named ``AttentionFunction_<name>`` in this module, so that a pickled model
    (``torch.save(model)``) finds it again and TorchScript compiles each function once.
    """
    class_name = f"AttentionFunction_{spec.name}"
    if class_name not in globals():
        fn = spec.fn

        class AttentionFunction(nn.Module):
            def forward(self, scores: Tensor, values: Tensor, mask: Optional[Tensor], ctx: AttentionContext) -> AttentionOutput:
                return fn(scores, values, mask, ctx)

            def extra_repr(self) -> str:
                return spec.name

        AttentionFunction.__name__ = AttentionFunction.__qualname__ = class_name
        globals()[class_name] = AttentionFunction
    return globals()[class_name]()


def attention_names() -> List[str]:
    return sorted(_REGISTRY)


def get_attention(name: str) -> AttentionSpec:
    if name not in _REGISTRY:
        raise UsageError(
            f"unknown attention function {name!r}; valid choices: {', '.join(attention_names())}"
        )
    return _REGISTRY[name]


def check_hard_train(choice: str) -> str:
    """Validate how hard retrieval picks its key in training."""
    if choice not in HARD_TRAIN_CHOICES:
        raise UsageError(f"--hard-train must be one of {', '.join(HARD_TRAIN_CHOICES)}, got {choice!r}")
    return choice


def check_attn_impl(choice: str) -> str:
    if choice not in ATTN_IMPLS:
        raise UsageError(f"--attn-impl must be one of {', '.join(ATTN_IMPLS)}, got {choice!r}")
    return choice


def check_k(k, option: str = "--attn-k") -> int:
    """Validate a number of attended keys given on the command line."""
    if k is None or int(k) != k or int(k) <= 0:
        raise UsageError(f"{option} must be a positive integer, got {k!r}")
    return int(k)


def check_oow_window(window, k: int, whose: str = "the module's") -> int:
    """Validate the size of Top-k (OOW)'s window (--topk-oow-window): a positive integer, at most k."""
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise UsageError(f"--topk-oow-window must be a positive integer, got {window!r}")
    if window > k:
        raise UsageError(f"--topk-oow-window {window} is more than {whose} k = {k}: Top-k (OOW)'s window is part of "
                         "its k keys")
    return window
