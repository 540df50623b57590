"""The sentence-level preparation pipeline of the IWSLT and WMT scripts: one ``Job`` from raw files
to binarised data.

``run``

1. checks that every expected raw file exists, before anything is written, and
   fails with one message naming all missing files;
2. reads the raw formats (``raw.py``);
3. normalises punctuation and tokenises with sacremoses (``moses.py``), optionally lowercasing
   or truecasing;
4. applies the subword scheme (``subwords.py``): joint BPE, a joint sentencepiece model,
   characters (``▁`` marks the spaces) or nothing;
5. cleans the training split like Moses' ``clean-corpus-n.perl`` (``filtering.py``), on the
   tokenised or on the subword text depending on the recipe;
6. binarises with ``fairseq-preprocess`` into ``OUT/bin`` (``binarise.py``);
7. prints the number of pairs per split and the dictionary sizes.

Files in ``OUT``: ``{split}.{lang}`` (what fairseq reads), ``{split}.raw.{lang}``
for valid and test (detokenised references for sacreBLEU), ``bpecodes`` or
``spm.model`` and ``bin/``.  Intermediate files go to ``OUT/tmp`` and are deleted
unless ``--keep-tmp``.  Everything streams line by line, so the WMT corpora do
not have to fit in memory.
"""

import itertools
import logging
import shutil
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional, Sequence, Tuple

from fairseq_sparse.data.binarise import binarize, dictionary_size, find_tool, vocab_to_fairseq_dict
from fairseq_sparse.data.errors import PrepError
from fairseq_sparse.data.filtering import filter_files
from fairseq_sparse.data.job import Job, Pair, check_raw
from fairseq_sparse.data.moses import detokenize, process_lines, truecaser
from fairseq_sparse.data.raw import Raw, fmt_of, read_raw
from fairseq_sparse.data.subwords import apply_bpe, apply_spm, char_split, learn_bpe, train_spm
from fairseq_sparse.data.text import SPLITS, read_lines, write_lines

logger = logging.getLogger("fairseq_sparse.data")

Files = Dict[Tuple[str, str], Path]  # (split, lang) -> one file of that split and language


def run(job: Job, raw_dir: Path, out: Path, workers: int = 1, keep_tmp: bool = False,
        binarise: bool = True) -> Dict[str, object]:
    """The whole pipeline; returns the summary it prints."""
    found = check_raw(job, raw_dir)          # before anything is written
    if binarise:
        find_tool("fairseq-preprocess")
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "tmp"
    tmp.mkdir(exist_ok=True)
    try:
        truecasers = load_truecasers(job, found)

        splits = [s for s in SPLITS if s in job.corpora]
        for split in splits:
            write_raw_split(job, found, split, tmp)
            tokenise_split(job, split, tmp, workers, truecasers if split in job.truecase_splits else {})
        tok = _files(tmp, "tok", splits, job)
        raws = _files(tmp, "raw", splits, job)
        if job.clean_on == "tok":
            filter_files([_train(tok, job), _train(raws, job)], job.max_len, job.ratio)
        if job.valid_from_train:
            carve_valid(job, (tok, raws), job.valid_from_train)
            splits = [s for s in SPLITS if s in splits or s == "valid"]

        segment(job, tok, out)
        final = {(s, lang): out / f"{s}.{lang}" for s in splits for lang in (job.src, job.tgt)}
        if job.clean_on == "subword":
            filter_files([_train(final, job)], job.max_len, job.ratio)
        write_references(job, raws, [s for s in splits if s != "train"], out)
        dest = binarise_job(job, found, out, tmp, workers) if binarise else None
    except BaseException:
        # input refused halfway (a control character, an undecodable line, an empty split): no half-prepared
        # intermediate files are left behind, nor an output directory this run made and nothing filled
        if not keep_tmp:
            shutil.rmtree(tmp, ignore_errors=True)
        if created and not any(out.iterdir()):
            out.rmdir()
        raise

    summary = summarise(job, final, splits, dest)
    if not keep_tmp:
        shutil.rmtree(tmp)
    print_summary(summary)
    return summary


