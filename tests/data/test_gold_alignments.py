"""RWTH's gold alignments as split ``align`` of a prepared dataset (ReLA Table 5): the archive checked against its
hash, Latin-1 read, links turned into the dataset's direction and 0-based, the sentences segmented with the
dataset's BPE and binarised with its dictionaries; bad input one line, nothing written."""

import hashlib
import io
import tarfile
from pathlib import Path

import pytest
from fairseq.data import Dictionary, data_utils

from helpers import tiny_bitext
from fairseq_sparse.analysis import alignment
from fairseq_sparse.data import binarise, gold_alignments
from fairseq_sparse.data.subwords import learn_bpe
from fairseq_sparse.data.text import read_lines

GERMAN = ["Wir glauben nicht , daß wir nur Rosinen herauspicken sollten .", "Das ist gut & richtig .", "Ja ."]
ENGLISH = ["We do not believe that we should cherry-pick .", "That is good & right .", "Yes ."]
# 1-based German-English, i-j sure and ipj possible, as in alignmentDeEn.talp
LINKS = ["1-1 2-4 3-3 5-5 6-6 8-8 9-8 10-7 11-9 2p2", "1-1 2-2 3-3 4-4 5-5 6-6", "1-1 2-2 1p2"]


def rwth_files(folder: Path, links=LINKS, german=GERMAN) -> dict:
    """RWTH's three files as its archive holds them: Latin-1, ending with an empty line."""
    texts = {"de": german, "en": ENGLISH, "links": links}
    return {gold_alignments.RWTH_FILES[key]: ("\n".join(lines) + "\n\n").encode("latin-1") for key, lines in texts.items()}


def write_archive(folder: Path, files: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    archive = folder / gold_alignments.RWTH_ARCHIVE
    with tarfile.open(archive, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return archive


@pytest.fixture
def prepared(tmp_path, monkeypatch):
    """A tiny en-de dataset with its BPE codes (learnt on its training text and the gold sentences' words)."""
    monkeypatch.setattr(binarise, "BINARIZE_IN_PROCESS", True)
    data = tmp_path / "data"
    data.mkdir()
    tiny_bitext(data)
    learn_bpe(list(read_lines(data / "train.en", data / "train.de")) + GERMAN + ENGLISH, data / "bpecodes", 40)
    return data


@pytest.fixture
def archive(tmp_path, monkeypatch):
    path = write_archive(tmp_path / "raw", rwth_files(tmp_path))
    monkeypatch.setattr(gold_alignments, "RWTH_SHA256", hashlib.sha256(path.read_bytes()).hexdigest())
    return path


def test_the_archive_becomes_split_align_in_the_datasets_direction(prepared, archive):
    assert gold_alignments.main(["--out", str(prepared), "--pair", "en-de", "--raw", str(archive.parent)]) == 0
    gold = (prepared / "align.gold").read_text(encoding="utf-8").splitlines()
    assert len(gold) == 3  # the archive's final empty line is not a sentence
    sure, possible = alignment.parse_pharaoh(gold[0])
    # English-German, 0-based: German 2 (glauben) - English 4 (believe) becomes (3, 1); 2p2 is possible only
    assert (3, 1) in sure and (1, 1) in possible - sure and len(sure) == 9
    assert alignment.parse_pharaoh(gold[2]) == ({(0, 0), (1, 1)}, {(0, 0), (1, 1), (1, 0)})
    for lang, words in (("en", ENGLISH), ("de", GERMAN)):
        lines = (prepared / f"align.{lang}").read_text(encoding="utf-8").splitlines()
        # BPE pieces merge back into the gold's words, escaped as Moses escapes them
        assert [alignment.merge_words(line.split()) for line in lines] == [
            [w.replace("&", "&amp;") for w in sentence.split()] for sentence in words]
    assert "ß" in (prepared / "align.de").read_text(encoding="utf-8")  # daß, read as Latin-1
    dictionary = Dictionary.load(str(prepared / "bin" / "dict.en.txt"))
    split = data_utils.load_indexed_dataset(str(prepared / "bin" / "align.en-de.en"), dictionary)
    assert len(split) == 3 and (prepared / "bin" / "align.en-de.de.bin").is_file()
    assert not list(prepared.glob(".extra_splits.*"))


def test_the_extracted_folder_serves_as_well_and_de_en_keeps_the_links(tmp_path, prepared):
    folder = tmp_path / "extracted"
    for name, data in rwth_files(tmp_path).items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    sentences, where = gold_alignments.rwth_sentences(folder, "de", "en")
    assert where.endswith("DeEn") and len(sentences) == 3
    assert (1, 3) in sentences[0].sure and sentences[0].source[4] == "daß"


def test_diagonal_stand_in_links_every_target_word(prepared):
    for lang in ("en", "de"):
        (prepared / f"test.tok.{lang}").write_text((prepared / f"test.{lang}").read_text(encoding="utf-8"), encoding="utf-8")
    assert gold_alignments.main(["--out", str(prepared), "--pair", "en-de", "--stand-in", "diagonal"]) == 0
    gold = (prepared / "align.gold").read_text(encoding="utf-8").splitlines()
    targets = (prepared / "test.tok.de").read_text(encoding="utf-8").splitlines()
    for line, target in zip(gold, targets):
        sure, _ = alignment.parse_pharaoh(line)
        assert sorted(j for _, j in sure) == list(range(len(target.split())))


@pytest.mark.parametrize("problem", ["wrong hash", "link outside", "one side empty", "not a link", "no archive",
                                     "download without archive", "sentencepiece dataset"])
def test_bad_input_is_one_line_and_writes_nothing(problem, tmp_path, prepared, archive, monkeypatch, capsys):
    raw = archive.parent
    args = ["--raw", str(raw)]
    if problem == "wrong hash":
        monkeypatch.setattr(gold_alignments, "RWTH_SHA256", "0" * 64)
    elif problem in ("link outside", "one side empty", "not a link"):
        links, german = list(LINKS), list(GERMAN)
        if problem == "link outside":
            links[1] = "1-1 7-2"
        elif problem == "not a link":
            links[1] = "1-1 2x2"
        else:
            german[2] = ""
        archive.unlink()
        monkeypatch.setattr(gold_alignments, "RWTH_SHA256", hashlib.sha256(
            write_archive(raw, rwth_files(tmp_path, links, german)).read_bytes()).hexdigest())
    elif problem == "no archive":
        archive.unlink()
    elif problem == "download without archive":
        args = ["--download"]
    else:
        (prepared / "bpecodes").unlink()
    status = gold_alignments.main(["--out", str(prepared), "--pair", "en-de", *args])
    err = capsys.readouterr().err.strip()
    assert status == 1 and len(err.splitlines()) == 1 and err.startswith("error: ")
    expected = {"wrong hash": str(archive), "link outside": "line 2", "one side empty": "line 3",
                "not a link": "2x2", "no archive": str(raw), "download without archive": gold_alignments.RWTH_PAGE,
                "sentencepiece dataset": "bpecodes"}[problem]
    assert expected in err
    assert not (prepared / "align.gold").exists() and not list((prepared / "bin").glob("align.*"))


def test_a_non_german_english_dataset_is_refused(tmp_path, archive):
    with pytest.raises(gold_alignments.PrepError, match="German-English"):
        gold_alignments.rwth_sentences(archive.parent, "en", "fr")
