"""End-to-end tests of the per-dataset modules of fairseq_sparse.data on tiny raw files (no network).

Every raw format the scripts read is written here in its exact layout from the
parallel sentences of ``tests/fixtures/data_prep/sentences.tsv``: IWSLT
``train.tags.*`` and XML, WMT SGML, plain parallel text (also gzipped), Stanford's
tokenised IWSLT15 En-Vi text and the organisers' preprocessed WMT17 files.  Each
script runs end to end (small BPE), the binarised data is loaded with fairseq, and
one shared ``fairseq-train`` run checks that a prepared dataset trains.
"""

import csv
import gzip
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from fairseq_sparse.data import binarise, errors, filtering, moses, raw, subwords

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "data_prep" / "sentences.tsv"


def _load(name):
    return importlib.import_module(f"fairseq_sparse.data.{name}")


SCRIPTS = {name: _load(name) for name in ("iwslt14_de_en", "iwslt15_en_vi", "iwslt17_fr_en", "wmt")}

with open(FIXTURE, encoding="utf-8", newline="") as _f:
    ROWS = list(csv.DictReader(_f, delimiter="\t", quoting=csv.QUOTE_NONE))
TRAIN, EVAL = ROWS[:12], ROWS[12:]  # 12 training sentences, 4 for dev/test


def sents(lang, rows):
    return [r[lang] for r in rows]


# ----------------------------------------------------------------------------- raw formats

def write_lines(path, lines, gz=False):
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(line + "\n" for line in lines)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(data)
    else:
        path.write_text(data, encoding="utf-8")


def write_tags(path, lang, copies=4):
    """IWSLT ``train.tags.xx-yy.xx``: talks with metadata lines, one sentence a line."""
    lines = []
    for talk in range(copies):
        rows = TRAIN
        lines += [
            f"<url>http://www.ted.com/talks/speaker_{talk}.html</url>",
            "<keywords>talks, culture, science</keywords>",
            f"<speaker>Speaker {talk}</speaker>",
            f"<talkid>{100 + talk}</talkid>",
            f"<title>{rows[talk][lang]}</title>",
            f"<description>TED Talk Subtitles and Transcript: {rows[talk + 1][lang]}</description>",
            "<reviewer></reviewer>",
            "<translator></translator>",
        ]
        lines += [r[lang] for r in rows]
    write_lines(path, lines)


def _xml_text(text):
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def write_segs(path, lang, rows, setid, src, tgt):
    """IWSLT XML / WMT SGML: ``<seg id="N">`` lines inside ``<doc>`` elements."""
    is_src = lang == src
    head = (f'<srcset setid="{setid}" srclang="{src}">' if is_src else
            f'<refset setid="{setid}" srclang="{src}" trglang="{tgt}" refid="ref">')
    lines = ['<?xml version="1.0" encoding="UTF-8"?>', "<mteval>", head]
    for d, start in enumerate(range(0, len(rows), 2)):
        lines.append(f'<doc docid="doc{d}" genre="news" origlang="{src}">')
        lines.append(f"<title>Document {d}</title>")
        lines.append("<p>")
        for i, r in enumerate(rows[start:start + 2], start + 1):
            lines.append(f'<seg id="{i}"> {_xml_text(r[lang])} </seg>')
        lines.append("</p>")
        lines.append("</doc>")
    lines += ["</srcset>" if is_src else "</refset>", "</mteval>"]
    write_lines(path, lines)


def iwslt_raw(root, year, src, tgt, sets):
    d = root / f"{src}-{tgt}"
    for lang in (src, tgt):
        write_tags(d / f"train.tags.{src}-{tgt}.{lang}", lang)
        for s in sets:
            write_segs(d / f"IWSLT{year}.{s}.{src}-{tgt}.{lang}.xml", lang, EVAL,
                       f"iwslt20{year}-{s.split('.')[-1]}", src, tgt)
    return root


