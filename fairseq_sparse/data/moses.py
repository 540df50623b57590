"""Moses preprocessing with sacremoses: punctuation normalisation, tokenisation, truecasing,
detokenisation of references.

``Moses`` is the normaliser and tokeniser of one language; ``process_lines`` is the sentence-level
recipes' step around it (control characters to spaces, white space folded, optional
lowercasing), in worker processes when asked.  Chinese and Japanese are split into characters
before tokenising: sacremoses has no rules for them and no word segmenter is used.
"""

import functools
import multiprocessing
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

_CJK = re.compile(r"([\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef\u3000-\u303f])")
# control and zero-width characters, which Moses' tokenizer would glue to their neighbours
_NONPRINT = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\u200b-\u200f\ufeff]")


def split_cjk(text: str) -> str:
    """Put spaces around every CJK character (sacremoses has no Chinese segmenter)."""
    return " ".join(_CJK.sub(r" \1 ", text).split())


class Moses:
    """sacremoses' punctuation normaliser and tokeniser for one language.

    ``aggressive_dash`` is ``tokenizer.perl -a``; ``escape`` turns ``&<>'"`` and the like into
    XML entities, as ``tokenizer.perl`` does unless ``-no-escape``.
    """

    def __init__(self, lang: str, aggressive_dash: bool = False, escape: bool = True) -> None:
        from sacremoses import MosesPunctNormalizer, MosesTokenizer

        self.lang = lang
        self.aggressive_dash = aggressive_dash
        self.escape = escape
        self.normalizer = MosesPunctNormalizer(lang=lang)
        self.tokenizer = MosesTokenizer(lang=lang)

    def normalize(self, line: str) -> str:
        return self.normalizer.normalize(line)

    def tokenize(self, line: str) -> str:
        if self.lang in ("zh", "ja"):
            line = split_cjk(line)
        return self.tokenizer.tokenize(line, aggressive_dash_splits=self.aggressive_dash,
                                       return_str=True, escape=self.escape)


@dataclass
class LinePreprocessor:
    """One line of a sentence-level recipe: ``mode`` ``tok`` Moses-normalises and tokenises,
    ``norm`` only normalises punctuation, ``none`` leaves the text (already tokenised); then
    white space is folded and, if asked, the line lowercased."""

    moses: Moses
    mode: str
    lowercase: bool = False

    def __call__(self, line: str) -> str:
        if self.mode in ("tok", "norm"):
            line = _NONPRINT.sub(" ", self.moses.normalize(line))
        if self.mode == "tok":
            line = self.moses.tokenize(line)
        line = " ".join(line.split())
        return line.lower() if self.lowercase else line


_worker: Optional[LinePreprocessor] = None  # a pool worker's own, built once by _start_worker


def _start_worker(lang: str, mode: str, aggressive_dash: bool, lowercase: bool) -> None:
    global _worker
    _worker = LinePreprocessor(Moses(lang, aggressive_dash), mode, lowercase)


def _process_in_worker(line: str) -> str:
    assert _worker is not None
    return _worker(line)


def process_lines(lines: Iterable[str], lang: str, mode: str = "tok", workers: int = 1,
                  aggressive_dash: bool = False, lowercase: bool = False) -> Iterator[str]:
    """Every line through a ``LinePreprocessor``, in order; ``workers`` > 1: in that many processes."""
    if workers > 1:
        with multiprocessing.get_context("spawn").Pool(
                workers, _start_worker, (lang, mode, aggressive_dash, lowercase)) as pool:
            yield from pool.imap(_process_in_worker, lines, chunksize=2000)
    else:
        process = LinePreprocessor(Moses(lang, aggressive_dash), mode, lowercase)
        for line in lines:
            yield process(line)


@functools.lru_cache(maxsize=None)
def _detokenizer(lang: str):
    from sacremoses import MosesDetokenizer

    return MosesDetokenizer(lang=lang)


def detokenize(line: str, lang: str) -> str:
    """Moses-tokenised, escaped text back to plain text (references for sacreBLEU)."""
    return _detokenizer(lang).detokenize(line.split(), unescape=True)


def truecaser(model: Path) -> Callable[[str], str]:
    """The Moses truecaser of a ``truecase-model.*`` file, as a function of one tokenised line."""
    from sacremoses import MosesTruecaser

    tc = MosesTruecaser(load_from=str(model))
    return lambda line: tc.truecase(line, return_str=True)
