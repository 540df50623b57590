"""Score ``fairseq-generate`` output with sacreBLEU against raw (detokenised) references.

    python -m fairseq_sparse.evaluate GEN_OUTPUT REF_FILE --lang en [--tokenize 13a] [--lowercase]
    python -m fairseq_sparse.evaluate GEN_OUTPUT DOC_REF_FILE --lang en --documents BLOCKS.tsv   # d-BLEU

Hypotheses are the ``D-`` lines of the log, put back in corpus order by their
ids. With ``--nbest N`` fairseq prints N hypotheses per sentence, best first: the
first (best) of each id is scored, the others are ignored. Subword-nmt joins are
undone (if generation did not ``--post-process``) and Moses detokenisation is done
by sacremoses (``--detok none`` when the text is not Moses-tokenised). Detokenising
here rather than with fairseq's ``--tokenizer moses`` sidesteps a hydra config error of the fairseq fork. The
sacreBLEU signature is printed with the score.

With ``--documents`` the generated lines are blocks of documents (made by
``data-prep/document_blocks.py``, whose ``{split}.blocks.tsv`` maps each block to its
document): each block is split at its sentence separators, each sentence detokenised,
the blocks of a document joined in order, and **d-BLEU** is corpus BLEU over whole
documents against REF_FILE, one raw document per line (Liu et al., 2020). n-grams are
matched across sentence boundaries, so no sentence alignment is needed.
"""

import argparse
import csv
import re
import sys
from pathlib import Path
from typing import Callable, List, Sequence

from sacrebleu.metrics import BLEU

from .core.errors import UsageError
from .data.document_blocks import SEPARATOR, split_block


def read_hypotheses(generate_output: str, lang: str, detok: str = "moses") -> List[str]:
    """Detokenised hypotheses from fairseq-generate's log, in corpus order: the best of each sentence.

    fairseq prints a sentence's ``--nbest`` hypotheses best first, so the first line of
    an id is kept and later ones (worse hypotheses) are skipped.
    """
    chosen = {}
    for line in Path(generate_output).read_text(encoding="utf-8").splitlines():
        match = re.match(r"^D-(\d+)\t[^\t]*\t(.*)$", line)
        if match and int(match.group(1)) not in chosen:
            chosen[int(match.group(1))] = undo_subwords(match.group(2))
    if not chosen:
        raise UsageError(f"no D- lines in {generate_output}: is it fairseq-generate output?")
    detokenize = detokenizer(lang, detok)
    chosen = {i: detokenize(h) for i, h in chosen.items()}
    if sorted(chosen) != list(range(len(chosen))):
        raise UsageError(f"{generate_output}: hypothesis ids are not 0..{len(chosen) - 1}; was generation cut short?")
    return [chosen[i] for i in range(len(chosen))]


def decode_seconds(generated: Path) -> float:
    """The seconds fairseq-generate's summary line reports for a decode (model loading excluded)."""
    match = re.search(r"Translated [\d,]+ sentences \([\d,]+ tokens\) in ([\d.]+)s", generated.read_text(encoding="utf-8"))
    if not match:
        raise ValueError(f"{generated}: no 'Translated ... in Ns' line; was decoding cut short?")
    return float(match.group(1))


def decode_tokens_per_second(generated: Path) -> float:
    """The generated tokens per second fairseq-generate's summary line reports."""
    match = re.search(r"Translated [\d,]+ sentences .*?, ([\d.]+) tokens/s\)", generated.read_text(encoding="utf-8"))
    if not match:
        raise ValueError(f"{generated}: no 'Translated ... tokens/s' line; was decoding cut short?")
    return float(match.group(1))


def detokenizer(lang: str, detok: str = "moses") -> Callable[[str], str]:
    """A function detokenising one line: Moses (sacremoses) or the identity (``none``)."""
    if detok == "none":
        return lambda line: line
    from sacremoses import MosesDetokenizer

    moses = MosesDetokenizer(lang=lang)
    return lambda line: moses.detokenize(line.split())


def undo_subwords(line: str) -> str:
    return re.sub(r"(@@ )|(@@ ?$)", "", line)


def corpus_bleu(hypotheses: List[str], references: List[str], tokenize: str = "13a", lowercase: bool = False):
    if len(hypotheses) != len(references):
        raise UsageError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    metric = BLEU(tokenize=tokenize, lowercase=lowercase)
    return metric.corpus_score(hypotheses, [references]), metric.get_signature()


