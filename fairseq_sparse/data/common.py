"""Shared pieces of the per-dataset preparation scripts in ``fairseq_sparse.data``.

Every script builds a :class:`Job` (which raw files make the train/valid/test
splits and how to process them) and calls :func:`run`, which

1. checks that every expected raw file exists, before anything is written, and
   fails with one message naming all missing files;
2. reads the raw formats: IWSLT ``train.tags.*`` files, IWSLT XML and WMT SGML
   (``<seg id="N">...</seg>``), plain parallel text (optionally gzipped);
3. normalises punctuation and tokenises with sacremoses (optionally lowercasing;
   Chinese is split into characters first, sacremoses has no Chinese rules);
4. applies the subword scheme: joint BPE learnt with subword-nmt's Python API,
   a joint sentencepiece model, characters (``▁`` marks the spaces) or nothing;
5. cleans the training split like Moses' ``clean-corpus-n.perl`` (drop pairs with
   an empty side, more than ``max_len`` tokens or a length ratio above ``ratio``),
   on the tokenised or on the subword text depending on the recipe;
6. binarises with ``fairseq-preprocess`` (subprocess) into ``OUT/bin``;
7. prints the number of pairs per split and the dictionary sizes.

Files in ``OUT``: ``{split}.{lang}`` (what fairseq reads), ``{split}.raw.{lang}``
for valid and test (detokenised references for sacreBLEU), ``bpecodes`` or
``spm.model`` and ``bin/``.  Intermediate files go to ``OUT/tmp`` and are deleted
unless ``--keep-tmp``.  Everything streams line by line, so the WMT corpora do
not have to fit in memory.
"""

from __future__ import annotations

import argparse
import codecs
import dataclasses
import gzip
import html
import itertools
import logging
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tarfile
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

logger = logging.getLogger("fairseq_sparse.data")

SPLITS = ("train", "valid", "test")
SPACE = "\u2581"  # word boundary symbol of the character-level variant


def cache_dir() -> Path:
    """Where downloaded corpora (the Bible database, the Bible alignments) are kept: $FAIRSEQ_SPARSE_CACHE
    or ~/.cache/fairseq-sparse."""
    env = os.environ.get("FAIRSEQ_SPARSE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fairseq-sparse"


class PrepError(Exception):
    """A problem with the raw data or the tools; reported as one message."""


# --------------------------------------------------------------------------- raw formats

@dataclass(frozen=True)
class Raw:
    """One raw file: its name (relative to the raw directory) and its format.

    ``fmt`` is ``plain`` (one sentence a line, ``.gz`` allowed), ``tags`` (IWSLT
    ``train.tags.*``: metadata lines in tags, one sentence a line otherwise) or
    ``seg`` (IWSLT XML / WMT SGML: one ``<seg id="N">...</seg>`` a sentence) or
    ``auto`` (``seg`` for ``.sgm``/``.xml`` files, else ``plain``).  ``name`` may
    list alternatives separated by ``|``; the first that exists is used.
    """

    name: str
    fmt: str = "auto"


def check_encoding(encoding: str) -> str:
    """The name of a text encoding Python knows (``--encoding``), or a PrepError."""
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise PrepError(f"--encoding {encoding}: not a text encoding Python knows (e.g. utf-8, latin-1, cp1252)") from None
    return encoding


def raw_lines(path: Path, encoding: str = "utf-8", newline: Optional[str] = None) -> Iterator[str]:
    """The lines of a raw text file (``.gz`` allowed), decoded strictly.

    An undecodable byte is never replaced (a wrongly encoded file would otherwise corrupt the
    data and the BLEU references silently): preparation stops with one message naming the
    file, the line and what to do. ``newline`` as ``open``'s (None: universal newlines).
    """
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding=encoding, newline=newline) as f:
            yield from f
    except UnicodeDecodeError as err:
        line = _first_undecodable_line(path, encoding)
        where = f"line {line}" if line else f"byte {err.start}"
        raise PrepError(f"{path}: {where} is not valid {encoding} ({err.reason}); give the raw files' encoding "
                        f"with --encoding, or convert the file to UTF-8") from None


