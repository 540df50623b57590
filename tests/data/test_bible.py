"""Tests of fairseq_sparse.data.bible on a tiny Bible database built in tmp_path (no network)."""

import sqlite3

import pytest

from fairseq_sparse.data import bible, bible_cleaning, bible_corpus, bible_db, errors, text

# (book, chapter, verse) -> (German text or None for a missing row, English text)
VERSES = {
    (1, 1, 1): ("Am Anfang schuf Gott den Himmel und die Erde.",
                "In the beginning God created the heavens and the earth."),
    (1, 1, 2): ("Und die Erde war wüst und leer.", "The earth was formless and empty."),
    (1, 1, 3): ("Und Gott sprach: Es werde Licht! Und es ward Licht.",
                'God said, "Let there be light," and there was light.'),
    (1, 2, 1): ("Also wurden vollendet der Himmel und die Erde.",
                "The heavens and the earth were finished."),
    (1, 2, 2): ("", "An empty verse on the German side."),
    (1, 2, 3): ("(2:4) Und Gott ruhte am siebenten Tage.", "God rested on the seventh day."),
    (2, 1, 1): ("Dies sind die Namen der Kinder Israel.",
                "Now these are the names of the sons of Israel."),
    (2, 1, 2): (None, "A verse with no German row."),
    (2, 1, 3): ("Ruben, Simeon, Levi und Juda.", "Reuben, Simeon, Levi, and Judah."),
    (41, 1, 1): ("Anfang des Evangeliums von Jesus Christus.",
                 "The beginning of the gospel of Jesus Christ."),
    (41, 1, 2): ("Wie geschrieben steht in den Propheten.", "As it is written in the prophets."),
    (41, 1, 3): ("Eine Stimme ruft in der Wüste.", "[]"),
    (43, 1, 1): ("Im Anfang war das Wort.", "In the beginning was the Word."),
    (43, 1, 2): ("Dieses war im Anfang bei Gott.", "The same was in the beginning with God."),
    (43, 2, 1): ("Und am dritten Tage war eine Hochzeit.",
                 "The third day, there was a wedding."),
}
N_PAIRS = 12  # skipped: (1,2,2) empty, (2,1,2) missing, (41,1,3) "[]"


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "bible.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE bible (id INTEGER NOT NULL, bbName TEXT NOT NULL, "
                "bNumber INTEGER NOT NULL, cNumber INTEGER NOT NULL, vNumber INTEGER NOT NULL, "
                "vText TEXT NOT NULL, PRIMARY KEY (bbName, bNumber, cNumber, vNumber))")
    con.execute("CREATE TABLE bibleRef (bbName TEXT NOT NULL, bNumber INTEGER NOT NULL, "
                "bName TEXT NOT NULL, bsName TEXT NOT NULL, PRIMARY KEY (bbName, bNumber))")
    rows = []
    for (b, c, v), (de, en) in VERSES.items():
        if de is not None:
            rows.append(("s", b, c, v, de))
        rows.append(("4", b, c, v, en))
    con.executemany("INSERT INTO bible VALUES (?, ?, ?, ?, ?, ?)",
                    [(i, *row) for i, row in enumerate(rows)])
    con.commit()
    con.close()
    return path


def _units(db):
    return bible_corpus.align(bible_db.read_verses(db, "s"), bible_db.read_verses(db, "4"))


def test_empty_and_missing_verses_are_skipped(db):
    assert bible_cleaning.clean_verse("[]") == "" and bible_cleaning.clean_verse("(*)") == ""
    assert bible_cleaning.clean_verse("(2:4) Und  Gott [ruhte].", "s") == "Und Gott ruhte."
    units, skipped = _units(db)
    keys = [u.key for u in units]
    assert len(units) == N_PAIRS and skipped == 3
    assert (1, 2, 2) not in keys and (2, 1, 2) not in keys and (41, 1, 3) not in keys
    assert all(u.src[0] and u.tgt[0] for u in units)


def test_split_by_book_is_disjoint_and_complete(db):
    units, _ = _units(db)
    splits = bible_corpus.split_by_book(units, [41], [43])
    keys = {s: [u.key for u in splits[s]] for s in text.SPLITS}
    assert sorted(sum(keys.values(), [])) == sorted(u.key for u in units)
    assert {k[0] for k in keys["valid"]} == {41}
    assert {k[0] for k in keys["test"]} == {43}
    assert {k[0] for k in keys["train"]} == {1, 2}
    with pytest.raises(errors.PrepError, match="both"):
        bible_corpus.split_by_book(units, [41], [41, 43])