def read_block_documents(block_map: str) -> List[int]:
    """The document index of each block, from the ``document`` column of a blocks.tsv map."""
    with open(block_map, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    if not rows or "document" not in rows[0]:
        raise UsageError(f"{block_map}: not a block map (a TSV with a 'document' column)")
    return [int(row["document"]) for row in rows]


def documents_from_blocks(
    blocks: Sequence[str], block_documents: Sequence[int], detokenize: Callable[[str], str] = lambda s: s,
    separator: str = SEPARATOR,
) -> List[str]:
    """Whole documents from translated blocks: sentences detokenised one by one, joined by spaces.

    ``block_documents[i]`` is the document of block i; the blocks of a document are
    consecutive and in order, and documents are numbered 0, 1, ... as the map says.
    """
    if len(blocks) != len(block_documents):
        raise UsageError(f"{len(blocks)} translated blocks but {len(block_documents)} blocks in the map")
    if list(block_documents) != sorted(block_documents) or sorted(set(block_documents)) != list(range(len(set(block_documents)))):
        raise UsageError("the block map must list documents 0, 1, ... in order, each block after the previous one")
    documents: List[List[str]] = [[] for _ in set(block_documents)]
    for block, document in zip(blocks, block_documents):
        documents[document].extend(detokenize(s) for s in split_block(block, separator, drop_empty=True))
    return [" ".join(sentences) for sentences in documents]


def document_bleu(
    blocks: Sequence[str], block_documents: Sequence[int], document_references: Sequence[str],
    tokenize: str = "13a", lowercase: bool = False, detokenize: Callable[[str], str] = lambda s: s,
    separator: str = SEPARATOR,
):
    """d-BLEU: corpus BLEU of whole documents rebuilt from translated blocks; (score, signature)."""
    documents = documents_from_blocks(blocks, block_documents, detokenize, separator)
    return corpus_bleu(documents, list(document_references), tokenize, lowercase)


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("generate_output")
    parser.add_argument("references", help="raw, detokenised reference file, one sentence a line "
                                           "(with --documents: one document a line)")
    parser.add_argument("--lang", default="en", help="target language (for Moses detokenisation)")
    parser.add_argument("--detok", choices=["moses", "none"], default="moses", help="detokenise hypotheses (default: moses)")
    parser.add_argument("--tokenize", default="13a", help="sacreBLEU tokenizer")
    parser.add_argument("--lowercase", action="store_true")
    parser.add_argument("--hypotheses-out", help="also write the detokenised hypotheses (documents with --documents) here")
    parser.add_argument("--documents", metavar="BLOCKS_TSV",
                        help="the generated lines are document blocks mapped by this file: score d-BLEU")
    parser.add_argument("--separator", default=SEPARATOR,
                        help="sentence separator token inside blocks (default: %(default)s)")
    args = parser.parse_args(argv)
    for path in (args.generate_output, args.references, args.documents):
        if path is not None and not Path(path).is_file():
            sys.exit(f"evaluate: error: no such file: {path}")
    if args.documents:
        return main_documents(args)
    hyps = read_hypotheses(args.generate_output, args.lang, args.detok)
    return score_and_report(hyps, args, "BLEU")


def main_documents(args) -> float:
    """d-BLEU of block translations against whole-document references."""
    blocks = read_hypotheses(args.generate_output, args.lang, detok="none")
    detokenize = detokenizer(args.lang, args.detok)
    documents = documents_from_blocks(blocks, read_block_documents(args.documents), detokenize, args.separator)
    return score_and_report(documents, args, "d-BLEU", f" over {len(documents)} documents")


def score_and_report(hypotheses: List[str], args, label: str, note: str = "") -> float:
    """sacreBLEU of ``hypotheses`` against ``args.references``; prints the score and its signature."""
    refs = Path(args.references).read_text(encoding="utf-8").splitlines()
    score, signature = corpus_bleu(hypotheses, refs, args.tokenize, args.lowercase)
    if args.hypotheses_out:
        Path(args.hypotheses_out).write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
    print(f"{label} = {score.score:.2f} ({score}){note}")
    print(f"sacreBLEU signature: {signature}")
    return score.score


if __name__ == "__main__":
    main()
