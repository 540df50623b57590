"""End-to-end tests of fairseq_sparse.data.documents on tiny hand-made raw files (no network).

Both raw formats are written here in their exact layout: Maruf et al.'s document-level
release (``concatenated_en2de_{split}_{lang}.txt``, ``<d>`` lines start documents, CRLF
line ends, trailing blanks, XML entities left in the text) in the directory names of
Maruf's repository and of G-Transformer's copy, and the official IWSLT17 release
(``train.tags.en-de.*`` talks with metadata lines, ``<doc docid>``/``<seg>`` XML; the
test talks split over the en-de and de-en archives). Every sentence starts with the name
of its document (``Alpha: ...``), so a block that mixed documents would show.

The script runs as a subprocess (two builds at once: News from Maruf's files, next to
TED's files of the same names, and TED from the official release; each build imports
fairseq once to binarise, which dominates the run time), its outputs are checked, and one
``fairseq-train`` run reads a binarised result. TED from Maruf's files differs from News
only in the directory it is read from, checked in-process.
"""

import csv
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "data_prep" / "sentences.tsv"
MAX_TOKENS = 40


def _load(name):
    return importlib.import_module(f"fairseq_sparse.data.{name}")


blocking = _load("document_blocks")
corpora = _load("document_corpora")
readers = _load("document_readers")

with open(FIXTURE, encoding="utf-8", newline="") as _f:
    ROWS = [(r["en"], r["de"]) for r in csv.DictReader(_f, delimiter="\t", quoting=csv.QUOTE_NONE)]

NAMES = ["Alpha", "Bravo", "Charlie", "Delta", "Echo", "Foxtrot", "Golf", "Hotel", "India", "Juliett",
         "Kilo", "Lima", "Mike", "November", "Oscar", "Papa"]


def documents(sizes, offset=0, names=NAMES):
    """Parallel documents of the given numbers of sentences; each sentence starts with its
    document's name. Returns [(name, [(en, de), ...]), ...] in raw (escaped-free) text."""
    docs = []
    for d, size in enumerate(sizes):
        name = names[d]
        pairs = [ROWS[(offset + d * 3 + i) % len(ROWS)] for i in range(size)]
        docs.append((name, [(f"{name}: {en}", f"{name}: {de}") for en, de in pairs]))
    return docs


def xml_escape(text):
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# ----------------------------------------------------------------------------- raw formats

def write_maruf(directory, splits, extra=None):
    """Maruf et al.'s files: ``<d>`` before every document, CRLF, trailing blanks, entities.
    ``extra``: split -> [(document index, en, de)] lines appended to that document as is."""
    directory.mkdir(parents=True, exist_ok=True)
    for split, docs in splits.items():
        for lang in ("en", "de"):
            lines = []
            for d, (_, pairs) in enumerate(docs):
                lines.append("<d>")
                for en, de in pairs:
                    lines.append((en if lang == "en" else de).replace("&", "&amp;") + "    ")
                for doc, en, de in (extra or {}).get(split, []):
                    if doc == d:
                        lines.append(en if lang == "en" else de)
            path = directory / f"concatenated_en2de_{split}_{lang}.txt"
            path.write_bytes("".join(line + "\r\n" for line in lines).encode("utf-8"))


