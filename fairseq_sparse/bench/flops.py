#!/usr/bin/env python
"""FLOPs of softmax attention (SMAtt) and ReLA-g, ReLA Table 4: the paper's formulas vs a counted forward.

The paper (Zhang et al., 2021, Table 4) gives, for one attention sublayer with H heads,
sequence length T (T queries, T keys) and model width d:

    softmax (SMAtt)   3HT^2 - HT         (softmax over H x T rows of T scores)
    ReLA-g            HT^2 + 10Td + T    (ReLU of the scores, then the gated RMSNorm over T x d)

So Table 4 counts what maps scores to attention weights (plus ReLA-g's normalisation of
the concatenated head outputs); the dot products q.k and the weights x values products
are the same in both models and are not in it. Its own figures: H = 8, d = 512,
T = 100: 239K vs 592K; T = 1000: 23.99M vs 13.12M.

The counted forward runs the registered functions (``fairseq_sparse.core.attention``:
``softmax``, ``rela_g``, and for ``rela_g`` the gated RMSNorm module the registry builds)
on scores (1, H, T, T) and values (1, H, T, d/H), as ``SparseMultiheadAttention`` calls
them, under a ``TorchDispatchMode`` that sees every aten op and counts FLOPs with this
convention (it reproduces every term of the paper's formulas):

* elementwise ops (add, sub, mul, div, exp, neg, pow, rsqrt, relu, ...): one FLOP per
  output element; sigmoid four (1 / (1 + exp(-x)): negate, exp, add, divide, the
  decomposition of ``torch._refs.sigmoid``);
* reductions sum / amax / amin over n elements: n - 1 per output element (adding T numbers
  is T - 1 additions, the paper's "- HT"); mean: n (n - 1 additions and a division);
* matmul (m x k)(k x n): m n k multiplications + m n (k - 1) additions = 2mnk - mn,
  the same convention (not in Table 4; reported separately);
* ``_softmax`` is counted through PyTorch's own decomposition (``torch._decomp``):
  amax, subtract, exp, sum, divide;
* views, copies and dtype conversions: 0; any other op raises, so nothing is missed
  silently.

What agrees and what does not (exactly, in integers; the test asserts both):

* softmax: exp + sum + divide = 3HT^2 - HT, the formula exactly. The implementation also
  subtracts the row maximum first (numerical stability, not in the paper's count): amax
  H T (T - 1) + subtract HT^2, so the full count is the formula + 2HT^2 - HT.
* ReLA-g: ReLU HT^2 + RMSNorm 10Td + 2T, the formula + T: the paper has one op per token
  besides the 10 per element (the square root), the implementation two (it adds eps before
  the reciprocal square root).

    python -m fairseq_sparse.bench.flops [--heads 8 --dim 512 --lengths 10 50 100 500 1000] [--device cuda]
"""

import argparse
from collections import Counter
from dataclasses import dataclass
from math import prod
from typing import Dict, Sequence

import torch
from torch._decomp import decomposition_table
from torch.utils._python_dispatch import TorchDispatchMode

import fairseq_sparse  # noqa: F401  (registers the attention functions)
from fairseq_sparse.core.attention import AttentionContext, get_attention

aten = torch.ops.aten


# ---- the paper's formulas (Table 4) ---------------------------------------------------------

def softmax_flops_formula(H: int, T: int) -> int:
    """SMAtt: 3HT^2 - HT."""
    return 3 * H * T**2 - H * T


def rela_g_flops_formula(H: int, T: int, d: int) -> int:
    """ReLA-g: HT^2 + 10Td + T."""
    return H * T**2 + 10 * T * d + T


# ---- the counter ---------------------------------------------------------------------------

ELEMENTWISE = {  # FLOPs per output element
    "add": 1, "sub": 1, "rsub": 1, "mul": 1, "div": 1, "neg": 1, "exp": 1, "log": 1, "pow": 1, "sqrt": 1,
    "rsqrt": 1, "reciprocal": 1, "relu": 1, "gelu": 1, "leaky_relu": 1, "clamp": 1, "clamp_min": 1,
    "where": 1, "masked_fill": 1, "maximum": 1, "minimum": 1, "sigmoid": 4, "eq": 1,
}
REDUCTION = {"sum": -1, "amax": -1, "amin": -1, "mean": 0}  # FLOPs per output element: n + this
MATMUL = {"mm", "bmm"}
FREE = {  # data movement, shape and dtype bookkeeping: 0 FLOPs
    "view", "_unsafe_view", "reshape", "expand", "permute", "transpose", "t", "unsqueeze", "squeeze", "clone",
    "contiguous", "_to_copy", "to", "copy_", "detach", "alias", "slice", "select", "empty", "empty_like",
    "zeros", "zeros_like", "new_zeros", "lift_fresh", "_reshape_alias", "as_strided",
}
DECOMPOSED = {aten._softmax.default}  # counted as the ops of PyTorch's own decomposition


def _numel(shape) -> int:
    return prod(shape) if len(shape) else 1