def _first_undecodable_line(path: Path, encoding: str) -> Optional[int]:
    """The number of the first line of ``path`` that does not decode (the text reader decodes
    ahead in blocks, so its error does not say which line)."""
    opener = gzip.open if path.suffix == ".gz" else open
    decoder = codecs.getincrementaldecoder(encoding)()
    with opener(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                decoder.decode(raw)
            except UnicodeDecodeError:
                return number
    return None


# IWSLT train.tags: metadata lines dropped; <title>/<description> keep their text
# (fairseq's prepare-iwslt14.sh / prepare-iwslt17-multilingual.sh).
_KEEP_TAGS = re.compile(r"^\s*<(title|description)>(.*)</\1>\s*$")
_SEG = re.compile(r"<seg[^>]*>(.*)</seg>", re.IGNORECASE)


def unescape(text: str) -> str:
    """XML entities (``&amp;``, ``&lt;``, ``&#39;`` ...) to characters."""
    return html.unescape(text) if "&" in text else text


def read_raw(path: Path, fmt: str, encoding: str = "utf-8") -> Iterator[str]:
    """The sentences of one raw file, stripped, one per line."""
    lines = raw_lines(path, encoding)
    if fmt == "plain":
        for line in lines:
            yield line.strip()
    elif fmt == "tags":
        for line in lines:
            m = _KEEP_TAGS.match(line)
            if m:
                yield m.group(2).strip()
            elif not line.lstrip().startswith("<"):
                yield line.strip()
    elif fmt == "seg":
        for line in lines:
            m = _SEG.search(line)
            if m:
                yield unescape(m.group(1)).replace("\u2019", "'").strip()
    else:  # pragma: no cover - programming error
        raise ValueError(f"unknown raw format {fmt!r}")


def fmt_of(raw: Raw, path: Path) -> str:
    if raw.fmt != "auto":
        return raw.fmt
    return "seg" if path.name.endswith((".sgm", ".xml", ".sgm.gz", ".xml.gz")) else "plain"


def find_raw(raw_dir: Path, name: str) -> Optional[Path]:
    """``raw_dir/name``, else ``name`` (or ``name.gz``) anywhere below ``raw_dir``
    (archives extract into different sub-directories); ``a|b``: the first found."""
    if "|" in name:
        for alt in name.split("|"):
            path = find_raw(raw_dir, alt)
            if path is not None:
                return path
        return None
    for candidate in (name, name + ".gz"):
        direct = raw_dir / candidate
        if direct.is_file():
            return direct
    base = Path(name).name
    for candidate in (base, base + ".gz"):
        hits = sorted(p for p in raw_dir.rglob(candidate) if p.is_file())
        if hits:
            return hits[0]
    return None


# --------------------------------------------------------------------------- the job

@dataclass
class Job:
    """What one dataset consists of and how to process it."""

    name: str
    src: str
    tgt: str
    # split -> list of (source raw file, target raw file), concatenated in order
    corpora: Dict[str, List[Tuple[Raw, Raw]]]
    tokenize: bool = True            # Moses-normalise + tokenise (False: already tokenised)
    aggressive_dash: bool = False    # tokenizer.perl -a
    lowercase: bool = False
    subword: str = "bpe"             # bpe | spm | char | none
    merges: int = 32000              # BPE merge operations
    vocab_size: int = 32000          # sentencepiece vocabulary
    clean_on: str = "subword"        # tok | subword: when the length filter runs
    max_len: int = 250               # 0: no maximum
    ratio: float = 1.5               # 0: no ratio filter
    joined_dictionary: bool = True
    # valid = every n-th line of the cleaned train (n = 23: fairseq's IWSLT14 recipe)
    valid_from_train: Optional[int] = None
    detok_refs: bool = False         # raw refs are tokenised text: detokenise them
    truecase_models: Dict[str, Raw] = field(default_factory=dict)  # lang -> model
    truecase_splits: Tuple[str, ...] = ()
    dict_files: Dict[str, Raw] = field(default_factory=dict)   # lang -> vocab file
    optional: Tuple[Raw, ...] = ()   # used when present (vocabularies)
    encoding: str = "utf-8"          # of the raw files (--encoding)

    def required(self) -> List[Raw]:
        out: List[Raw] = []
        for pairs in self.corpora.values():
            for a, b in pairs:
                out += [a, b]
        return list(dict.fromkeys(out))


def check_raw(job: Job, raw_dir: Path) -> Dict[Raw, Path]:
    """Locate every required raw file; one PrepError naming all that are missing."""
    if not raw_dir.is_dir():
        raise PrepError(f"raw data directory {raw_dir} does not exist "
                        f"(give --raw DIR with the extracted files, or --download)")
    found: Dict[Raw, Path] = {}
    missing = []
    for raw in job.required():
        path = find_raw(raw_dir, raw.name)
        if path is None:
            alts = raw.name.split("|")
            missing.append(alts[0] + (f"  (or: {', '.join(alts[1:])})" if len(alts) > 1 else ""))
        else:
            found[raw] = path
    for raw in job.optional + tuple(job.dict_files.values()) + tuple(job.truecase_models.values()):
        path = find_raw(raw_dir, raw.name)
        if path is not None:
            found[raw] = path
    if missing:
        listing = "".join(f"\n  {m}" for m in missing)
        raise PrepError(f"{job.name}: {len(missing)} raw file{'s' if len(missing) > 1 else ''} "
                        f"missing in {raw_dir} (extract the official archives there, or use "
                        f"--download); nothing was written:{listing}")
    return found


# --------------------------------------------------------------------------- download

def download(urls: Sequence[str], raw_dir: Path) -> None:
    """Fetch every URL into ``raw_dir`` (skipping files already there) and
    extract archives (.tgz, .tar.gz, .tar, .zip; lone .gz files are read as is).

    An entry may hold alternatives separated by ``|``: the first that works wins;
    ``URL1+URL2`` are the parts of one split archive, concatenated."""
    raw_dir.mkdir(parents=True, exist_ok=True)
    for entry in urls:
        errors = []
        for url in entry.split("|"):
            parts = url.split("+")
            fname = parts[0].rstrip("/").split("/")[-1].split("=")[-1]
            if len(parts) > 1:
                fname = re.sub(r"\.\d+$", "", fname)
            dest = raw_dir / fname
            if not dest.exists():
                try:
                    tmp = dest.with_name(dest.name + ".part")
                    with open(tmp, "wb") as f:
                        for part in parts:
                            logger.info("downloading %s", part)
                            with urllib.request.urlopen(part, timeout=60) as r:
                                shutil.copyfileobj(r, f, 1 << 20)
                    tmp.rename(dest)
                except Exception as e:  # noqa: BLE001 - report every alternative
                    errors.append(f"{url}: {e}")
                    continue
            _extract(dest, raw_dir)
            break
        else:
            raise PrepError("download failed: " + "; ".join(errors))


def _extract(path: Path, raw_dir: Path) -> None:
    marker = raw_dir / f".{path.name}.extracted"
    if marker.exists():
        return
    name = path.name
    if name.endswith((".tgz", ".tar.gz", ".tar")):
        with tarfile.open(path) as t:
            t.extractall(raw_dir, filter="data")
    elif name.endswith(".zip"):
        with zipfile.ZipFile(path) as z:
            z.extractall(raw_dir)
    else:
        return
    marker.touch()


# --------------------------------------------------------------------------- tokenisation

_CJK = re.compile(r"([\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef\u3000-\u303f])")

_worker_state: dict = {}


def split_cjk(text: str) -> str:
    """Put spaces around every CJK character (sacremoses has no Chinese segmenter)."""
    return " ".join(_CJK.sub(r" \1 ", text).split())


def _init_worker(lang: str, tokenize: bool, aggressive: bool, lowercase: bool) -> None:
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    _worker_state.clear()
    _worker_state.update(
        lang=lang, tokenize=tokenize, aggressive=aggressive, lowercase=lowercase,
        norm=MosesPunctNormalizer(lang=lang), tok=MosesTokenizer(lang=lang),
    )


_NONPRINT = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\u200b-\u200f\ufeff]")


