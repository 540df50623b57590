"""Token types of the L0Drop analysis (section 6, footnote 9) from HanTa tags.

The paper groups Penn Treebank tags: function words CC, IN, RP, TO, UH, DT, WP;
content words MD, JJ, NN, RB, VB; punctuation; and "other" for the rest (CD, EX, FW,
SYM, pronouns, ...). Subwords are typed by position, regardless of POS: the first piece
of a split word is BPEH, later pieces are BPEO. HanTa gives CLAWS5 tags for English and
STTS tags for German; the maps below are the nearest equivalents.
"""

from typing import List, Sequence

from .alignment import merge_words, word_spans

TYPES = ("punctuation", "function", "content", "other", "BPEH", "BPEO")
MODELS = {"en": "morphmodel_en.pgz", "de": "morphmodel_ger.pgz"}

FUNCTION = {
    # CLAWS5: CC/IN (conjunctions, prepositions), DT (articles, determiners), RP (AVP), TO, UH, WP (PNQ)
    "en": {"CJC", "CJS", "CJT", "PRP", "PRF", "AT0", "DT0", "DTQ", "AVP", "TO0", "ITJ", "PNQ"},
    # STTS: articles, determiners, prepositions, conjunctions, particles, interjections, wh-/relative pronouns
    "de": {"ART", "PDAT", "PIAT", "PIDAT", "PWAT", "APPR", "APPRART", "APPO", "APZR", "KON", "KOUS", "KOUI",
           "KOKOM", "PTKVZ", "PTKZU", "PTKNEG", "PTKANT", "ITJ", "PWS", "PWAV", "PRELS", "PRELAT"},
}
# content words: adjectives, nouns, adverbs, verbs (modals included, as MD in the paper)
CONTENT_PREFIXES = {"en": ("AJ", "NN", "NP", "AV0", "VB", "VD", "VH", "VV", "VM"),
                    "de": ("ADJ", "NN", "NE", "ADV", "VV", "VA", "VM")}
PUNCTUATION = {"en": {"PUN", "PUL", "PUR", "PUQ"}, "de": {"$.", "$,", "$("}}


def word_category(tag: str, lang: str) -> str:
    """One of punctuation / function / content / other for a CLAWS5 (en) or STTS (de) tag."""
    tag = tag.split("(")[0]
    if tag in PUNCTUATION[lang]:
        return "punctuation"
    if tag in FUNCTION[lang]:
        return "function"
    if tag.startswith(CONTENT_PREFIXES[lang]):
        return "content"
    return "other"


def piece_types(pieces: Sequence[str], word_categories: Sequence[str], marker: str = "@@") -> List[str]:
    """Type per piece: BPEH / BPEO for pieces of split words, else the word's category."""
    types: List[str] = []
    for span, category in zip(word_spans(pieces, marker), word_categories):
        if len(span) == 1:
            types.append(category)
        else:
            types += ["BPEH"] + ["BPEO"] * (len(span) - 1)
    return types


class Tagger:
    """HanTa, loaded once; ``categories(pieces)`` tags the de-BPE'd words."""

    def __init__(self, lang: str):
        from HanTa import HanoverTagger

        if lang not in MODELS:
            raise ValueError(f"no HanTa model for language {lang!r} (have: {', '.join(MODELS)})")
        self.lang = lang
        self.tagger = HanoverTagger.HanoverTagger(MODELS[lang])

    def categories(self, pieces: Sequence[str], marker: str = "@@") -> List[str]:
        words = merge_words(pieces, marker)
        if not words:
            return []
        tags = [tag for _, _, tag in self.tagger.tag_sent(words, taglevel=1)]
        return [word_category(tag, self.lang) for tag in tags]