def stanford_raw(root):
    from sacremoses import MosesTokenizer

    for lang in ("en", "vi"):
        tok = MosesTokenizer(lang=lang)
        for name, rows in (("train", TRAIN * 2), ("tst2012", EVAL[:2]), ("tst2013", EVAL[2:])):
            write_lines(root / f"{name}.{lang}", [tok.tokenize(r[lang], return_str=True, escape=True)
                                                  for r in rows])
        words = sorted({w for r in TRAIN for w in tok.tokenize(r[lang], escape=True)})
        write_lines(root / f"vocab.{lang}", ["<unk>", "<s>", "</s>"] + words)
    return root


def wmt_raw(root, train_prefixes, pair, sets, gz_last=False):
    """Plain parallel corpora in sub-directories (as the archives extract) + SGML sets."""
    a, b = pair
    for i, prefix in enumerate(train_prefixes):
        rows = TRAIN[i::len(train_prefixes)] * 2
        gz = gz_last and i == len(train_prefixes) - 1
        for lang in (a, b):
            write_lines(root / f"training-{i}" / (f"{prefix}.{lang}" + (".gz" if gz else "")),
                        sents(lang, rows), gz=gz)
    for name, (src, tgt), rows in sets:
        for lang in (src, tgt):
            kind = "src" if lang == src else "ref"
            write_segs(root / "sgm" / f"{name}-{src}{tgt}-{kind}.{lang}.sgm", lang, rows, name, src, tgt)
    return root


def wmt17_raw(root):
    from sacremoses import MosesTokenizer

    for lang in ("de", "en"):
        tok = MosesTokenizer(lang=lang)
        tc = [tok.tokenize(r[lang], return_str=True, escape=True) for r in TRAIN * 2]
        tc = [line[0].lower() + line[1:] if lang == "en" else line for line in tc]
        write_lines(root / f"corpus.tc.{lang}.gz", tc, gz=True)
        write_lines(root / "dev" / f"newstest2016.tc.{lang}",
                    [tok.tokenize(r[lang], return_str=True, escape=True) for r in EVAL[:2]])
    write_lines(root / "true" / "truecase-model.en", ["the (9/10) The (1)", "can (1/1)", "river (1/1)"])
    write_lines(root / "true" / "truecase-model.de", ["Der (3/3)", "Können (1/1)"])
    for lang in ("de", "en"):
        kind = "src" if lang == "de" else "ref"
        write_segs(root / "test" / f"newstest2017-deen-{kind}.{lang}.sgm", lang, EVAL[2:], "newstest2017", "de", "en")
    return root


# ----------------------------------------------------------------------------- datasets

