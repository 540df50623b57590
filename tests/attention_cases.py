"""One row per registered attention function: what the shared tests may expect of it.

A new function is tested by adding its row here (test_registry fails until it is). A setting of a
function beyond k (Top-k (OOW)'s window) is a row of ``SETTINGS``, keyed "FUNCTION:setting", which the
tests of the paths that compute a function's keys take with the functions' rows (``ROWS``).
"""

from dataclasses import dataclass
from typing import Optional


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
    # Top-k (OOW)'s window (--topk-oow-window; the module's oow_window), None: its default of ceil(k/2)
    oow_window: Optional[int] = None


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
# k = 4, a window of 3 and 1 pick, where the default splits 4 as 2 + 2 (the runs' 12 as 8 + 4, scaled down)
SETTINGS = {"topk_oow:window": Case(k=4, self_only=True, oow_window=3)}
ROWS = NAMES + sorted(SETTINGS)


def case_of(row: str) -> Case:
    return CASES[row] if row in CASES else SETTINGS[row]


def function_of(row: str) -> str:
    return row.split(":")[0]


def module_options(row: str, k: Optional[int] = None) -> dict:
    """SparseMultiheadAttention's attn_fn, attn_k and settings of a row; ``k``: another k, with as many of Top-k
    (OOW)'s picks as the row has (its window k minus them, at least 1)."""
    case = case_of(row)
    k = case.k if k is None else k
    window = {} if case.oow_window is None else {"oow_window": max(1, k - (case.k - case.oow_window))}
    return {"attn_fn": function_of(row), "attn_k": k, **window}


def model_options(row: str, *sublayers: str) -> dict:
    """build_model's options putting a row's function, k and settings in ``sublayers``."""
    case = case_of(row)
    window = {} if case.oow_window is None else {"topk_oow_window": case.oow_window}
    return {**{f"{sublayer}_attn_fn": function_of(row) for sublayer in sublayers}, "attn_k": case.k, **window}

