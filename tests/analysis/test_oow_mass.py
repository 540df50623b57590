"""The window of Top-k (OOW) that the mass measurement uses is topk_oow's own, and the shares add up."""

import torch

from fairseq_sparse.analysis.oow_mass import mass_shares, window_keys
from fairseq_sparse.core.attention.registry import AttentionContext
from fairseq_sparse.core.attention.structured import topk_oow_selection


def test_the_window_is_the_one_topk_oow_takes_before_its_picks():
    torch.manual_seed(0)
    for causal in (False, True):
        valid = torch.ones(1, 9, 9, dtype=torch.bool)
        if causal:
            valid = valid & torch.ones(9, 9, dtype=torch.bool).tril()
        window = window_keys(valid, 8)
        # with scores that rank every key outside the window below it, topk_oow keeps exactly window + 4 picks
        scores = torch.randn(1, 1, 9, 9).masked_fill(window.unsqueeze(1), 1e6)
        hidden = topk_oow_selection(scores, ~valid.unsqueeze(1), AttentionContext(k=8, self_attention=True))
        assert (window.unsqueeze(1) & hidden).sum() == 0  # the window is always selected
        assert ((~hidden & valid.unsqueeze(1)).sum(-1) == valid.sum(-1).clamp(max=8)).all()
    assert window_keys(torch.ones(1, 6, 6, dtype=torch.bool), 8)[0, 2].tolist() == [True, True, True, True, False, False]


def test_mass_shares_count_queries_with_picks_and_split_their_mass():
    valid = torch.ones(1, 6, 6, dtype=torch.bool)
    weights = torch.zeros(2, 1, 6, 6)
    window = window_keys(valid, 8)
    weights[0] = window.float() * 0.25 / 1  # head 0: all mass on the window
    weights[1] = (~window).float() / (~window).sum(-1, keepdim=True)  # head 1: all on the picks
    share, n = mass_shares(weights, valid, 8)
    assert n.tolist() == [6, 6] and torch.allclose(share / n, torch.tensor([1.0, 0.0]))