# name -> (script, arguments, raw-writer, (src, tgt))
CASES = {
    "iwslt14.de-en": ("iwslt14_de_en", ["--merges", "60"],
                      lambda r: iwslt_raw(r, 14, "de", "en", ["TED.dev2010", "TEDX.dev2012", "TED.tst2010",
                                                              "TED.tst2011", "TED.tst2012"]), ("de", "en")),
    "iwslt15.en-vi": ("iwslt15_en_vi", [], stanford_raw, ("en", "vi")),
    "iwslt17.fr-en": ("iwslt17_fr_en", ["--merges", "60"],
                      lambda r: iwslt_raw(r, 17, "fr", "en", ["TED.dev2010", "TED.tst2015"]), ("fr", "en")),
    "iwslt17.fr-en.spm": ("iwslt17_fr_en", ["--subword", "spm", "--vocab-size", "150"],
                          lambda r: iwslt_raw(r, 17, "fr", "en", ["TED.dev2010", "TED.tst2015"]), ("fr", "en")),
    "wmt14.en-de": ("wmt", ["--year", "14", "--pair", "en-de", "--merges", "60"],
                    lambda r: wmt_raw(r, ["europarl-v7.de-en", "commoncrawl.de-en", "news-commentary-v9.de-en"],
                                      ("de", "en"), [("newstest2013", ("en", "de"), EVAL[:2]),
                                                     ("newstest2014", ("de", "en"), EVAL[2:])]), ("en", "de")),
    "wmt14.en-de.char": ("wmt", ["--year", "14", "--pair", "en-de", "--char"],
                         lambda r: wmt_raw(r, ["europarl-v7.de-en", "commoncrawl.de-en", "news-commentary-v9.de-en"],
                                           ("de", "en"), [("newstest2013", ("en", "de"), EVAL[:2]),
                                                          ("newstest2014", ("en", "de"), EVAL[2:])]), ("en", "de")),
    "wmt14.en-fr": ("wmt", ["--year", "14", "--pair", "en-fr", "--merges", "60"],
                    lambda r: wmt_raw(r, ["europarl-v7.fr-en", "commoncrawl.fr-en", "undoc.2000.fr-en",
                                          "news-commentary-v9.fr-en", "giga-fren.release2.fixed"],
                                      ("fr", "en"), [("newstest2013", ("en", "fr"), EVAL[:2]),
                                                     ("newstest2014", ("fr", "en"), EVAL[2:])], gz_last=True),
                    ("en", "fr")),
    "wmt16.ro-en": ("wmt", ["--year", "16", "--pair", "ro-en", "--merges", "60"],
                    lambda r: wmt_raw(r, ["europarl-v8.ro-en", "SETIMES.en-ro"], ("ro", "en"),
                                      [("newsdev2016", ("ro", "en"), EVAL[:2]),
                                       ("newstest2016", ("ro", "en"), EVAL[2:])]), ("ro", "en")),
    "wmt17.de-en": ("wmt", ["--year", "17", "--pair", "de-en", "--merges", "60"], wmt17_raw, ("de", "en")),
    "wmt18.zh-en": ("wmt", ["--year", "18", "--pair", "zh-en", "--merges", "60"],
                    lambda r: wmt_raw(r, ["news-commentary-v13.zh-en", "UNv1.0.en-zh"], ("zh", "en"),
                                      [("newstest2017", ("zh", "en"), EVAL[:2]),
                                       ("newstest2018", ("zh", "en"), EVAL[2:])]), ("zh", "en")),
    "wmt18.en-fi": ("wmt", ["--year", "18", "--pair", "en-fi", "--merges", "60"],
                    lambda r: wmt_raw(r, ["europarl-v8.fi-en", "paracrawl-release1.en-fi.zipporah0-dedup-clean",
                                          "rapid2016.en-fi", "titles.fi-en"], ("fi", "en"),
                                      [("newstest2017", ("en", "fi"), EVAL[:2]),
                                       ("newstest2018", ("en", "fi"), EVAL[2:])]), ("en", "fi")),
}

_BUILT = {}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("data_prep_datasets")


# fairseq-preprocess as a subprocess (the scripts' default) for this dataset, in the
# test process for the others: importing fairseq costs seconds each time
SUBPROCESS = "iwslt14.de-en"


def build(name, workdir):
    if name not in _BUILT:
        script, extra, writer, pair = CASES[name]
        raw_dir = writer(workdir / "raw" / name)
        out = workdir / "out" / name
        binarise.BINARIZE_IN_PROCESS = name != SUBPROCESS
        try:
            rc = SCRIPTS[script].main(["--raw", str(raw_dir), "--out", str(out), *extra])
        finally:
            binarise.BINARIZE_IN_PROCESS = False
        assert rc == 0, f"{name} failed"
        _BUILT[name] = out
    return _BUILT[name]


def _read(path):
    return path.read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize("name", list(CASES))
