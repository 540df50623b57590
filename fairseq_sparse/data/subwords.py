"""Subword units: joint BPE (subword-nmt), joint sentencepiece models, characters.

BPE and sentencepiece are learnt on the training text of both languages together, so that one
joined dictionary can serve both sides; characters need nothing learnt (``char_split``).
"""

import contextlib
import io
import logging
from pathlib import Path
from typing import Callable, Iterable, Sequence

logger = logging.getLogger("fairseq_sparse.data")

SPACE = "\u2581"  # word boundary symbol of the character-level variant


def learn_bpe(lines: Iterable[str], codes: Path, merges: int) -> int:
    """Learn ``merges`` joint BPE merges on ``lines`` (subword-nmt's Python API, pairs seen at
    least twice) into the file ``codes``; returns the number of merges learnt."""
    from subword_nmt.learn_bpe import learn_bpe as _learn

    text, messages = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(messages):  # subword-nmt's progress bar
        _learn(lines, text, merges, min_frequency=2)
    codes.write_text(text.getvalue(), encoding="utf-8")
    learned = sum(1 for line in text.getvalue().splitlines() if line and not line.startswith("#"))
    if learned < merges:
        logger.info("BPE stopped after %d of %d merges: no pair occurs twice any more", learned, merges)
    return learned


def bpe_encoder(codes: Path) -> Callable[[str], str]:
    """The BPE segmentation of one tokenised line with the merges in ``codes``."""
    from subword_nmt.apply_bpe import BPE

    with open(codes, encoding="utf-8") as c:
        bpe = BPE(c)
    return lambda line: bpe.process_line(line).strip()


def apply_bpe(codes: Path, src: Path, dest: Path) -> None:
    """``src`` segmented with the merges in ``codes``, line by line, into ``dest``."""
    encode = bpe_encoder(codes)
    with open(src, encoding="utf-8") as f, open(dest, "w", encoding="utf-8") as out:
        for line in f:
            out.write(encode(line.rstrip("\n")) + "\n")


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
    """``src`` segmented into the pieces of ``model``, line by line, into ``dest``."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model))
    with open(src, encoding="utf-8") as f, open(dest, "w", encoding="utf-8") as out:
        for line in f:
            out.write(" ".join(sp.encode(line.rstrip("\n"), out_type=str)) + "\n")


def char_split(line: str) -> str:
    """``ab cd`` -> ``a b ▁ c d`` (undo with ``sed 's/ //g; s/▁/ /g'``)."""
    return " ".join(SPACE if ch == " " else ch for ch in " ".join(line.split())
                    .replace(SPACE, "_"))
