"""Build the word-type table of the L0Drop POS pruning pattern (``--encoder-prune-pos-table``).

Tags Moses-tokenised (pre-BPE) source text with the offline HanTa tagger and lists
every word type whose most frequent tag is one the paper prunes: function words
(PTB CC, IN, RP, TO, UH, DT, WP), punctuation, modals (MD) and existential "there"
(EX). English uses HanTa's CLAWS5 tags, German its STTS tags, mapped below.
Subword continuations are pruned by the pattern itself at run time.

Tagging is per sentence but the table is per type (the majority tag): a word that
is mostly a preposition is pruned everywhere. That is the approximation that lets
the pattern work from token ids alone.

    python -m fairseq_sparse.data.pos_prune_table data/bible.de-en/train.tok.de --lang de --out pos-table.de
    python -m fairseq_sparse.data.pos_prune_table data/wmt14.en-de/train.en --bpe --lang en --out pos-table.en
"""

import argparse
import collections
import sys
from pathlib import Path
from typing import Dict, Iterable, Iterator, List

from ..files import describe_os_error, write_atomically

# Tags (or tag prefixes before "(") whose words the POS pattern prunes.
PRUNABLE_TAGS = {
    # CLAWS5: articles/determiners, conjunctions, prepositions, particles, "to", interjections,
    # wh-pronouns, modals, existential "there", punctuation
    "en": {"AT0", "DT0", "DTQ", "CJC", "CJS", "CJT", "PRP", "PRF", "AVP", "TO0", "ITJ", "PNQ", "VM0", "EX0",
           "PUN", "PUL", "PUR", "PUQ"},
    # STTS: articles, determiners, prepositions, conjunctions, particles, "zu", interjections,
    # wh-pronouns, modals, punctuation
    "de": {"ART", "PDAT", "PIAT", "PWAT", "APPR", "APPRART", "APPO", "APZR", "KON", "KOUS", "KOUI", "KOKOM",
           "PTKVZ", "PTKZU", "PTKNEG", "ITJ", "PWS", "PWAV", "VM", "VMFIN", "VMINF", "VMPP", "$.", "$,", "$("},
}
MODELS = {"en": "morphmodel_en.pgz", "de": "morphmodel_ger.pgz"}


def base_tag(tag: str) -> str:
    """HanTa writes some STTS tags with their features, e.g. VM(FIN): keep the part before '('."""
    return tag.split("(")[0]


def majority_tags(sentences: Iterable[List[str]], lang: str) -> Dict[str, str]:
    from HanTa import HanoverTagger

    tagger = HanoverTagger.HanoverTagger(MODELS[lang])
    counts: Dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for words in sentences:
        if words:
            for word, _, tag in tagger.tag_sent(words, taglevel=1):
                counts[word][base_tag(tag)] += 1
    return {word: tags.most_common(1)[0][0] for word, tags in counts.items()}


def prunable_words(tags: Dict[str, str], lang: str) -> List[str]:
    return sorted(word for word, tag in tags.items() if tag in PRUNABLE_TAGS[lang])


def tokenised_sentences(path: str, limit: int, bpe: bool = False) -> Iterator[List[str]]:
    """The first ``limit`` lines of a UTF-8 file, split into words (``bpe``: subword-nmt pieces joined back
    into the tokenised words they were cut from); undecodable bytes are an error naming the line, never replaced."""
    with open(path, "rb") as lines:
        for number, line in zip(range(1, limit + 1), lines):
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(f"{path}, line {number}: not UTF-8 ({error.reason} at byte {error.start})") from None
            yield (text.replace("@@ ", "").removesuffix("@@\n").removesuffix("@@") if bpe else text).split()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fairseq_sparse.data.pos_prune_table", description=__doc__.split("\n\n")[0])
    parser.add_argument("text", help="tokenised source text, one sentence a line, before BPE (or after it, with --bpe)")
    parser.add_argument("--bpe", action="store_true", help="the text is BPE-segmented (subword-nmt's @@): tag its words")
    parser.add_argument("--lang", choices=sorted(MODELS), required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-sentences", type=int, default=200_000, help="tag at most this many sentences")
    return parser


def main(argv=None) -> List[str]:
    """The prunable word types, also written to ``--out``; bad input ends the command with one line."""
    args = build_parser().parse_args(argv)
    if not Path(args.text).is_file():
        sys.exit(f"pos_prune_table: error: no such file: {args.text}")
    try:
        words = prunable_words(majority_tags(tokenised_sentences(args.text, args.max_sentences, args.bpe), args.lang), args.lang)
        write_atomically(Path(args.out), "\n".join(words) + "\n")
    except ValueError as error:
        sys.exit(f"pos_prune_table: error: {error}")
    except OSError as error:
        sys.exit(f"pos_prune_table: error: {describe_os_error(error)}")
    print(f"{len(words)} prunable word types written to {args.out}")
    return words


if __name__ == "__main__":
    main()
