"""The test set cut into groups of equal size by source length (ReLA Figure 2): every sentence in exactly one
group, groups ordered by length, binarised with the dataset's own dictionaries, and bad input one line."""

from pathlib import Path

import pytest
from fairseq.data import Dictionary, data_utils

from helpers import tiny_bitext
from fairseq_sparse.data import binarise, length_groups


@pytest.fixture
def prepared(tmp_path, monkeypatch):
    monkeypatch.setattr(binarise, "BINARIZE_IN_PROCESS", True)
    tiny_bitext(tmp_path)
    return tmp_path


def test_group_by_length_orders_by_length_and_cuts_evenly():
    lengths = [5, 1, 3, 3, 9, 2, 7]
    groups = length_groups.group_by_length(lengths, 3)
    assert groups == [[1, 5, 2], [3, 0], [6, 4]]  # sizes 3, 2, 2; ties in file order
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))


def test_every_group_is_a_binarised_split_of_the_dataset(prepared):
    names = length_groups.write_groups(prepared, "en", "de", 3)
    assert names == ["test_len1of3", "test_len2of3", "test_len3of3"]
    sources = (prepared / "test.en").read_text(encoding="utf-8").splitlines()
    dictionary = Dictionary.load(str(prepared / "bin" / "dict.en.txt"))
    lengths_seen = []
    total = 0
    for name in names:
        data = data_utils.load_indexed_dataset(str(prepared / "bin" / f"{name}.en-de.en"), dictionary)
        assert data is not None and len(data) > 0
        total += len(data)
        # each sentence plus </s>: its source tokens, as the model reads them
        lengths_seen.append(sorted(len(data[i]) - 1 for i in range(len(data))))
        assert (prepared / "bin" / f"{name}.en-de.de.bin").is_file()
    assert total == len(sources)
    assert max(lengths_seen[0]) <= min(lengths_seen[1]) and max(lengths_seen[1]) <= min(lengths_seen[2])
    table = (prepared / "bin" / "test_lengths_of3.tsv").read_text(encoding="utf-8").splitlines()
    assert table[0].split("\t") == ["group", "sentences", "shortest", "longest", "mean"] and len(table) == 4
    assert not list(prepared.glob(".extra_splits.*")) and not list((prepared / "bin").glob("*.tmp"))


def test_a_second_run_rewrites_the_same_groups(prepared):
    length_groups.write_groups(prepared, "en", "de", 2)
    first = (prepared / "bin" / "test_len2of2.en-de.en.bin").read_bytes()
    length_groups.write_groups(prepared, "en", "de", 2)
    assert (prepared / "bin" / "test_len2of2.en-de.en.bin").read_bytes() == first


@pytest.mark.parametrize("problem", ["no text", "uneven sides", "too few sentences"])
def test_bad_input_is_one_line_naming_the_file(problem, prepared, capsys):
    groups = 3
    if problem == "no text":
        (prepared / "test.de").unlink()
    elif problem == "uneven sides":
        (prepared / "test.de").write_text("ein Satz\n", encoding="utf-8")
    else:
        groups = 1000
    status = length_groups.main(["--out", str(prepared), "--pair", "en-de", "--groups", str(groups)])
    err = capsys.readouterr().err.strip()
    assert status == 1 and len(err.splitlines()) == 1 and err.startswith("error: ")
    assert str(Path(prepared) / "test.") in err
    assert not list((prepared / "bin").glob("test_len*"))
