"""What the attention paths (``fused_softmax``, ``function_in_chunks``, ``flex_patterns``) read of the module that runs them.

``SparseMultiheadAttention`` implements it; it is declared apart so that the paths need not import the
module, which imports them."""

from typing import Protocol

from ..attention import AttentionSpec


class AttentionSettings(Protocol):
    spec: AttentionSpec  # the registered method
    scaling: float  # 1 / sqrt(head dimension), applied to the queries
    impl: str  # --attn-impl: how the method is computed (ATTN_IMPLS)

    def attention_dropout_p(self) -> float:
        """The dropout on attention weights in this mode (0 in evaluation)."""
        ...