def _files(directory: Path, kind: str, splits: Sequence[str], job: Job) -> Files:
    return {(s, lang): directory / f"{s}.{kind}.{lang}" for s in splits for lang in (job.src, job.tgt)}


def _train(files: Files, job: Job) -> Tuple[Path, Path]:
    return files["train", job.src], files["train", job.tgt]


def load_truecasers(job: Job, found: Dict[Raw, Path]) -> Dict[str, Callable[[str], str]]:
    """The truecaser of each language whose model was found; a warning for each that was not."""
    truecasers = {lang: truecaser(found[raw]) for lang, raw in job.truecase_models.items() if raw in found}
    for lang, raw in job.truecase_models.items():
        if raw not in found:
            logger.warning("no truecasing model %s: %s test text stays cased", raw.name, lang)
    return truecasers


def read_pairs(found: Dict[Raw, Path], pairs: Sequence[Pair], job: Job) -> Iterator[Tuple[str, str]]:
    """The sentence pairs of the raw file pairs, one pair after the other; a PrepError where
    the two sides of a pair of files have different numbers of sentences."""
    for a, b in pairs:
        pa, pb = found[a], found[b]
        for x, y in itertools.zip_longest(read_raw(pa, fmt_of(a, pa), job.encoding),
                                          read_raw(pb, fmt_of(b, pb), job.encoding)):
            if x is None or y is None:
                raise PrepError(f"{job.name}: {pa.name} and {pb.name} have different "
                                f"numbers of sentences")
            yield x, y


def write_raw_split(job: Job, found: Dict[Raw, Path], split: str, tmp: Path) -> None:
    """The raw sentences of ``split``, white space folded, into ``tmp/{split}.raw.{lang}`` (kept
    for the references); training pairs with an empty side are dropped. A split left with no pair
    is refused, naming its raw files: fairseq-train would fail on it much later, with a traceback."""
    written = 0
    with open(tmp / f"{split}.raw.{job.src}", "w", encoding="utf-8") as fs, \
            open(tmp / f"{split}.raw.{job.tgt}", "w", encoding="utf-8") as ft:
        for x, y in read_pairs(found, job.corpora[split], job):
            x, y = " ".join(x.split()), " ".join(y.split())
            if split == "train" and (not x or not y):
                continue
            fs.write(x + "\n")
            ft.write(y + "\n")
            written += 1
    if written == 0:
        files = ", ".join(str(found[raw]) for pair in job.corpora[split] for raw in pair)
        raise PrepError(f"{job.name}: the {split} split has no sentence pair"
                        f"{' with text on both sides' if split == 'train' else ''} in {files}")


def preprocessing_mode(job: Job, split: str) -> str:
    """``tok``, ``norm`` or ``none`` (see ``moses.LinePreprocessor``): sentencepiece and
    characters take untokenised text; truecased test text must be tokenised as the model was."""
    if split in job.truecase_splits or (job.tokenize and job.subword not in ("spm", "char")):
        return "tok"
    return "norm" if job.tokenize else "none"


def tokenise_split(job: Job, split: str, tmp: Path, workers: int,
                   truecasers: Dict[str, Callable[[str], str]]) -> None:
    """``tmp/{split}.raw.{lang}`` preprocessed, and truecased in the languages of ``truecasers``,
    into ``tmp/{split}.tok.{lang}``."""
    for lang in (job.src, job.tgt):
        lines = process_lines(read_lines(tmp / f"{split}.raw.{lang}"), lang, preprocessing_mode(job, split),
                              workers, job.aggressive_dash, job.lowercase)
        if lang in truecasers:
            lines = map(truecasers[lang], lines)
        write_lines(tmp / f"{split}.tok.{lang}", lines)


