"""What a sentence-level dataset is made of (``Job``), and finding its raw files before any work.

A dataset script (``iwslt14_de_en``, ``iwslt15_en_vi``, ``iwslt17_fr_en``, ``wmt``) only builds a
``Job``: which raw files make the train/valid/test splits and how to process them;
``pipeline.run`` does the rest.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_sparse.data.errors import PrepError
from fairseq_sparse.data.raw import Raw, find_raw, missing_entry

Pair = Tuple[Raw, Raw]  # (source raw file, target raw file)


@dataclass
class Job:
    """What one dataset consists of and how to process it."""

    name: str
    src: str
    tgt: str
    # split -> list of (source raw file, target raw file), concatenated in order
    corpora: Dict[str, List[Pair]]
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
        """Every raw file of the corpora, once each, in order."""
        out: List[Raw] = []
        for pairs in self.corpora.values():
            for a, b in pairs:
                out += [a, b]
        return list(dict.fromkeys(out))


def iwslt_train(pair: str, src: str, tgt: str) -> List[Pair]:
    """The training talks of an IWSLT TED release: ``train.tags.{pair}.{lang}``."""
    return [(Raw(f"train.tags.{pair}.{src}", "tags"), Raw(f"train.tags.{pair}.{tgt}", "tags"))]


def iwslt_sets(year: int, pair: str, src: str, tgt: str, sets: Sequence[str]) -> List[Pair]:
    """Dev/test sets of an IWSLT TED release, e.g. ``IWSLT14.TED.dev2010.de-en.de.xml``."""
    return [(Raw(f"IWSLT{year}.{s}.{pair}.{src}.xml", "seg"), Raw(f"IWSLT{year}.{s}.{pair}.{tgt}.xml", "seg"))
            for s in sets]


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
            missing.append(missing_entry(raw.name))
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