def _process(line: str) -> str:
    s = _worker_state
    if s["tokenize"] in ("tok", "norm"):
        line = _NONPRINT.sub(" ", s["norm"].normalize(line))
    if s["tokenize"] == "tok":
        if s["lang"] in ("zh", "ja"):
            line = split_cjk(line)
        line = s["tok"].tokenize(line, aggressive_dash_splits=s["aggressive"],
                                 return_str=True, escape=True)
    line = " ".join(line.split())
    return line.lower() if s["lowercase"] else line


def process_lines(lines: Iterable[str], lang: str, job: Job, workers: int = 1,
                  mode: str = "tok") -> Iterator[str]:
    """``mode``: ``tok`` Moses-normalise and tokenise, ``norm`` only normalise
    punctuation, ``none`` leave as is (already tokenised); then lowercase if asked."""
    args = (lang, mode, job.aggressive_dash,
            job.lowercase)
    if workers > 1:
        with multiprocessing.get_context("spawn").Pool(workers, _init_worker, args) as pool:
            yield from pool.imap(_process, lines, chunksize=2000)
    else:
        _init_worker(*args)
        for line in lines:
            yield _process(line)


def detokenize(line: str, lang: str, _cache: dict = {}) -> str:  # noqa: B006
    from sacremoses import MosesDetokenizer

    if lang not in _cache:
        _cache[lang] = MosesDetokenizer(lang=lang)
    return _cache[lang].detokenize(line.split(), unescape=True)