def test_dataset_end_to_end(name, workdir, capsys):
    out = build(name, workdir)
    printed = capsys.readouterr().out
    src, tgt = CASES[name][3]
    assert "pairs" in printed and "dictionary sizes" in printed
    for split in ("train", "valid", "test"):
        for lang in (src, tgt):
            assert (out / "bin" / f"{split}.{src}-{tgt}.{lang}.bin").stat().st_size > 0
            assert (out / "bin" / f"{split}.{src}-{tgt}.{lang}.idx").exists()
        assert len(_read(out / f"{split}.{src}")) == len(_read(out / f"{split}.{tgt}")) > 0
    for split in ("valid", "test"):
        for lang in (src, tgt):
            refs = _read(out / f"{split}.raw.{lang}")
            assert len(refs) == len(_read(out / f"{split}.{lang}"))
    assert not (out / "tmp").exists()

    # the references are the detokenised raw sentences
    if name.startswith("wmt1") and not name.startswith("wmt17"):
        assert _read(out / f"test.raw.{tgt}") == sents(tgt, EVAL[2:])
    if name == "iwslt15.en-vi":
        assert _read(out / "test.raw.en") == sents("en", EVAL[2:])
        assert _read(out / "test.raw.vi") == sents("vi", EVAL[2:])
        assert _read(out / "train.en")[1].split()[1] == "&apos;s"       # word level, Moses-escaped
        # Stanford's vocabulary is the dictionary (minus <unk>, <s>, </s>)
        assert len(_read(out / "bin" / "dict.en.txt")) == len(_read(workdir / "raw" / name / "vocab.en")) - 3

    # subword scheme
    if name.endswith(".char"):
        assert "▁" in _read(out / "train.en")[0].split()
        assert all(len(tok) == 1 for line in _read(out / "train.de") for tok in line.split())
    elif name.endswith(".spm"):
        assert (out / "spm.model").exists()
    elif name == "iwslt15.en-vi":
        assert not (out / "bpecodes").exists()
    else:
        assert (out / "bpecodes").exists()
        assert any("@@" in line for line in _read(out / f"train.{src}") + _read(out / f"train.{tgt}"))

    # recipe details
    if name == "iwslt14.de-en":
        train, valid = _read(out / "train.en"), _read(out / "valid.en")
        assert len(train) + len(valid) == 48 + 8  # 4 talks x (12 sentences + title + description)
        assert len(valid) == (48 + 8) // 23
        assert all(line == line.lower() for line in train)
        assert _read(out / "test.raw.de")[:2] == sents("de", EVAL[:2])  # dev2010 first
        assert len(_read(out / "test.de")) == 5 * len(EVAL)
    if name == "wmt18.zh-en":
        zh = _read(out / "test.raw.zh")
        assert zh == sents("zh", EVAL[2:])
        assert not (out / "bin" / "dict.zh.txt").samefile(out / "bin" / "dict.en.txt")
        assert _read(out / "bin" / "dict.zh.txt") != _read(out / "bin" / "dict.en.txt")
        assert len(_read(out / "train.zh")) == 2 * len(TRAIN)  # no ratio filter for zh-en
        assert "感 谢" in _read(out / "train.zh")[0].replace("@@ ", "")  # characters
    if name == "wmt17.de-en":
        test_en = " ".join(_read(out / "test.en"))
        assert "the river" in test_en.replace("@@ ", "")  # truecased with the organisers' model
        assert len(_read(out / "valid.en")) == 2

    # fairseq reads every split
    from fairseq.data import Dictionary, data_utils

    for lang in (src, tgt):
        d = Dictionary.load(str(out / "bin" / f"dict.{lang}.txt"))
        for split in ("train", "valid", "test"):
            ds = data_utils.load_indexed_dataset(str(out / "bin" / f"{split}.{src}-{tgt}.{lang}"), d)
            assert ds is not None and len(ds) == len(_read(out / f"{split}.{lang}"))


