"""The POS pruning pattern's word-type table, built with the offline HanTa tagger."""

import pytest

from fairseq_sparse.data import pos_prune_table


@pytest.mark.parametrize("lang,text,pruned,kept", [
    ("en", "The man has seen the dog , and he must go to the city .", {"The", "the", ",", "and", "must", "to", "."}, {"man", "dog", "city", "seen"}),
    ("de", "Der Mann hat den Hund gesehen , und er muss in die Stadt gehen .", {"Der", "den", "die", ",", "und", "muss", "in", "."}, {"Mann", "Hund", "Stadt", "gehen"}),
])
def test_pos_table_builder_with_the_offline_tagger(lang, text, pruned, kept, tmp_path):
    source = tmp_path / "train.tok"
    source.write_text(text + "\n")
    words = set(pos_prune_table.main([str(source), "--lang", lang, "--out", str(tmp_path / "table")]))
    assert pruned <= words and not (kept & words)
    assert set((tmp_path / "table").read_text().split()) == words


def test_undecodable_text_is_one_error_naming_the_line(tmp_path, capsys):
    source = tmp_path / "train.tok"
    source.write_bytes("Der Mann .\n".encode() + b"caf\xe9 .\n")
    with pytest.raises(SystemExit) as stop:
        pos_prune_table.main([str(source), "--lang", "de", "--out", str(tmp_path / "table")])
    assert str(stop.value) == f"pos_prune_table: error: {source}, line 2: not UTF-8 (invalid continuation byte at byte 3)"
    assert not (tmp_path / "table").exists()


def test_bpe_text_is_tagged_as_the_words_its_pieces_spell(tmp_path):
    """The table built from the BPE text fairseq reads (every prepared dataset keeps it) equals the one
    built from the tokenised text it was segmented from."""
    words = "The man has seen the dog , and he must go to the city ."
    pieces = "The man has se@@ en the d@@ og , and he mu@@ st go to the ci@@ ty ."
    (tmp_path / "train.tok").write_text(words + "\n")
    (tmp_path / "train.bpe").write_text(pieces + "\n")
    from_words = pos_prune_table.main([str(tmp_path / "train.tok"), "--lang", "en", "--out", str(tmp_path / "a")])
    from_pieces = pos_prune_table.main([str(tmp_path / "train.bpe"), "--bpe", "--lang", "en", "--out", str(tmp_path / "b")])
    assert from_pieces == from_words and "must" in from_pieces


def test_a_row_points_at_its_datasets_table_with_data(tmp_path):
    """l0drop_table2's POS row trains with the table its dataset's preparation writes."""
    from fairseq_sparse import tables

    table = tables.load_table(tables.CONFIGS / "tables" / "l0drop_table2.yaml", "paper")
    plan = tables.Plan(table, tmp_path / "out", tmp_path / "data", None)
    ds = table.datasets["wmt14_en_de"]
    made = plan.prep_steps(ds)[-1].argv
    argv = plan.train_argv(ds, table.row("pos"), 1)
    table_path = argv[argv.index("--encoder-prune-pos-table") + 1]
    assert table_path == str(tmp_path / "data" / "paper" / "wmt14_en_de" / "pos-table.en") == made[made.index("--out") + 1]
    assert "{data}" in " ".join(map(plan.portable, argv))  # the model's name does not depend on where data is
