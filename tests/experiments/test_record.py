"""A record file that a merge or a hand edit damaged is refused with its file and line, never rewritten."""

import pytest

from fairseq_sparse.experiments.errors import RecordError
from fairseq_sparse.experiments.record import FIELDS, Record

HEADER = ",".join(FIELDS)
GOOD = "bible,topk,bleu,1,abc123,31.250000,BLEU|nrefs:1,0,"
OTHER = "bible,topk,bleu,2,abc123,30.500000,BLEU|nrefs:1,1,"


def write(tmp_path, *lines):
    path = tmp_path / "study.seeds.csv"
    path.write_text("\n".join([HEADER, *lines]) + "\n", encoding="utf-8")
    return path


def refused(tmp_path, *lines) -> str:
    path = write(tmp_path, *lines)
    before = path.read_bytes()
    with pytest.raises(RecordError) as failure:
        Record(tmp_path, "study")
    assert path.read_bytes() == before
    message = str(failure.value)
    assert "\n" not in message and message.startswith(f"{path}:")
    return message




def test_good_record(tmp_path):
    write(tmp_path, GOOD, OTHER)
    record = Record(tmp_path, "study")
    assert record.cells[("bible", "topk", "bleu", 1)].value == 31.25
    assert record.cells[("bible", "topk", "bleu", 2)].side_by_side is True
    assert record.seeds() == {"bible": [1, 2]}


def test_a_cell_recorded_twice_is_refused_naming_both_lines(tmp_path):
    message = refused(tmp_path, GOOD, OTHER, GOOD.replace("31.25", "29.75"))
    assert message.startswith(f"{tmp_path / 'study.seeds.csv'}:4: bible, topk, bleu, 1 is recorded twice (also line 2)")


def test_conflict_markers_are_refused(tmp_path):
    message = refused(tmp_path, "<<<<<<< HEAD", GOOD, "=======", GOOD.replace("31.25", "29.75"), ">>>>>>> other")
    assert ":2: a merge conflict marker (<<<<<<<)" in message


@pytest.mark.parametrize("line,why", [
    ("bible,topk,bleu,one,abc123,31.25,BLEU,0,", "invalid literal for int()"),
    ("bible,topk,bleu,1,abc123,thirty,BLEU,0,", "could not convert string to float"),
    ("bible,topk,bleu,1,abc123", "5 fields where the header has 9"),
    ("bible,topk,bleu,1,abc123,31.25,BLEU,0,,extra", "fields where the header has 9"),
])
def test_unparsable_lines_are_refused(tmp_path, line, why):
    message = refused(tmp_path, GOOD, line)
    assert ":3: not a record line (" in message and why in message


def test_a_file_that_is_no_record_is_refused(tmp_path):
    path = tmp_path / "study.seeds.csv"
    path.write_text("epoch,valid_loss\n1,5.0\n", encoding="utf-8")
    with pytest.raises(RecordError, match=r"study.seeds.csv:1: the header lacks dataset, row"):
        Record(tmp_path, "study")