def char_split(line: str) -> str:
    """``ab cd`` -> ``a b ▁ c d`` (undo with ``sed 's/ //g; s/▁/ /g'``)."""
    return " ".join(SPACE if ch == " " else ch for ch in " ".join(line.split())
                    .replace(SPACE, "_"))


# --------------------------------------------------------------------------- subwords

def learn_bpe(files: Sequence[Path], codes: Path, merges: int) -> None:
    """Joint BPE on the concatenation of ``files`` (subword-nmt's Python API)."""
    from subword_nmt.learn_bpe import learn_bpe as _learn

    def lines():
        for path in files:
            with open(path, encoding="utf-8") as f:
                yield from f

    with open(codes, "w", encoding="utf-8") as out:
        _learn(lines(), out, merges, min_frequency=2)


def apply_bpe(codes: Path, src: Path, dest: Path) -> None:
    from subword_nmt.apply_bpe import BPE

    with open(codes, encoding="utf-8") as c:
        bpe = BPE(c)
    with open(src, encoding="utf-8") as f, open(dest, "w", encoding="utf-8") as out:
        for line in f:
            out.write(bpe.process_line(line.rstrip("\n")).strip() + "\n")


def train_spm(files: Sequence[Path], prefix: Path, vocab_size: int) -> Path:
    """A joint sentencepiece (BPE) model on ``files``; returns ``prefix.model``."""
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        input=",".join(str(f) for f in files), model_prefix=str(prefix),
        vocab_size=vocab_size, model_type="bpe", character_coverage=0.9995,
        input_sentence_size=10_000_000, shuffle_input_sentence=True,
        hard_vocab_limit=False, minloglevel=2,
        bos_id=-1, eos_id=-1, pad_id=-1, unk_id=0,  # fairseq adds its own symbols
    )
    return prefix.with_suffix(".model")


def apply_spm(model: Path, src: Path, dest: Path) -> None:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model))
    with open(src, encoding="utf-8") as f, open(dest, "w", encoding="utf-8") as out:
        for line in f:
            out.write(" ".join(sp.encode(line.rstrip("\n"), out_type=str)) + "\n")


# --------------------------------------------------------------------------- cleaning

def keep_pair(a: str, b: str, max_len: int, ratio: float) -> bool:
    """Moses ``clean-corpus-n.perl`` with min 1: non-empty, at most ``max_len``
    tokens per side (0: any), length ratio at most ``ratio`` (0: any)."""
    la, lb = len(a.split()), len(b.split())
    if la == 0 or lb == 0:
        return False
    if max_len and (la > max_len or lb > max_len):
        return False
    if ratio and (la / lb > ratio or lb / la > ratio):
        return False
    return True


