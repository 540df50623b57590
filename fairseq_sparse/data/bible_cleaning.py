"""Cleaning the verses of the Bible database: the editorial markup out, psalm titles in place.

The translations carry the marks of their printed editions (verse numbers of other
versifications, cross references, brackets around supplied words, gap markers) and some
peculiarities of their digitisation (Cornilescu's quotes, the WEB's psalm titles at the end of
the previous chapter).  What is left is plain text a model can learn from and a reference
sacreBLEU can score.
"""

import re
import unicodedata
from typing import Dict, Optional, Tuple

# "(32:1)", "(30-1)": the verse number in another versification
_VERSE_REF = re.compile(r"\(\s*\d+\s*[:\-]+\s*\d+[a-z]?\s*\)?")
_LEAD_NUMBER = re.compile(r"^\d+\.\s+(?=\D)")  # "22. Dacă ...": a verse number in the text
_DASH_BRACKET = re.compile(r"\s+-\[")  # "first -[fruits]" -> "first-fruits"
_BRACKET_REF = re.compile(r"\[[^\[\]]*\d[^\[\]]*\]")  # Darby "[Psaume 91:11-12]": a cross reference
_SPACE_BEFORE_STOP = re.compile(r"\s+(?=[.,](?:\s|$))")
_EMPTY_PARENS = re.compile(r"\(\s*\)")
_PARAGRAPH_DASH = re.compile(r"(?<=[.!?;:,])\s+-$")  # "... und er starb. -": paragraph mark
_RO_CLITIC = re.compile(r"(?<=\w)- (?=\w)")  # Cornilescu "i- a zis" -> "i-a zis"
_RO_OPEN_QUOTE = re.compile(r" , ")  # Cornilescu opening quote
_SPACES = re.compile(r"\s+")


def clean_verse(text: Optional[str], code: str = "") -> str:
    """Strip the editorial markup of the database from one verse; "" if nothing is left.

    Removed: verse numbers of another versification "(32:1)"/"(30-1)", cross
    references in brackets "[Psaume 8:2]", the brackets around words supplied by
    the translators (the words stay), the "*"/"***" gap markers, "#", a stray "₫",
    paragraph-ending " -" and leading verse numbers.  The backtick becomes an
    apostrophe (in Cornilescu, ``code`` "u", a closing quote, whose opening quote is
    " , "; its "i- a" becomes "i-a").  A verse without any letter (BBE's "[]",
    "...", "***") is empty.
    """
    if not text:
        return ""
    t = unicodedata.normalize("NFC", text)
    t = _VERSE_REF.sub(" ", t)
    t = _BRACKET_REF.sub(" ", t)
    t = _DASH_BRACKET.sub("-[", t)
    t = t.replace("[", "").replace("]", "")
    for ch in "*#\u20ab":
        t = t.replace(ch, " ")
    t = _EMPTY_PARENS.sub(" ", t)
    if code == "u":
        t = _RO_CLITIC.sub("-", t)
        t = _RO_OPEN_QUOTE.sub(' "', t)
        t = t.replace("`", '"')
    else:
        t = t.replace("`", "'")
    t = _SPACES.sub(" ", t).strip()
    t = _SPACE_BEFORE_STOP.sub("", t)
    t = _LEAD_NUMBER.sub("", t)
    t = _PARAGRAPH_DASH.sub("", t)
    if not any(ch.isalpha() for ch in t):
        return ""
    return t


_PSALM_TITLE = re.compile(r"\s+(?:BOOK [IVX]+\s+)?Psalm (\d+)\b\s*(.*)$")


def move_psalm_titles(verses: Dict[Tuple[int, int, int], str]) -> Dict[Tuple[int, int, int], str]:
    """Move psalm titles to the verse they belong to (in place; returns ``verses``).

    The WEB puts "Psalm 3 A Psalm by David, when he fled ..." (and "BOOK II" before
    psalms 42, 73, 90, 107) at the end of the last verse of the chapter before, where
    Elberfelder, Schlachter, Segond, Cornilescu and BBE have the title at the start
    of the psalm's verse 1.  The title goes there; "BOOK n Psalm n" is dropped.
    """
    last: Dict[Tuple[int, int], int] = {}
    for b, c, v in verses:
        last[b, c] = max(last.get((b, c), 0), v)
    for (b, c), v in last.items():
        if b not in (18, 19):
            continue
        m = _PSALM_TITLE.search(verses[b, c, v])
        if m is None:
            continue
        verses[b, c, v] = verses[b, c, v][: m.start()]
        first = (19, int(m.group(1)), 1)
        if m.group(2) and first in verses:
            verses[first] = m.group(2) + " " + verses[first]
    return verses
