"""The window of Top-k (OOW) that the mass measurement uses is topk_oow's own, the shares add up, and its
CSV holds models with and without a given window."""

import csv
from pathlib import Path

import pytest
import torch

from fairseq_sparse.analysis.oow_mass import main, mass_shares, window_keys
from fairseq_sparse.core.attention.registry import AttentionContext
from fairseq_sparse.core.attention.structured import topk_oow_selection
from helpers import TINY_TRAIN, run_in_process, tiny_bitext

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("window, size", [(None, 4), (6, 6), (1, 1)], ids=["default", "window 6", "window 1"])
def test_the_window_is_the_one_topk_oow_takes_before_its_picks(window, size):
    """k = 8: a window of ceil(8/2) = 4 and 4 picks, or of --topk-oow-window's size and the rest of 8 as picks."""
    torch.manual_seed(0)
    for causal in (False, True):
        valid = torch.ones(1, 9, 9, dtype=torch.bool)
        if causal:
            valid = valid & torch.ones(9, 9, dtype=torch.bool).tril()
        in_window = window_keys(valid, 8, window)
        assert (in_window.sum(-1) == valid.sum(-1).clamp(max=size)).all()
        # with scores that rank every key outside the window below it, topk_oow keeps exactly window + the picks
        scores = torch.randn(1, 1, 9, 9).masked_fill(in_window.unsqueeze(1), 1e6)
        ctx = AttentionContext(k=8, self_attention=True, oow_window=window)
        hidden = topk_oow_selection(scores, ~valid.unsqueeze(1), ctx)
        assert (in_window.unsqueeze(1) & hidden).sum() == 0  # the window is always selected
        assert ((~hidden & valid.unsqueeze(1)).sum(-1) == valid.sum(-1).clamp(max=8)).all()
        # and a window of another size is not topk_oow's: some of its keys are left out or it misses some
        other = window_keys(valid, 8, 5 if size != 5 else 3)
        scores = torch.randn(1, 1, 9, 9).masked_fill(other.unsqueeze(1), 1e6)
        assert not ((~topk_oow_selection(scores, ~valid.unsqueeze(1), ctx) & valid.unsqueeze(1)) == other).all()
    assert window_keys(torch.ones(1, 6, 6, dtype=torch.bool), 8)[0, 2].tolist() == [True, True, True, True, False, False]
    assert window_keys(torch.ones(1, 6, 6, dtype=torch.bool), 8, 2)[0, 2].tolist() == [False, True, True, False, False, False]


@pytest.mark.parametrize("window, counted", [(None, 6), (5, 6), (6, 0)])
def test_mass_shares_count_queries_with_picks_and_split_their_mass(window, counted):
    """Six keys: every query has picks beyond a window of 4 or 5, none beyond a window of 6."""
    valid = torch.ones(1, 6, 6, dtype=torch.bool)
    weights = torch.zeros(2, 1, 6, 6)
    in_window = window_keys(valid, 8, window)
    weights[0] = in_window.float() / in_window.sum(-1, keepdim=True)  # head 0: all mass on the window
    weights[1] = (~in_window).float() / (~in_window).sum(-1, keepdim=True).clamp(min=1)  # head 1: all on the picks
    share, n = mass_shares(weights, valid, 8, window)
    assert n.tolist() == [counted, counted]
    if counted:
        assert torch.allclose(share / n, torch.tensor([1.0, 0.0]))


def test_plain_topk_layers_are_measured_and_other_functions_are_not(monkeypatch):
    """Sentence-level top-k is measured as Top-k (OOW) is (mass on the ceil(k/2) nearest keys, the rest beyond);
    a softmax layer beside it gives no row."""
    from fairseq_sparse.analysis import oow_mass
    from fairseq_sparse.analysis.collect import BatchAttention

    valid = torch.ones(1, 6, 6, dtype=torch.bool)
    near = window_keys(valid, 8)
    on_window = near.float() / near.sum(-1, keepdim=True)  # every head's mass on the 4 nearest keys
    beyond = (~near).float() / (~near).sum(-1, keepdim=True)  # every head's mass beyond them
    weights = torch.stack([on_window.expand(2, 1, 6, 6), beyond.expand(2, 1, 6, 6), on_window.expand(2, 1, 6, 6)])
    batch = BatchAttention(weights={"encoder": weights}, valid={"encoder": valid},
                           attn_fn={"encoder": ["topk", "topk_oow", "softmax"]}, ids=None, src_tokens=None,
                           target=None, prev=None)
    monkeypatch.setattr(oow_mass, "batches", lambda *args, **kwargs: [batch])
    rows = oow_mass.measure(None, None, "valid", 8, None)
    assert [(row["layer"], row["window_share"]) for row in rows] == [(0, 1.0), (1, 0.0)]



def test_models_with_and_without_a_given_window_append_to_one_csv(tmp_path):
    """The CSV names each row's window size (the default ceil(k/2) too): a model given --topk-oow-window
    appends to the same file as one without, and a CSV of other columns is refused, not rewritten."""
    tiny_bitext(tmp_path)
    attention = ["--encoder-attn-fn", "topk_oow", "--decoder-attn-fn", "topk_oow", "--attn-k", "4"]
    for name, window in (("default", []), ("given", ["--topk-oow-window", "1"])):
        run_in_process("fairseq-train", tmp_path / "bin", "--user-dir", ROOT / "fairseq_sparse", *TINY_TRAIN,
                       *attention, *window, "--save-dir", tmp_path / name)
    out = tmp_path / "mass.csv"
    for name in ("default", "given"):
        assert main([str(tmp_path / "bin"), "--path", str(tmp_path / name / "checkpoint_last.pt"), "--label", name,
                     "--out", str(out)]) == 0
    with open(out, encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert {(r["label"], r["k"], r["window"]) for r in rows} == {("default", "4", "2"), ("given", "4", "1")}
    assert all(abs(float(r["window_share"]) + float(r["picks_share"]) - 1) < 1e-3 for r in rows)
    older = tmp_path / "older.csv"
    older.write_text("label,split,k,sublayer,layer,queries,window_share,picks_share,window_share_per_head\n", encoding="utf-8")
    assert main([str(tmp_path / "bin"), "--path", str(tmp_path / "given" / "checkpoint_last.pt"), "--out", str(older)]) == 1
    assert older.read_text(encoding="utf-8").count("\n") == 1