def _lines(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield line.rstrip("\n")


def _write(path: Path, lines: Iterable[str]) -> int:
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")
            n += 1
    return n


def filter_pairs(files: Sequence[Tuple[Path, Path]], keep: Callable[[str, str], bool],
                 ) -> int:
    """Filter aligned files in place (``files``: (source, target) first, then any
    number of further aligned pairs that follow the decision)."""
    src, tgt = files[0]
    decisions = [keep(a, b) for a, b in zip(_lines(src), _lines(tgt))]
    for a, b in files:
        for path in (a, b):
            tmp = path.with_name(path.name + ".filtered")
            _write(tmp, (line for line, k in zip(_lines(path), decisions) if k))
            tmp.replace(path)
    return sum(decisions)


# --------------------------------------------------------------------------- binarise

def find_tool(name: str) -> str:
    """``name`` next to this Python, else on PATH."""
    here = Path(sys.executable).parent / name
    if here.is_file():
        return str(here)
    found = shutil.which(name)
    if not found:
        raise PrepError(f"{name} is neither next to {sys.executable} nor on PATH "
                        f"(pip install the fairseq fork first)")
    return found


def binarize(out: Path, src: str, tgt: str, joined_dictionary: bool = True, workers: int = 1,
             srcdict: Optional[Path] = None, tgtdict: Optional[Path] = None) -> Path:
    """``fairseq-preprocess`` of ``out/{train,valid,test}.{src,tgt}`` into ``out/bin``."""
    dest = out / "bin"
    if dest.exists():
        shutil.rmtree(dest)
    cmd = [find_tool("fairseq-preprocess"), "--source-lang", src, "--target-lang", tgt,
           "--trainpref", str(out / "train"), "--validpref", str(out / "valid"),
           "--testpref", str(out / "test"), "--destdir", str(dest),
           "--workers", str(max(1, workers))]
    if joined_dictionary:
        cmd.append("--joined-dictionary")
    if srcdict is not None:
        cmd += ["--srcdict", str(srcdict)]
    if tgtdict is not None:
        cmd += ["--tgtdict", str(tgtdict)]
    logger.info("binarising: %s", " ".join(cmd))
    if BINARIZE_IN_PROCESS:
        _preprocess_in_process(cmd[1:])
        return dest
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:])
        raise PrepError(f"fairseq-preprocess failed with exit status {proc.returncode}")
    return dest


# fairseq-preprocess runs as a subprocess; the tests set this to call it in the
# same process instead (importing fairseq once rather than once per dataset).
BINARIZE_IN_PROCESS = False


def _preprocess_in_process(argv: Sequence[str]) -> None:
    from fairseq import options
    from fairseq_cli import preprocess

    root = logging.getLogger()
    handlers = list(root.handlers)
    try:
        preprocess.main(options.get_preprocessing_parser().parse_args(list(argv)))
    except SystemExit as e:
        raise PrepError(f"fairseq-preprocess failed with exit status {e.code}") from None
    finally:
        for h in root.handlers[:]:
            if h not in handlers:
                root.removeHandler(h)
                h.close()


def vocab_to_fairseq_dict(vocab: Path, dest: Path) -> Path:
    """A one-word-a-line vocabulary (Stanford's ``vocab.*``) as a fairseq dict."""
    specials = {"<unk>", "<s>", "</s>", "<pad>"}
    words = [w for w in (line.split()[0] for line in _lines(vocab) if line.strip())
             if w not in specials]
    _write(dest, (f"{w} 1" for w in dict.fromkeys(words)))
    return dest


# --------------------------------------------------------------------------- the pipeline

def _pairs(found: Dict[Raw, Path], pairs: Sequence[Tuple[Raw, Raw]], job: Job,
           ) -> Iterator[Tuple[str, str]]:
    for a, b in pairs:
        pa, pb = found[a], found[b]
        for x, y in itertools.zip_longest(read_raw(pa, fmt_of(a, pa), job.encoding),
                                          read_raw(pb, fmt_of(b, pb), job.encoding)):
            if x is None or y is None:
                raise PrepError(f"{job.name}: {pa.name} and {pb.name} have different "
                                f"numbers of sentences")
            yield x, y


