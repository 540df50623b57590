"""alpha-entmax by Newton's method equals the entmax package's bisection (the definition) to float precision,
in its outputs and in the gradients for the scores and for alpha, with a third of its operations."""

import pytest
import torch
from entmax import entmax_bisect

from fairseq_sparse.bench.dispatch_counts import count
from fairseq_sparse.core.attention.entmax_family import entmax_newton


def _rows(kind: str, keys: int, scale: float) -> torch.Tensor:
    generator = torch.Generator().manual_seed(keys)
    if kind == "gaussian":
        return torch.randn(16, keys, generator=generator) * scale
    if kind == "ramp":
        return torch.linspace(0, scale, keys).expand(2, keys).clone()
    rows = torch.randn(4, keys, generator=generator) * 1e-3 * scale  # two near-equal peaks
    rows[:, 0] += scale
    rows[:, -1] += scale
    return rows


# A sample of the grid that chose NEWTON_STEPS (entmax_family.py): the slowest cases to converge among them.
@pytest.mark.parametrize("alpha", [1.01, 1.1, 1.5, 2.0])
@pytest.mark.parametrize("kind,keys,scale", [
    ("gaussian", 2, 1.0), ("gaussian", 64, 100.0), ("gaussian", 4096, 10.0), ("ramp", 4096, 1.0),
    ("ramp", 300, 1000.0), ("peaks", 7, 1000.0), ("peaks", 4096, 1.0), ("gaussian", 300, 0.01),
])
def test_newton_reaches_the_precision_of_the_packages_bisection(alpha, kind, keys, scale):
    scores = _rows(kind, keys, scale)
    exact = entmax_bisect(scores.double(), alpha, dim=-1, n_iter=200)
    bisection_error = (entmax_bisect(scores, alpha, dim=-1) - exact).abs().max().item()
    newton = entmax_newton(scores, torch.tensor(alpha).expand(scores.size(0), 1))
    assert newton.dtype == scores.dtype
    assert (newton - exact).abs().max().item() <= 2 * max(bisection_error, 1e-6)
    assert torch.allclose(newton.sum(dim=-1), torch.ones(scores.size(0)), atol=1e-5)


def test_gradients_for_the_scores_and_alpha_equal_the_packages():
    torch.manual_seed(0)
    scores = torch.randn(3, 4, 5, 19, dtype=torch.float64)
    scores[0, 1, :, :6] = float("-inf")  # masked keys, as the attention function fills them
    alpha = (1.0 + torch.rand(4, dtype=torch.float64)).clamp(1.01, 2.0).view(1, 4, 1, 1).expand(3, 4, 5, 1)
    grad_out = torch.randn(3, 4, 5, 19, dtype=torch.float64)
    results = []
    for mapping in (lambda s, a: entmax_newton(s, a), lambda s, a: entmax_bisect(s, a, dim=-1, n_iter=60)):
        s, a = scores.clone().requires_grad_(), alpha.clone().requires_grad_()
        out = mapping(s, a)
        results.append((out, *torch.autograd.grad((out * grad_out).sum(), (s, a))))
    for got, expected in zip(results[0], results[1]):
        assert torch.allclose(got, expected, atol=1e-9), (got - expected).abs().max()


def test_alpha_two_is_sparsemax_and_leaves_keys_out():
    from entmax import sparsemax
    scores = torch.randn(6, 40) * 3
    got = entmax_newton(scores, torch.full((6, 1), 2.0))
    assert torch.allclose(got, sparsemax(scores, dim=-1), atol=1e-6)
    assert (got == 0).any()


def test_newton_dispatches_a_third_of_the_bisections_operations():
    scores, alpha = torch.randn(8, 4, 1, 30), torch.full((8, 4, 1, 1), 1.3)
    newton = count(lambda: entmax_newton(scores, alpha)).operations
    bisection = count(lambda: entmax_bisect(scores, alpha, dim=-1)).operations
    assert newton <= bisection / 3, (newton, bisection)
