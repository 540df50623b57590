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