def run(job: Job, raw_dir: Path, out: Path, workers: int = 1, keep_tmp: bool = False,
        binarise: bool = True) -> Dict[str, object]:
    """The whole pipeline; returns the summary it prints."""
    found = check_raw(job, raw_dir)          # before anything is written
    if binarise:
        find_tool("fairseq-preprocess")
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "tmp"
    tmp.mkdir(exist_ok=True)
    langs = (job.src, job.tgt)
    truecasers = {}
    if job.truecase_models:
        from sacremoses import MosesTruecaser

        truecasers = {lang: MosesTruecaser(load_from=str(found[raw]))
                      for lang, raw in job.truecase_models.items() if raw in found}
        for lang, raw in job.truecase_models.items():
            if raw not in found:
                logger.warning("no truecasing model %s: %s test text stays cased", raw.name, lang)

    # 1. read + tokenise; raw text kept for the references
    splits = [s for s in SPLITS if s in job.corpora]
    for split in splits:
        raw_files = {lang: tmp / f"{split}.raw.{lang}" for lang in langs}
        with open(raw_files[job.src], "w", encoding="utf-8") as fs, \
                open(raw_files[job.tgt], "w", encoding="utf-8") as ft:
            for x, y in _pairs(found, job.corpora[split], job):
                x, y = " ".join(x.split()), " ".join(y.split())
                if split == "train" and (not x or not y):
                    continue
                fs.write(x + "\n")
                ft.write(y + "\n")
        for lang in langs:
            if split in job.truecase_splits or (job.tokenize and job.subword not in ("spm", "char")):
                mode = "tok"
            else:
                mode = "norm" if job.tokenize else "none"
            lines = process_lines(_lines(raw_files[lang]), lang, job, workers, mode)
            if split in job.truecase_splits and lang in truecasers:
                tc = truecasers[lang]
                lines = (tc.truecase(line, return_str=True) for line in lines)
            _write(tmp / f"{split}.tok.{lang}", lines)
    tok = {(s, lang): tmp / f"{s}.tok.{lang}" for s in splits for lang in langs}
    raws = {(s, lang): tmp / f"{s}.raw.{lang}" for s in splits for lang in langs}

    def pairs_of(d, split):
        return (d[split, job.src], d[split, job.tgt])

    if job.clean_on == "tok":
        filter_pairs([pairs_of(tok, "train"), pairs_of(raws, "train")],
                     lambda a, b: keep_pair(a, b, job.max_len, job.ratio))

    # valid split carved out of train (fairseq's IWSLT14 recipe: every 23rd line)
    if job.valid_from_train:
        n = job.valid_from_train
        for d in (tok, raws):
            for lang in langs:
                lines = list(_lines(d["train", lang]))
                _write(d["train", lang], (l for i, l in enumerate(lines, 1) if i % n))
                d["valid", lang] = d["train", lang].with_name(
                    d["train", lang].name.replace("train", "valid"))
                _write(d["valid", lang], (l for i, l in enumerate(lines, 1) if i % n == 0))
        splits = [s for s in SPLITS if s in splits or s == "valid"]

    # 2. subwords
    for f in ("bpecodes", "spm.model", "spm.vocab"):
        (out / f).unlink(missing_ok=True)
    if job.subword == "bpe":
        codes = out / "bpecodes"
        learn_bpe(pairs_of(tok, "train"), codes, job.merges)
        for (s, lang), path in tok.items():
            apply_bpe(codes, path, out / f"{s}.{lang}")
    elif job.subword == "spm":
        model = train_spm(pairs_of(tok, "train"), out / "spm", job.vocab_size)
        for (s, lang), path in tok.items():
            apply_spm(model, path, out / f"{s}.{lang}")
    elif job.subword == "char":
        for (s, lang), path in tok.items():
            _write(out / f"{s}.{lang}", (char_split(l) for l in _lines(path)))
    elif job.subword == "none":
        for (s, lang), path in tok.items():
            shutil.copyfile(path, out / f"{s}.{lang}")
    else:
        raise PrepError(f"unknown subword scheme {job.subword!r}")

    final = {(s, lang): out / f"{s}.{lang}" for s in splits for lang in langs}
    if job.clean_on == "subword":
        filter_pairs([pairs_of(final, "train")],
                     lambda a, b: keep_pair(a, b, job.max_len, job.ratio))

    # 3. references (valid/test never filtered, so they stay aligned)
    for s in splits:
        if s == "train":
            continue
        for lang in langs:
            lines = _lines(raws[s, lang])
            if job.detok_refs:
                lines = (detokenize(l, lang) for l in lines)
            _write(out / f"{s}.raw.{lang}", lines)

    # 4. binarise
    srcdict = tgtdict = None
    if job.dict_files:
        if job.src in job.dict_files and job.dict_files[job.src] in found:
            srcdict = vocab_to_fairseq_dict(found[job.dict_files[job.src]],
                                            tmp / f"dict.{job.src}.txt")
        if job.tgt in job.dict_files and job.dict_files[job.tgt] in found:
            tgtdict = vocab_to_fairseq_dict(found[job.dict_files[job.tgt]],
                                            tmp / f"dict.{job.tgt}.txt")
    dest = binarize(out, job.src, job.tgt, job.joined_dictionary, workers, srcdict, tgtdict) if binarise else None

    summary: Dict[str, object] = {
        "dataset": job.name,
        "pairs": {s: sum(1 for _ in _lines(final[s, job.src])) for s in splits},
    }
    if dest is not None:
        summary["vocab"] = {lang: sum(1 for _ in _lines(dest / f"dict.{lang}.txt"))
                            for lang in langs}
        summary["bin"] = str(dest)
    if not keep_tmp:
        shutil.rmtree(tmp)
    print_summary(summary)
    return summary