class FlopCounter(TorchDispatchMode):
    """Counts FLOPs per aten op (by overload packet name) with the module's convention.

    ``counts`` maps an op name ("exp", "sum", "bmm", ...) to its FLOPs. Unknown ops raise
    NotImplementedError.
    """

    def __init__(self):
        super().__init__()
        self.counts: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in DECOMPOSED:
            with self:  # the decomposition's ops come through this mode again
                return decomposition_table[func](*args, **kwargs)
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__.rstrip("_")  # in-place variants count as their op
        if name in FREE:
            return out
        if name in ELEMENTWISE:
            self.counts[name] += ELEMENTWISE[name] * out.numel()
        elif name in REDUCTION:
            n = args[0].numel() // max(out.numel(), 1)
            self.counts[name] += (n + REDUCTION[name]) * out.numel()
        elif name in MATMUL:
            a, b = args[0], args[1]
            m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
            batch = _numel(a.shape[:-2])
            self.counts[name] += batch * (2 * m * n * k - m * n)
        else:
            raise NotImplementedError(f"FlopCounter has no rule for {func}")
        return out

    @property
    def total(self) -> int:
        return sum(self.counts.values())


# ---- the counted forwards ------------------------------------------------------------------

@dataclass
class Counted:
    """FLOPs of one counted forward, split as Table 4 splits them."""

    per_op: Dict[str, int]
    paper_terms: int  # the ops the paper's formula counts
    not_in_paper: int  # ops the implementation does that the paper's formula leaves out
    value_product: int  # weights x values (the same in both models; not in Table 4)

    @property
    def total(self) -> int:
        return self.paper_terms + self.not_in_paper + self.value_product


def _inputs(H: int, T: int, d: int, device: str, seed: int = 0):
    if d % H:
        raise ValueError(f"d ({d}) must be a multiple of H ({H})")
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(1, H, T, T, generator=gen).to(device)
    values = torch.randn(1, H, T, d // H, generator=gen).to(device)
    return scores, values


def count_softmax(H: int, T: int, d: int, device: str = "cpu") -> Counted:
    """The registered ``softmax`` function on (1, H, T, T) scores, no mask."""
    scores, values = _inputs(H, T, d, device)
    spec = get_attention("softmax")
    with torch.no_grad(), FlopCounter() as counter:
        spec.fn(scores, values, None, AttentionContext(need_weights=False))
    c = counter.counts
    return Counted(dict(c), paper_terms=c["exp"] + c["sum"] + c["div"], not_in_paper=c["amax"] + c["sub"],
                   value_product=c["bmm"] + c["mm"])


def count_rela_g(H: int, T: int, d: int, device: str = "cpu") -> Counted:
    """The registered ``rela_g`` function, then its gated RMSNorm over the concatenated heads (T, 1, d)."""
    scores, values = _inputs(H, T, d, device)
    spec = get_attention("rela_g")
    torch.manual_seed(0)
    norm = spec.build_output_norm(d, d // H).to(device)
    with torch.no_grad(), FlopCounter() as counter:
        out, _ = spec.fn(scores, values, None, AttentionContext(need_weights=False))
        norm(out.permute(2, 0, 1, 3).reshape(T, 1, d))  # as SparseMultiheadAttention does
    c = counter.counts
    value_product = c["bmm"] + c["mm"]
    eps = c["add"]  # the only add: RMSNorm's mean(x^2) + eps, one per token
    # RMSNorm's guard of all-zero (null) rows, whose gradient would overflow float16: one comparison
    # and one fill per token where a gradient is recorded (training), none in this no-grad forward
    guard = c["eq"] + c["masked_fill"]
    return Counted(dict(c), paper_terms=counter.total - value_product - eps - guard, not_in_paper=eps + guard,
                   value_product=value_product)


# ---- the table -----------------------------------------------------------------------------

def table(H: int, d: int, lengths: Sequence[int], device: str = "cpu") -> str:
    lines = [
        f"ReLA Table 4: FLOPs of one attention sublayer, H = {H}, d = {d}, device {device}; "
        "counted = the registered function's forward under FlopCounter",
        "",
        "| T | softmax formula | softmax counted: paper's ops | softmax counted: all | "
        "ReLA-g formula | ReLA-g counted: paper's ops | ReLA-g counted: all | weights x values (both, not in Table 4) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for T in lengths:
        soft, rela = count_softmax(H, T, d, device), count_rela_g(H, T, d, device)
        lines.append(
            f"| {T} | {softmax_flops_formula(H, T):,} | {soft.paper_terms:,} | {soft.paper_terms + soft.not_in_paper:,} | "
            f"{rela_g_flops_formula(H, T, d):,} | {rela.paper_terms:,} | {rela.paper_terms + rela.not_in_paper:,} | "
            f"{soft.value_product:,} |"
        )
    T = lengths[0]
    per_op = lambda counted: ", ".join(f"{op} {n:,}" for op, n in sorted(counted.per_op.items()) if n)  # noqa: E731
    lines += [
        "",
        "softmax: paper's ops = exp + sum + divide; all adds the row-maximum shift (amax + subtract) = 2HT^2 - HT.",
        "ReLA-g: paper's ops = ReLU + gated RMSNorm without its eps add; all = + T (mean(x^2) + eps, one add per token; "
        "in training the null-row guard adds one comparison and one fill per token).",
        f"per op at T = {T}: softmax: {per_op(count_softmax(H, T, d, device))}",
        f"per op at T = {T}: ReLA-g: {per_op(count_rela_g(H, T, d, device))}",
        "The paper's figures for H = 8, d = 512: T = 100: 239K (softmax) vs 592K (ReLA-g); T = 1000: 23.99M vs 13.12M.",
    ]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", type=int, default=8, help="H (default: Transformer base)")
    parser.add_argument("--dim", type=int, default=512, help="d, the model width (default: Transformer base)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[10, 50, 100, 500, 1000], help="values of T")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device")
    print(table(args.heads, args.dim, args.lengths, args.device))


if __name__ == "__main__":
    main()
