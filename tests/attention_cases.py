"""One row per registered attention function: what the shared tests may expect of it.

A new function is tested by adding its row here (test_registry fails until it is).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    k: int = 3
    # Smooth enough for torch.autograd.gradcheck on random inputs (hard is checked
    # against the paper's straight-through equations instead).
    gradcheck: bool = True
    # Weights may be all zero for a query whose scores are all negative (ReLA).
    null_attention: bool = False
    # Has an output norm (ReLA family) applied after the heads are concatenated.
    output_norm: bool = False
    # Forward pass is deterministic in training mode (hard samples).
    deterministic_training: bool = True
    # Defined for self-attention only (structured patterns): not placed in cross-attention.
    self_only: bool = False


CASES = {
    "softmax": Case(),
    "topk": Case(),
    "sparsemax": Case(),
    "entmax15": Case(),
    "entmax_alpha": Case(),
    "hard": Case(gradcheck=False, deterministic_training=False),
    "rela_g": Case(null_attention=True, output_norm=True),
    "rela_i": Case(null_attention=True, output_norm=True),
    "relu": Case(null_attention=True),
    "relu_rmsnorm": Case(null_attention=True, output_norm=True),
    "rela_g_layernorm": Case(null_attention=True, output_norm=True),
    "rela_g_gelu": Case(output_norm=True),
    "rela_g_leaky_relu": Case(output_norm=True),
    # Structured patterns (fairseq_sparse/core/attention/structured.py); k=3 leaves some keys out.
    "block": Case(self_only=True),
    "window": Case(self_only=True),
    "dilated": Case(self_only=True),
    "global": Case(self_only=True),
    "random": Case(),
    "bigbird": Case(k=4, self_only=True),  # k=4: one global, a window of two, one random
    "topk_oow": Case(self_only=True),
}

NAMES = sorted(CASES)