def test_fairseq_train_reads_prepared_data(workdir):
    """One shared training run (IWSLT14: separate dictionaries, BPE)."""
    out = build("iwslt14.de-en", workdir)
    proc = subprocess.run(
        [str(BIN / "fairseq-train"), str(out / "bin"), "--arch", "transformer_sparse_mini",
         "--user-dir", str(ROOT / "fairseq_sparse"), "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
         "--encoder-ffn-embed-dim", "16", "--decoder-ffn-embed-dim", "16", "--encoder-attention-heads", "2",
         "--decoder-attention-heads", "2", "--max-update", "1", "--max-tokens", "500", "--cpu",
         "--save-dir", str(workdir / "ckpt"), "--no-save", "--optimizer", "adam", "--lr", "0.001",
         # this fairseq fork drops every batch that is not a multiple of
         # --required-batch-size-multiple (8): the tiny valid split has 2 pairs
         "--required-batch-size-multiple", "1"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = proc.stdout + proc.stderr
    assert "num_updates 1" in log or "num_updates\": \"1" in log or "done training" in log


@pytest.mark.parametrize("name", ["iwslt14.de-en", "iwslt15.en-vi", "iwslt17.fr-en", "wmt14.en-de",
                                  "wmt17.de-en"])
def test_missing_raw_file_is_one_clear_message(name, tmp_path, capsys):
    script, extra, writer, pair = CASES[name]
    raw_dir = writer(tmp_path / "raw")
    victim = sorted(p for p in raw_dir.rglob("*") if p.is_file() and "vocab" not in p.name
                    and "truecase" not in p.name)[-1]
    victim.unlink()
    out = tmp_path / "out"
    rc = SCRIPTS[script].main(["--raw", str(raw_dir), "--out", str(out), *extra])
    err = capsys.readouterr().err
    assert rc == 1
    assert err.count("error:") == 1 and "missing" in err
    assert victim.name.removesuffix(".gz") in err
    assert "Traceback" not in err
    assert not out.exists()


def test_missing_raw_directory(tmp_path, capsys):
    rc = SCRIPTS["wmt"].main(["--year", "16", "--pair", "en-ro", "--raw", str(tmp_path / "nope"),
                              "--out", str(tmp_path / "out")])
    assert rc == 1 and "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_unsupported_pair(tmp_path, capsys):
    rc = SCRIPTS["wmt"].main(["--year", "14", "--pair", "en-ru", "--raw", str(tmp_path), "--out", str(tmp_path / "o")])
    assert rc == 1 and "supported" in capsys.readouterr().err


@pytest.mark.parametrize("script", list(SCRIPTS))
def test_help(script, capsys):
    with pytest.raises(SystemExit) as e:
        SCRIPTS[script].main(["--help"])
    assert e.value.code == 0
    assert "--raw" in capsys.readouterr().out


def test_readers(tmp_path):
    sgm = tmp_path / "x.sgm"
    sgm.write_text('<srcset>\n<doc docid="a">\n<seg id="1">Smith &amp; Sons’ shop</seg>\n</doc>\n</srcset>\n',
                   encoding="utf-8")
    assert list(raw.read_raw(sgm, "seg")) == ["Smith & Sons' shop"]
    assert filtering.keep_pair("a b c", "a", 250, 1.5) is False
    assert filtering.keep_pair("a b", "a b c", 250, 1.5) is True
    assert filtering.keep_pair("a " * 251, "a " * 251, 250, 0) is False
    assert filtering.kept_indices(["a b c", "a b", ""], ["a", "a b c", "a"], 250, 1.5) == [1]
    assert subwords.char_split("ab cd") == "a b ▁ c d"
    assert moses.split_cjk("我们 love 北京。") == "我 们 love 北 京 。"


def test_undecodable_raw_file_is_one_clear_message_naming_its_line(tmp_path, capsys):
    """A wrongly encoded raw file stops preparation: its file and line are named, nothing is replaced."""
    script, extra, writer, pair = CASES["iwslt14.de-en"]
    raw_dir = writer(tmp_path / "raw")
    victim = next(p for p in sorted(raw_dir.rglob("*")) if p.is_file() and p.suffix not in (".gz",) and p.stat().st_size > 200)
    lines = victim.read_bytes().split(b"\n")
    lines[2] = "Café à Paris".encode("latin-1")  # bytes that are not UTF-8
    victim.write_bytes(b"\n".join(lines))
    rc = SCRIPTS[script].main(["--raw", str(raw_dir), "--out", str(tmp_path / "out"), *extra])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("error:") == 1 and "Traceback" not in err
    assert f"{victim.name}: line 3 is not valid utf-8" in err and "--encoding" in err
    assert not list((tmp_path / "out").rglob("*\ufffd*")) and "\ufffd" not in err


def test_raw_text_decodes_in_the_given_encoding_or_names_the_line(tmp_path):
    path = tmp_path / "x.de"
    path.write_bytes("eins\nzwei\nGrüße\n".encode("latin-1"))
    with pytest.raises(errors.PrepError, match=r"x.de: line 3 is not valid utf-8"):
        list(raw.read_raw(path, "plain"))
    assert list(raw.read_raw(path, "plain", "latin-1")) == ["eins", "zwei", "Grüße"]
    zipped = tmp_path / "x.de.gz"
    with gzip.open(zipped, "wb") as f:
        f.write(b"ok\n" * 5000 + b"\xff\n")  # the text reader decodes ahead in blocks: still line 5001
    with pytest.raises(errors.PrepError, match=r"line 5001 is not valid utf-8"):
        list(raw.read_raw(zipped, "plain"))
    with pytest.raises(errors.PrepError, match="--encoding utf-9: not a text encoding"):
        raw.check_encoding("utf-9")


def test_a_byte_order_mark_is_dropped_not_glued_to_the_first_token(tmp_path, caplog):
    """An IWSLT train.tags file saved with a BOM: its first (metadata) line stays metadata, and a plain
    file's first token stays itself; the log says which file had one."""
    tags = tmp_path / "train.tags.de-en.de"
    tags.write_text("\ufeff<url>http://x</url>\nHallo Welt\n", encoding="utf-8")
    plain = tmp_path / "test.de"
    plain.write_text("\ufeffEins zwei\ndrei\n", encoding="utf-8")
    with caplog.at_level("INFO", logger="fairseq_sparse.data"):
        assert list(raw.read_raw(tags, "tags")) == ["Hallo Welt"]
        assert list(raw.read_raw(plain, "plain")) == ["Eins zwei", "drei"]
    assert f"{plain} starts with a byte-order mark" in caplog.text
    empty = tmp_path / "empty.de"
    empty.write_text("", encoding="utf-8")
    assert list(raw.read_raw(empty, "plain")) == []


@pytest.mark.parametrize("side", ["both", "one"])
def test_an_empty_training_split_is_one_clear_message(side, tmp_path, capsys):
    """Raw training files with no pair left (empty, or every pair with an empty side) stop preparation
    with one line naming the files, before anything is binarised."""
    script, extra, writer, pair = CASES["iwslt14.de-en"]
    raw_dir = writer(tmp_path / "raw")
    train = sorted(p for p in raw_dir.rglob("train.tags.*") if p.is_file())
    assert len(train) == 2, train
    if side == "both":
        for path in train:
            path.write_text("<url>x</url>\n" * 3, encoding="utf-8")
    else:  # one side's sentences all empty, as many as the other side's
        train[0].write_text("\n" * len(list(raw.read_raw(train[1], "tags"))), encoding="utf-8")
    out = tmp_path / "out"
    rc = SCRIPTS[script].main(["--raw", str(raw_dir), "--out", str(out), *extra])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("error:") == 1 and "Traceback" not in err, err
    assert "the train split has no sentence pair" in err and train[0].name in err
    assert not list(out.rglob("*.bin"))


@pytest.mark.parametrize("errno_name", ["ENOTDIR", "ENOSPC"])
def test_an_output_that_cannot_be_written_is_one_line_naming_the_path(errno_name, tmp_path, capsys, monkeypatch):
    """An output folder below a file (as a mistyped --out gives), or a full disk: one line with the path
    and the system's words, no traceback, and the raw files untouched."""
    import errno

    script, extra, writer, pair = CASES["iwslt14.de-en"]
    raw_dir = writer(tmp_path / "raw")
    before = {p: p.read_bytes() for p in raw_dir.rglob("*") if p.is_file()}
    out = tmp_path / "out"
    if errno_name == "ENOTDIR":
        (tmp_path / "a-file").write_text("x")
        out = tmp_path / "a-file" / "out"
    else:  # the first file preparation writes meets a full disk
        import builtins

        real_open = builtins.open

        def full_disk(file, mode="r", *args, **kwargs):
            if "w" in mode and str(file).startswith(str(out)):
                raise OSError(errno.ENOSPC, "No space left on device", str(file))
            return real_open(file, mode, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", full_disk)
    rc = SCRIPTS[script].main(["--raw", str(raw_dir), "--out", str(out), *extra])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err and err.count("\n") == 1, err
    expected = "Not a directory" if errno_name == "ENOTDIR" else "No space left on device"
    assert err.startswith(f"error: {tmp_path}") and err.rstrip().endswith(expected), err
    assert {p: p.read_bytes() for p in raw_dir.rglob("*") if p.is_file()} == before