def test_document_level_groups_verses_by_chapter(db):
    units, _ = _units(db)
    docs = bible_corpus.group_chapters(units)
    assert [d.key for d in docs] == [(1, 1), (1, 2), (2, 1), (41, 1), (43, 1), (43, 2)]
    assert [len(d.src) for d in docs] == [3, 2, 2, 2, 2, 1]
    assert all(len(d.src) == len(d.tgt) for d in docs)
    assert docs[1].tgt == ["The heavens and the earth were finished.",
                           "God rested on the seventh day."]


def test_bad_input_fails_clearly(db, tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match="unknown pair 'xx-en'"):
        bible.main(["--pair", "xx-en", "--out", str(out), "--db", str(db)])
    with pytest.raises(SystemExit, match="bible code 'q' has no rows"):
        bible.main(["--pair", "de-en", "--src-bible", "q", "--out", str(out), "--db", str(db)])
    with pytest.raises(SystemExit, match="no such file"):
        bible.main(["--pair", "de-en", "--out", str(out), "--db", str(tmp_path / "none.db")])
    assert not out.exists()


@pytest.mark.parametrize("level", ["sentence", "document"])
def test_main_end_to_end(db, tmp_path, level):
    pytest.importorskip("sacremoses")
    pytest.importorskip("subword_nmt")
    out = tmp_path / level
    assert bible.main(["--pair", "de-en", "--out", str(out), "--db", str(db), "--level", level,
                       "--bpe-merges", "20", "--max-eval-pairs", "5"]) == 0
    expected = {"sentence": {"train": 7, "valid": 2, "test": 3},
                "document": {"train": 3, "valid": 1, "test": 2}}[level]
    for split, n in expected.items():
        for kind in ("", ".raw", ".tok"):
            for lang in ("de", "en"):
                lines = (out / f"{split}{kind}.{lang}").read_text(encoding="utf-8").splitlines()
                assert len(lines) == n, (split, kind, lang)
                assert all(line.strip() for line in lines)
        if level == "document":
            counts = [int(x) for x in (out / f"{split}.sentcount").read_text().split()]
            assert len(counts) == n
    assert (out / "bpecodes").read_text(encoding="utf-8").startswith("#version")
    if level == "document":
        assert (out / "train.sentcount").read_text().split() == ["3", "2", "2"]
        assert (out / "train.raw.en").read_text(encoding="utf-8").splitlines()[1] == (
            "The heavens and the earth were finished. God rested on the seventh day.")
        # one verse a line as well: consecutive lines joined by sentcount give the chapters back
        for split in expected:
            counts = [int(x) for x in (out / f"{split}.sentcount").read_text().split()]
            for kind in ("", ".raw"):
                chapters = (out / f"{split}{kind}.en").read_text(encoding="utf-8").splitlines()
                verses = (out / f"{split}.sentences{kind}.en").read_text(encoding="utf-8").splitlines()
                assert len(verses) == sum(counts)
                starts = [sum(counts[:i]) for i in range(len(counts))]
                assert [" ".join(verses[a:a + n]) for a, n in zip(starts, counts)] == chapters
    else:
        assert (out / "valid.tok.en").read_text(encoding="utf-8").splitlines()[0] == (
            "The beginning of the gospel of Jesus Christ .")


def test_train_subset_changes_the_training_pairs_and_nothing_else(db, tmp_path, monkeypatch):
    """--train-subset keeps the BPE codes, dictionary, valid and test data of the whole corpus."""
    pytest.importorskip("fairseq")
    from fairseq_sparse.data import binarise

    monkeypatch.setattr(binarise, "BINARIZE_IN_PROCESS", True)
    common = ["--pair", "de-en", "--db", str(db), "--bpe-merges", "20", "--binarize"]
    whole, part = tmp_path / "whole", tmp_path / "part"
    assert bible.main(common + ["--out", str(whole)]) == 0
    assert bible.main(common + ["--out", str(part), "--train-subset", "3"]) == 0
    whole_ids = (whole / "train.ids").read_text().splitlines()
    part_ids = (part / "train.ids").read_text().splitlines()
    assert len(whole_ids) == 7 and len(part_ids) == 3
    assert [i for i in whole_ids if i in part_ids] == part_ids  # a subset, in the corpus's order
    for name in ("bpecodes", "valid.de", "test.en", "bin/dict.de.txt", "bin/dict.en.txt",
                 "bin/valid.de-en.de.bin", "bin/test.de-en.en.bin"):
        assert (part / name).read_bytes() == (whole / name).read_bytes(), name
    assert (part / "bin/train.de-en.de.bin").stat().st_size < (whole / "bin/train.de-en.de.bin").stat().st_size
    with pytest.raises(SystemExit, match="--train-subset must be positive"):
        bible.main(common + ["--out", str(tmp_path / "bad"), "--train-subset", "0"])