def carve_valid(job: Job, files: Sequence[Files], every: int) -> None:
    """Every ``every``-th training line becomes the valid split (fairseq's IWSLT14 recipe: every
    23rd), in each of ``files``, which gain their valid entries."""
    for d in files:
        for lang in (job.src, job.tgt):
            lines = list(read_lines(d["train", lang]))
            write_lines(d["train", lang], (line for i, line in enumerate(lines, 1) if i % every))
            d["valid", lang] = d["train", lang].with_name(d["train", lang].name.replace("train", "valid"))
            write_lines(d["valid", lang], (line for i, line in enumerate(lines, 1) if i % every == 0))


def segment(job: Job, tok: Files, out: Path) -> None:
    """The subword scheme of ``job``, learnt on the training files, applied to every file of
    ``tok`` into ``out/{split}.{lang}``."""
    for f in ("bpecodes", "spm.model", "spm.vocab"):
        (out / f).unlink(missing_ok=True)
    if job.subword == "bpe":
        codes = out / "bpecodes"
        learn_bpe(read_lines(*_train(tok, job)), codes, job.merges)
        for (s, lang), path in tok.items():
            apply_bpe(codes, path, out / f"{s}.{lang}")
    elif job.subword == "spm":
        model = train_spm(_train(tok, job), out / "spm", job.vocab_size)
        for (s, lang), path in tok.items():
            apply_spm(model, path, out / f"{s}.{lang}")
    elif job.subword == "char":
        for (s, lang), path in tok.items():
            write_lines(out / f"{s}.{lang}", (char_split(line) for line in read_lines(path)))
    elif job.subword == "none":
        for (s, lang), path in tok.items():
            shutil.copyfile(path, out / f"{s}.{lang}")
    else:
        raise PrepError(f"unknown subword scheme {job.subword!r}")


def write_references(job: Job, raws: Files, splits: Sequence[str], out: Path) -> None:
    """``out/{split}.raw.{lang}``: the references of the evaluation splits (never filtered, so
    they stay aligned), detokenised where the raw text was tokenised."""
    for s in splits:
        for lang in (job.src, job.tgt):
            lines = read_lines(raws[s, lang])
            if job.detok_refs:
                lines = (detokenize(line, lang) for line in lines)
            write_lines(out / f"{s}.raw.{lang}", lines)


def binarise_job(job: Job, found: Dict[Raw, Path], out: Path, tmp: Path, workers: int) -> Path:
    """``fairseq-preprocess`` of the prepared splits, with the job's vocabularies as
    dictionaries where it has them and they were found."""
    dicts: Dict[str, Optional[Path]] = {}
    for lang in (job.src, job.tgt):
        raw = job.dict_files.get(lang)
        dicts[lang] = (vocab_to_fairseq_dict(found[raw], tmp / f"dict.{lang}.txt")
                       if raw is not None and raw in found else None)
    return binarize(out, job.src, job.tgt, job.joined_dictionary, workers, dicts[job.src], dicts[job.tgt])


def summarise(job: Job, final: Files, splits: Sequence[str], dest: Optional[Path]) -> Dict[str, object]:
    summary: Dict[str, object] = {
        "dataset": job.name,
        "pairs": {s: sum(1 for _ in read_lines(final[s, job.src])) for s in splits},
    }
    if dest is not None:
        summary["vocab"] = {lang: dictionary_size(dest, lang) for lang in (job.src, job.tgt)}
        summary["bin"] = str(dest)
    return summary


def print_summary(summary: Dict[str, object]) -> None:
    pairs = summary["pairs"]
    print(f"{summary['dataset']}: " + ", ".join(f"{s} {n} pairs" for s, n in pairs.items()))
    if "vocab" in summary:
        print("  dictionary sizes (without fairseq's 4 special symbols): "
              + ", ".join(f"{lang} {n}" for lang, n in summary["vocab"].items()))
        print(f"  binarised data: {summary['bin']}")