def write_tags(path, lang, docs, first_talk=100):
    lines = []
    for k, (name, pairs) in enumerate(docs):
        lines += [
            f"<url>http://www.ted.com/talks/{name.lower()}.html</url>",
            "<keywords>talks, science</keywords>",
            f"<speaker>{name} Speaker</speaker>",
            f"<talkid>{first_talk + k}</talkid>",
            f"<title>{name}: A talk</title>",
            f"<description>TED Talk Subtitles and Transcript: about {name}</description>",
            "<reviewer></reviewer>",
            "<translator></translator>",
        ]
        lines += [en if lang == "en" else de for en, de in pairs]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def write_xml(path, lang, docs, setid, docids, order=None):
    is_src = lang == "en"
    lines = ['<?xml version="1.0" encoding="UTF-8"?>', "<mteval>",
             f'<srcset setid="{setid}" srclang="english">' if is_src else
             f'<refset setid="{setid}" srclang="english" trglang="german" refid="ref">']
    for k in order or range(len(docs)):
        name, pairs = docs[k]
        lines += [f'<doc docid="{docids[k]}" genre="lectures">', f"<url>http://www.ted.com/talks/{name.lower()}</url>",
                  f"<talkid>{docids[k]}</talkid>", f"<title>{name}: A talk</title>"]
        lines += [f'<seg id="{i}"> {xml_escape(en if is_src else de)} </seg>' for i, (en, de) in enumerate(pairs, 1)]
        lines.append("</doc>")
    lines += ["</srcset>" if is_src else "</refset>", "</mteval>"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


DEV_SETS = ["dev2010", "tst2010", "tst2011", "tst2012", "tst2013", "tst2014", "tst2015"]


def official_raw(root):
    """The IWSLT17 archives extracted: 2017-01-trnted en-de and 2017-01-ted-test en-de, de-en."""
    train = documents([9, 7, 1, 8], offset=0)
    write_tags(root / "en-de" / "train.tags.en-de.en", "en", train)
    write_tags(root / "en-de" / "train.tags.en-de.de", "de", train)
    valid, test = [], []
    for s, tst in enumerate(DEV_SETS):
        doc = documents([2], offset=s, names=[NAMES[s]])
        write_xml(root / "en-de" / f"IWSLT17.TED.{tst}.en-de.en.xml", "en", doc, f"IWSLT17.TED.{tst}", [200 + s])
        write_xml(root / "en-de" / f"IWSLT17.TED.{tst}.en-de.de.xml", "de", doc, f"IWSLT17.TED.{tst}", [200 + s])
        valid += [(str(200 + s), doc[0][1])]
    for s, tst in enumerate(["tst2016", "tst2017"]):
        docs = documents([5, 3], offset=7 * s, names=NAMES[2 * s:])
        docs[0][1][1] = ("{}: R&D costs & risks <3".format(docs[0][0]), "{}: F&E kostet & lohnt <3".format(docs[0][0]))
        ids = [300 + 2 * s, 301 + 2 * s]
        write_xml(root / "test" / "en-de" / f"IWSLT17.TED.{tst}.en-de.en.xml", "en", docs, f"IWSLT17.TED.{tst}", ids)
        # the German side comes from the de-en archive, its talks in another order
        write_xml(root / "test" / "de-en" / f"IWSLT17.TED.{tst}.de-en.de.xml", "de", docs, f"IWSLT17.TED.{tst}", ids,
                  order=[1, 0])
        test += [(str(i), pairs) for i, (_, pairs) in zip(ids, docs)]
    expected = {"train": [(str(100 + k), pairs) for k, (_, pairs) in enumerate(train)], "valid": valid, "test": test}
    return root, expected


def maruf_raw(root):
    """Maruf's repository layout for TED (IWSLT2017/), G-Transformer's for News (nc2016/),
    with the same file names, and a Europarl decoy that must never be read."""
    expected = {}
    for corpus, directory, names, offset in (("ted", "IWSLT2017", NAMES, 0), ("news", "nc2016", NAMES[10:] + NAMES[:10], 5)):
        splits = {"train": documents([8, 10, 6, 2], offset, names), "dev": documents([3, 4], offset + 1, names),
                  "test": documents([6, 1, 4], offset + 2, names)}
        name = splits["test"][0][0]
        splits["test"][0][1][2] = (f"{name}: R&D is cheap & fast.", f"{name}: F&E ist billig & schnell.")
        # pairs with an empty side are dropped (G-Transformer's prepare-bpe.sh)
        extra = {"train": [(1, f"{names[1]}: An English line without translation.", "   ")],
                 "test": [(2, "", f"{names[2]}: Eine Zeile ohne Englisch.")]}
        write_maruf(root / directory, splits, extra)
        expected[corpus] = {"train": [(str(i), p) for i, (_, p) in enumerate(splits["train"])],
                            "valid": [(str(i), p) for i, (_, p) in enumerate(splits["dev"])],
                            "test": [(str(i), p) for i, (_, p) in enumerate(splits["test"])]}
    decoy = documents([2, 2, 2], 0, ["Decoy", "Decoy", "Decoy"])
    write_maruf(root / "Europarl7", {"train": decoy, "dev": decoy, "test": decoy})
    return root, expected


def run_script(*args):
    return subprocess.run([sys.executable, "-m", "fairseq_sparse.data.documents", *map(str, args)], capture_output=True, text=True, timeout=600)


# ----------------------------------------------------------------------------- builds

@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Two builds at once: News from Maruf's files, TED from the official release."""
    work = tmp_path_factory.mktemp("documents")
    maruf, maruf_expected = maruf_raw(work / "raw-maruf")
    official, official_expected = official_raw(work / "raw-iwslt17")
    cases = {
        "news-maruf": (["--corpus", "news", "--raw", maruf], maruf_expected["news"]),
        "ted-official": (["--corpus", "ted", "--raw", official], official_expected),
    }
    procs = {}
    for name, (args, _) in cases.items():
        cmd = [sys.executable, "-m", "fairseq_sparse.data.documents", *map(str, args), "--out", str(work / name), "--merges", "300",
               "--max-tokens", str(MAX_TOKENS)]
        procs[name] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{name} failed:\n{stdout[-3000:]}\n{stderr[-3000:]}"
        results[name] = (work / name, stdout, cases[name][1])
    return results


def _read(path):
    return path.read_text(encoding="utf-8").splitlines()


def _unbpe(sentence):
    return (sentence + " ").replace("@@ ", "").strip()


@pytest.mark.parametrize("name", ["news-maruf", "ted-official"])
def test_documents_end_to_end(name, built):
    out, stdout, expected = built[name]
    assert not (out / "tmp").exists()
    assert (out / "bpecodes").exists()
    assert "dictionary sizes" in stdout
    for split in ("train", "valid", "test"):
        docs = expected[split]
        en, de = _read(out / f"{split}.en"), _read(out / f"{split}.de")
        blocks = blocking.read_block_map(out / f"{split}.blocks.tsv")
        # one block a line on both sides, the map has a row per block
        assert len(en) == len(de) == len(blocks)
        assert f"{split}: {len(docs)} documents, {sum(len(p) for _, p in docs)} sentences, {len(blocks)} blocks" in stdout
        # no block over the limit on either side (</s> included)
        assert max(len(line.split()) + 1 for line in en + de) <= MAX_TOKENS
        # blocks never mix documents: every sentence starts with its block's document name
        for k, block in enumerate(blocks):
            doc_name = docs[block.document][1][0][0].split(":")[0]
            for line in (en[k], de[k]):
                sentences = blocking.split_block(line)
                assert len(sentences) == block.num_sentences
                assert all(_unbpe(s).split()[0] == doc_name for s in sentences), (doc_name, line)
        # the documents come back whole and in order
        for lines in (en, de):
            restored = blocking.unblock(lines, blocks)
            assert [len(d) for d in restored] == [len(p) for _, p in docs]
        if split == "train":
            assert len(blocks) > len(docs), "long documents need several blocks"
            assert any(b.num_sentences > 1 for b in blocks), "blocks pack several sentences"
        # ids: talk ids / docids of the official release, indices for Maruf's files
        with open(out / f"{split}.blocks.tsv", encoding="utf-8") as f:
            ids = [row["document_id"] for row in csv.DictReader(f, delimiter="\t")]
        assert ids == [docs[b.document][0] for b in blocks]
    # the d-BLEU references: one raw document a line, its sentences joined by a space
    for split in ("valid", "test"):
        for k, lang in enumerate(("en", "de")):
            refs = _read(out / f"{split}.raw.{lang}")
            assert refs == [" ".join(pair[k] for pair in pairs) for _, pairs in expected[split]]
    assert not (out / "train.raw.en").exists()
    # binarised with a joined dictionary
    for split in ("train", "valid", "test"):
        for lang in ("en", "de"):
            assert (out / "bin" / f"{split}.en-de.{lang}.bin").stat().st_size > 0
    assert _read(out / "bin" / "dict.en.txt") == _read(out / "bin" / "dict.de.txt")
    assert any(line.startswith("<sep> ") for line in _read(out / "bin" / "dict.en.txt"))


def test_entities_decoded_and_empty_pairs_dropped(built):
    out = built["news-maruf"][0]
    refs = _read(out / "test.raw.en")
    assert "Kilo: R&D is cheap & fast." in refs[0]
    assert "Eine Zeile ohne Englisch" not in " ".join(_read(out / "test.raw.de"))
    assert "&amp;" in " ".join(_unbpe(l) for l in _read(out / "test.en"))  # Moses-escaped for the model
    assert "without translation" not in " ".join(_unbpe(l) for l in _read(out / "train.en"))
    official = built["ted-official"][0]
    assert "R&D costs & risks <3" in _read(official / "test.raw.en")[0]
    # metadata (title, description) is not part of the talks
    assert "TED Talk Subtitles" not in " ".join(_unbpe(l) for l in _read(official / "train.en"))


def test_each_corpus_reads_its_own_directory(built, tmp_path):
    """TED and News files share their names: each corpus reads its own directory (Maruf's
    IWSLT2017/, G-Transformer's nc2016/), never the other corpus' nor Europarl7/."""
    assert _unbpe(_read(built["news-maruf"][0] / "test.en")[0]).split()[0] == "Kilo"
    raw, expected = maruf_raw(tmp_path / "raw")
    for corpus, directory in (("ted", "IWSLT2017"), ("news", "nc2016")):
        source, found = corpora.resolve(corpora.CORPORA[corpus], raw)
        assert source is corpora.MARUF
        assert {p.parent.name for p in found.values()} == {directory}
        for split in ("train", "valid", "test"):
            docs, dropped = corpora.read_split(source, found, split)
            assert [(d.id, list(zip(d.src, d.tgt))) for d in docs] == expected[corpus][split]
            assert dropped == (split != "valid")
    # Maruf's files directly in --raw
    write_maruf(tmp_path / "flat", {"train": documents([2]), "dev": documents([1]), "test": documents([1])})
    _, found = corpora.resolve(corpora.CORPORA["ted"], tmp_path / "flat")
    assert {p.parent for p in found.values()} == {tmp_path / "flat"}


def test_fairseq_train_reads_the_blocks(built, tmp_path):
    out = built["ted-official"][0]
    proc = subprocess.run(
        [str(BIN / "fairseq-train"), str(out / "bin"), "--arch", "transformer_sparse_mini",
         "--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
         "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
         "--max-update", "1", "--max-tokens", "4000", "--cpu", "--user-dir", str(ROOT / "fairseq_sparse"),
         "--disable-validation", "--save-dir", str(tmp_path / "ckpt"), "--no-save",
         "--optimizer", "adam", "--lr", "0.001"],
        capture_output=True, text=True, timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert "num_updates 1" in log or '"num_updates": "1"' in log or "done training" in log


def test_reader_keeps_lines_aligned(tmp_path):
    """Only ``\\n`` ends a line: a stray ``\\r`` or a U+2028 inside a sentence becomes a space."""
    (tmp_path / "a.en").write_bytes("<d>\r\nOne\rtwo.\r\nThree\u2028four &amp; five.\r\n<d>\r\nSix.\r\n".encode())
    (tmp_path / "a.de").write_bytes("<d>\r\nEins zwei.\r\nDrei vier\x85fünf.\r\n<d>\r\nSechs.\r\n".encode())
    docs, dropped = readers.read_maruf(tmp_path / "a.en", tmp_path / "a.de")
    assert [(d.src, d.tgt) for d in docs] == [(["One two.", "Three four & five."], ["Eins zwei.", "Drei vier fünf."]),
                                              (["Six."], ["Sechs."])]
    assert dropped == 0


# ----------------------------------------------------------------------------- errors

def _check_error(proc, out, *names):
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.count("error:") == 1 and "Traceback" not in proc.stderr
    for name in names:
        assert name in proc.stderr, proc.stderr
    assert not out.exists()


def test_missing_maruf_file_is_named(tmp_path):
    raw, _ = maruf_raw(tmp_path / "raw")
    (raw / "nc2016" / "concatenated_en2de_test_de.txt").unlink()
    (raw / "nc2016" / "concatenated_en2de_train_en.txt").unlink()
    out = tmp_path / "out"
    # TED's file of the same name (IWSLT2017/) is not taken for News
    proc = run_script("--corpus", "news", "--raw", raw, "--out", out)
    _check_error(proc, out, "concatenated_en2de_test_de.txt", "concatenated_en2de_train_en.txt", "2 raw files")
    assert "concatenated_en2de_dev_en.txt" not in proc.stderr


def test_missing_official_file_is_named(tmp_path):
    raw, _ = official_raw(tmp_path / "raw")
    (raw / "test" / "de-en" / "IWSLT17.TED.tst2017.de-en.de.xml").unlink()
    out = tmp_path / "out"
    proc = run_script("--corpus", "ted", "--raw", raw, "--out", out)
    _check_error(proc, out, "IWSLT17.TED.tst2017.de-en.de.xml", "official IWSLT17 release", "1 raw file ")


def test_no_raw_files_names_every_format(tmp_path):
    (tmp_path / "raw").mkdir()
    out = tmp_path / "out"
    proc = run_script("--corpus", "ted", "--raw", tmp_path / "raw", "--out", out)
    _check_error(proc, out, "concatenated_en2de_train_en.txt", "concatenated_en2de_test_de.txt",
                 "train.tags.en-de.de", "IWSLT17.TED.tst2015.en-de.en.xml", "IWSLT17.TED.tst2016.de-en.de.xml")


def test_document_boundary_on_one_side_only(tmp_path):
    raw = tmp_path / "raw"
    docs = documents([2, 2])
    write_maruf(raw, {"train": docs, "dev": docs, "test": docs})
    path = raw / "concatenated_en2de_dev_de.txt"
    lines = path.read_bytes().decode().split("\r\n")
    lines[2] = "<d>"  # the second sentence of the first document, German side only
    path.write_bytes("\r\n".join(lines).encode())
    out = tmp_path / "out"
    proc = run_script("--corpus", "ted", "--raw", raw, "--out", out)
    _check_error(proc, out, "line 3", "one side only")


def test_undecodable_document_file_names_its_line(tmp_path):
    from fairseq_sparse.data.errors import PrepError

    src, tgt = tmp_path / "train.en", tmp_path / "train.de"
    src.write_text("<d>\na\nb\n", encoding="utf-8")
    tgt.write_bytes("<d>\nx\n\xfc\n".encode("latin-1"))
    with pytest.raises(PrepError, match=r"train.de: line 3 is not valid utf-8"):
        readers.read_maruf(src, tgt)
    docs, _ = readers.read_maruf(src, tgt, encoding="latin-1")
    assert docs[0].tgt == ["x", "\xfc"]
