"""sparsemax's backward pass without a host read equals the entmax package's, values and gradients."""

import entmax
import pytest
import torch

from fairseq_sparse.bench.dispatch_counts import count
from fairseq_sparse.core.attention.entmax_family import sparsemax


@pytest.mark.parametrize("masked", [False, True], ids=["plain", "masked"])
def test_sparsemax_equals_the_package(masked):
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 4, 6, 20, generator=gen) * 3
    if masked:  # masked keys reach the mapping as -inf (entmax_family._entmax_family)
        scores[..., 15:] = float("-inf")
    upstream = torch.randn(scores.shape, generator=gen)
    results = []
    for mapping in (entmax.sparsemax, lambda x, dim: sparsemax(x, dim)):
        x = scores.clone().requires_grad_(True)
        out = mapping(x, dim=-1)
        out.backward(upstream)
        results.append((out.detach(), x.grad))
    (out, grad), (expected_out, expected_grad) = results
    assert torch.equal(out, expected_out)
    assert (grad - expected_grad).abs().max() <= 1e-6
    assert (out == 0).any() and (grad == 0).any(), "the support must leave some keys out for the test to mean anything"


def test_sparsemax_backward_reads_nothing_on_the_host():
    x = torch.randn(4, 30, requires_grad=True)
    out = entmax.sparsemax(x, dim=-1)
    assert count(lambda: out.backward(torch.ones_like(out))).synchronisations, "the package's backward should read"
    x.grad = None
    out = sparsemax(x, -1)
    assert not count(lambda: out.backward(torch.ones_like(out))).synchronisations
