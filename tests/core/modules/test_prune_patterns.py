"""Rule-based pruning patterns (L0Drop section 7) and the POS table builder."""

from pathlib import Path

import pytest
import torch
from fairseq.data import Dictionary
from fairseq.sequence_generator import SequenceGenerator

from fairseq_sparse.core.modules.prune_patterns import RulePatternGate, frequent_types, rare_types
from helpers import TINY_TRAIN, TinyTask, build_model, random_batch, run_in_process, tiny_bitext

ROOT = Path(__file__).resolve().parents[3]


def counted_dictionary(counts):
    d = Dictionary()
    for word, count in counts.items():
        d.add_symbol(word, n=count)
    return d


def encode(d, sentences):
    """Left-padded (B, T) token ids."""
    width = max(len(s) for s in sentences)
    return torch.tensor([[d.pad()] * (width - len(s)) + [d.index(w) for w in s] for s in sentences])


def test_group_keeps_every_other_real_token_regardless_of_padding():
    d = counted_dictionary({w: 1 for w in "a b c d e".split()})
    tokens = encode(d, [["a", "b", "c", "d", "e"], ["a", "b", "c"]])
    gate = RulePatternGate("group", d)
    pruned = gate.pruned(tokens, tokens.eq(d.pad()))
    assert pruned.tolist() == [[False, True, False, True, False], [False, False, False, True, False]]


def test_freq_and_inv_freq_tables():
    d = counted_dictionary({"the": 50, "of": 30, "house": 10, "dog": 6, "ark": 3, "zion": 1})
    assert [d[i] for i in frequent_types(d, top=2).nonzero().flatten()] == ["the", "of"]
    # total 100 tokens: zion (1) + ark (3) + dog (6) + house (10) = 20% ... + of (30) = 50% > 40%
    assert sorted(d[i] for i in rare_types(d, share=0.4).nonzero().flatten()) == ["ark", "dog", "house", "zion"]
    assert not frequent_types(d)[: d.nspecial].any() and not rare_types(d)[: d.nspecial].any()


def test_pos_pattern_prunes_table_words_and_subword_continuations(tmp_path):
    d = counted_dictionary({w: 1 for w in ["the", "Haus@@", "es", "dog", ".", "über@@", "all"]})
    table = tmp_path / "pos.txt"
    table.write_text("the\n.\nunknown-word\n")
    gate = RulePatternGate("pos", d, str(table))
    tokens = encode(d, [["the", "Haus@@", "es", "dog", "."], ["über@@", "all"]])
    pruned = gate.pruned(tokens, tokens.eq(d.pad()))
    # word-initial pieces (Haus@@, über@@) stay; continuations (es, all) and table words go
    assert pruned.tolist() == [[True, False, True, False, True], [False, False, False, False, True]]


def test_pos_pattern_needs_its_table(tmp_path):
    d = counted_dictionary({"a": 1})
    with pytest.raises(ValueError, match="needs --encoder-prune-pos-table"):
        RulePatternGate("pos", d)
    with pytest.raises(FileNotFoundError, match="no such file.*pos_prune_table"):
        RulePatternGate("pos", d, str(tmp_path / "missing.txt"))


def test_pattern_and_learned_gates_are_exclusive():
    with pytest.raises(ValueError, match="use it without --l0drop"):
        build_model(l0drop=True, encoder_prune_pattern="group")


@pytest.mark.parametrize("pattern", ["group", "freq", "inv_freq"])
@pytest.mark.parametrize("beam", [1, 4])
def test_patterns_decode_identically_compressed_and_uncompressed(pattern, beam):
    model = build_model(encoder_prune_pattern=pattern).eval()
    batch = random_batch(lengths=[7, 5, 9, 4], tgt_lengths=[2] * 4, seed=5)
    closed = model.encoder(batch["src_tokens"], src_lengths=batch["src_lengths"])["l0drop_closed"][0]
    if pattern == "group":
        assert closed.sum() == sum(n // 2 for n in [7, 5, 9, 4])
    results = []
    for compress in (True, False):
        model.encoder.compress = compress
        generator = SequenceGenerator([model], TinyTask().target_dictionary, beam_size=beam, max_len_b=8)
        with torch.no_grad():
            results.append(generator.generate([model], {"net_input": {k: batch[k] for k in ("src_tokens", "src_lengths")}}))
    for hyps_c, hyps_u in zip(*results):
        for hc, hu in zip(hyps_c, hyps_u):
            assert torch.equal(hc["tokens"], hu["tokens"]) and abs(hc["score"] - hu["score"]) <= 1e-5


def test_pos_checkpoint_decodes_without_its_table_file(tmp_path):
    """The table is a buffer of the checkpoint: decoding takes it from there, not from the training path."""
    from fairseq import checkpoint_utils

    data = tiny_bitext(tmp_path)
    table = tmp_path / "pos_table.en"
    table.write_text("the\na\n.\n")
    run_in_process("fairseq-train", data, "--user-dir", ROOT / "fairseq_sparse", *TINY_TRAIN, "--save-dir", tmp_path / "ckpt",
                   "--encoder-prune-pattern", "pos", "--encoder-prune-pos-table", table)
    table.unlink()  # before: FileNotFoundError: --encoder-prune-pos-table: no such file
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(tmp_path / "ckpt" / "checkpoint_last.pt")], arg_overrides={"data": str(data)})
    model, d = models[0].eval(), task.source_dictionary
    assert {d[i] for i in model.encoder.l0drop_gate.prunable_types.nonzero().flatten()} == {"the", "a", "."}
    task.load_dataset("test")
    sample = task.dataset("test").collater([task.dataset("test")[i] for i in range(3)])
    closed = model.encoder(**{k: sample["net_input"][k] for k in ("src_tokens", "src_lengths")})["l0drop_closed"][0]
    tokens = sample["net_input"]["src_tokens"]
    assert closed[tokens == d.index("the")].all() and closed.any(dim=1).all()
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=2, max_len_b=5)
    with torch.no_grad():
        hypotheses = generator.generate([model], sample)
    assert len(hypotheses) == 3 and all(len(h[0]["tokens"]) > 0 for h in hypotheses)
