"""Score ``fairseq-generate`` output with sacreBLEU against raw (detokenised) references.

    python -m fairseq_sparse.evaluate GEN_OUTPUT REF_FILE --lang en [--tokenize 13a] [--lowercase]

Hypotheses are the ``D-`` lines of the log, put back in corpus order by their
ids, with subword-nmt joins undone (if generation did not ``--post-process``)
and Moses detokenisation by sacremoses (``--detok none`` when the text is not
Moses-tokenised). Detokenising here rather than with fairseq's
``--tokenizer moses`` sidesteps a hydra config error of the fairseq fork. The
sacreBLEU signature is printed with the score.
"""

import argparse
import re
import sys
from pathlib import Path
from typing import List

from sacrebleu.metrics import BLEU


def read_hypotheses(generate_output: str, lang: str, detok: str = "moses") -> List[str]:
    """Detokenised hypotheses from fairseq-generate's log, in corpus order."""
    chosen = {}
    for line in Path(generate_output).read_text(encoding="utf-8").splitlines():
        match = re.match(r"^D-(\d+)\t[^\t]*\t(.*)$", line)
        if match:
            chosen[int(match.group(1))] = undo_subwords(match.group(2))
    if not chosen:
        raise ValueError(f"no D- lines in {generate_output}: is it fairseq-generate output?")
    if detok == "moses":
        from sacremoses import MosesDetokenizer

        detokenizer = MosesDetokenizer(lang=lang)
        chosen = {i: detokenizer.detokenize(h.split()) for i, h in chosen.items()}
    if sorted(chosen) != list(range(len(chosen))):
        raise ValueError(f"{generate_output}: hypothesis ids are not 0..{len(chosen) - 1}; was generation cut short?")
    return [chosen[i] for i in range(len(chosen))]


def undo_subwords(line: str) -> str:
    return re.sub(r"(@@ )|(@@ ?$)", "", line)


def corpus_bleu(hypotheses: List[str], references: List[str], tokenize: str = "13a", lowercase: bool = False):
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    metric = BLEU(tokenize=tokenize, lowercase=lowercase)
    return metric.corpus_score(hypotheses, [references]), metric.get_signature()


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("generate_output")
    parser.add_argument("references", help="raw, detokenised reference file, one sentence a line")
    parser.add_argument("--lang", default="en", help="target language (for Moses detokenisation)")
    parser.add_argument("--detok", choices=["moses", "none"], default="moses", help="detokenise hypotheses (default: moses)")
    parser.add_argument("--tokenize", default="13a", help="sacreBLEU tokenizer")
    parser.add_argument("--lowercase", action="store_true")
    parser.add_argument("--hypotheses-out", help="also write the detokenised hypotheses here")
    args = parser.parse_args(argv)
    for path in (args.generate_output, args.references):
        if not Path(path).is_file():
            sys.exit(f"evaluate: error: no such file: {path}")
    hyps = read_hypotheses(args.generate_output, args.lang, args.detok)
    refs = Path(args.references).read_text(encoding="utf-8").splitlines()
    score, signature = corpus_bleu(hyps, refs, args.tokenize, args.lowercase)
    if args.hypotheses_out:
        Path(args.hypotheses_out).write_text("\n".join(hyps) + "\n", encoding="utf-8")
    print(f"BLEU = {score.score:.2f} ({score})")
    print(f"sacreBLEU signature: {signature}")
    return score.score


if __name__ == "__main__":
    main()