def print_summary(summary: Dict[str, object]) -> None:
    pairs = summary["pairs"]
    print(f"{summary['dataset']}: " + ", ".join(f"{s} {n} pairs" for s, n in pairs.items()))
    if "vocab" in summary:
        print("  dictionary sizes (without fairseq's 4 special symbols): "
              + ", ".join(f"{l} {n}" for l, n in summary["vocab"].items()))
        print(f"  binarised data: {summary['bin']}")


# --------------------------------------------------------------------------- CLI helpers

def base_parser(description: str, default_out: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--raw", metavar="DIR",
                     help="directory holding the already-downloaded and extracted raw "
                          "files (searched recursively by file name)")
    src.add_argument("--download", action="store_true",
                     help="download the official archives into OUT/raw (or --raw-dir) "
                          "and extract them first")
    p.add_argument("--raw-dir", metavar="DIR",
                   help="with --download: where to put the archives (default OUT/raw)")
    p.add_argument("--out", default=default_out, help=f"output directory (default {default_out})")
    p.add_argument("--workers", type=int, default=1,
                   help="processes for tokenisation and fairseq-preprocess (default 1)")
    p.add_argument("--no-binarize", action="store_true",
                   help="stop after writing the text files (skip fairseq-preprocess)")
    p.add_argument("--keep-tmp", action="store_true",
                   help="keep the intermediate files in OUT/tmp")
    add_encoding_arg(p)
    return p


def add_encoding_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--encoding", default="utf-8",
                   help="text encoding of the raw files (default %(default)s); a byte that does not decode "
                        "stops preparation with its file and line, it is never replaced")


def add_filter_args(p: argparse.ArgumentParser, max_len: int, ratio: float) -> None:
    p.add_argument("--max-len", type=int, default=max_len,
                   help=f"drop training pairs with a side longer than this (default "
                        f"{max_len}; 0: no limit)")
    p.add_argument("--ratio", type=float, default=ratio,
                   help=f"drop training pairs whose length ratio exceeds this (default "
                        f"{ratio}; 0: no limit)")


def main_with(job_fn: Callable[[argparse.Namespace], Job], urls_fn: Callable[[argparse.Namespace], Sequence[str]],
              parser: argparse.ArgumentParser, argv: Optional[Sequence[str]] = None) -> int:
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    out = Path(args.out)
    try:
        job = dataclasses.replace(job_fn(args), encoding=check_encoding(args.encoding))
        if args.download:
            raw_dir = Path(args.raw_dir) if args.raw_dir else out / "raw"
            download(urls_fn(args), raw_dir)
        else:
            raw_dir = Path(args.raw)
        run(job, raw_dir, out, workers=args.workers, keep_tmp=args.keep_tmp,
            binarise=not args.no_binarize)
    except PrepError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
