"""ReLA Table 4: the FLOPs formulas of softmax attention and ReLA-g against a counted forward (fairseq_sparse.bench.flops).

Counts are integers and the convention is exact, so the tolerance is zero: the ops the
paper counts add up to its formula exactly, and what the implementation does beyond
them is asserted to be exactly the documented gap (softmax: the row-maximum shift,
2HT^2 - HT; ReLA-g: RMSNorm's eps add, T; its null-row guard runs in training only).
"""

import pytest
import torch

from fairseq_sparse.bench import flops

SIZES = [(1, 1, 4), (2, 3, 8), (4, 7, 16), (8, 20, 64), (8, 33, 512)]  # (H, T, d)


@pytest.mark.parametrize("H,T,d", SIZES)
def test_softmax_counted_equals_formula_plus_max_shift(H, T, d):
    counted = flops.count_softmax(H, T, d)
    assert counted.paper_terms == flops.softmax_flops_formula(H, T) == 3 * H * T**2 - H * T
    assert counted.not_in_paper == 2 * H * T**2 - H * T  # amax (T - 1 per row) + subtract (T per row)
    ops = counted.per_op
    assert (ops["exp"], ops["div"], ops["sum"]) == (H * T * T, H * T * T, H * T * (T - 1))
    assert counted.value_product == H * (2 * T * T * (d // H) - T * (d // H))


@pytest.mark.parametrize("H,T,d", SIZES)
def test_rela_g_counted_equals_formula_plus_eps(H, T, d):
    counted = flops.count_rela_g(H, T, d)
    assert counted.paper_terms == flops.rela_g_flops_formula(H, T, d) == H * T**2 + 10 * T * d + T
    assert counted.not_in_paper == T  # the eps add, one per token (the null-row guard runs in training only)
    ops = counted.per_op
    assert ops["relu"] == H * T * T
    assert (ops["pow"], ops["mean"], ops["rsqrt"], ops["add"]) == (T * d, T * d, T, T)
    assert (ops["mul"], ops["sigmoid"]) == (4 * T * d, 4 * T * d)
    assert counted.value_product == flops.count_softmax(H, T, d).value_product  # the same product in both


def test_paper_figures():
    """Table 4's formulas reproduce the numbers the paper quotes for H = 8, d = 512."""
    assert round(flops.softmax_flops_formula(8, 100), -3) == 239_000
    assert round(flops.rela_g_flops_formula(8, 100, 512), -3) == 592_000
    assert round(flops.softmax_flops_formula(8, 1000), -4) == 23_990_000
    assert round(flops.rela_g_flops_formula(8, 1000, 512), -4) == 13_120_000


def test_doubling_T_quadruples_the_quadratic_term():
    H, T, d = 4, 12, 32
    relu = [flops.count_rela_g(H, t, d).per_op["relu"] for t in (T, 2 * T)]
    assert relu[1] == 4 * relu[0] > 0
    soft = [flops.count_softmax(H, t, d).paper_terms for t in (T, 2 * T)]
    # c(T) = aT^2 + bT: c(2T) - 2c(T) = 2aT^2, and a = 3H
    assert soft[1] - 2 * soft[0] == 2 * 3 * H * T**2
    # the linear part of ReLA-g doubles with T at fixed d
    linear = [flops.count_rela_g(H, t, d).paper_terms - H * t * t for t in (T, 2 * T)]
    assert linear[1] == 2 * linear[0] == 2 * (10 * T * d + T)


def test_counter_counts_a_matmul_and_refuses_unknown_ops():
    a, b = torch.randn(3, 5), torch.randn(5, 7)
    with flops.FlopCounter() as counter:
        a @ b
    assert counter.total == 2 * 3 * 7 * 5 - 3 * 7
    with pytest.raises(NotImplementedError, match="no rule"):
        with flops.FlopCounter():
            torch.cumsum(a, dim=0)


def test_script_prints_the_table(capsys):
    flops.main(["--heads", "2", "--dim", "8", "--lengths", "3", "6"])
    text = capsys.readouterr().out
    # T = 3: softmax formula 48 = paper's ops; all ops 78 (+ 2HT^2 - HT); ReLA-g formula 2*9 + 10*3*8 + 3 = 261, all 264 (+ T)
    assert "| 3 | 48 | 48 | 78 | 261 | 261 | 264 |" in text and "| 6 |" in text
