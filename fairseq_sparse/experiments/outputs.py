"""Reading the table's command outputs: BLEU of a decode, decode and training speeds, training-log
values (epochs, wall clock, validation loss), the L0Drop pruning count and attention statistics.
The measures (``measures.py``) turn these into one seed's value of a cell."""

from __future__ import annotations

import csv
import re
import statistics
from pathlib import Path
from typing import Dict, List, Tuple

from fairseq_sparse.experiments.errors import StepError
from fairseq_sparse.experiments.plan_view import PlanView
from fairseq_sparse.experiments.table import Column, Dataset



def compound_split(line: str) -> str:
    """Vaswani et al.'s compound splitting for WMT14 En-De (tensor2tensor's get_ende_bleu.sh)."""
    return re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", line)


def bleu(plan: PlanView, ds: Dataset, col: Column, generated: Path) -> Tuple[float, str]:
    """BLEU of one decode by the column's metric, with sacreBLEU's signature."""
    from fairseq_sparse import evaluate

    data = plan.data_dir(ds)
    if col.metric == "tokenized":
        hyps = evaluate.read_hypotheses(str(generated), ds.tgt, detok="none")
        tok = data / f"{col.split}.tok.{ds.tgt}"
        if tok.is_file():
            refs = tok.read_text(encoding="utf-8").splitlines()
        elif ds.post_process in ("subword_nmt", "none"):  # the model's own text is Moses-tokenised (+ BPE)
            refs = [evaluate.undo_subwords(line) for line in (data / f"{col.split}.{ds.tgt}").read_text(encoding="utf-8").splitlines()]
        else:  # characters / sentencepiece: the text is untokenised, so Moses-tokenise both sides
            from sacremoses import MosesTokenizer

            moses = MosesTokenizer(lang=ds.tgt)
            refs = (data / f"{col.split}.raw.{ds.tgt}").read_text(encoding="utf-8").splitlines()
            hyps, refs = ([moses.tokenize(s, return_str=True, escape=False) for s in side] for side in (hyps, refs))
        if col.compound_split:
            hyps, refs = [compound_split(h) for h in hyps], [compound_split(r) for r in refs]
        score, signature = evaluate.corpus_bleu(hyps, refs, tokenize="none", lowercase=col.lowercase)
        return score.score, f"{signature} (Moses-tokenised{', compound-split' if col.compound_split else ''})"
    refs = (data / f"{col.split}.raw.{ds.tgt}").read_text(encoding="utf-8").splitlines()
    if col.metric == "d_bleu":
        blocks = evaluate.read_hypotheses(str(generated), ds.tgt, detok="none")
        documents = evaluate.documents_from_blocks(blocks, evaluate.read_block_documents(str(data / f"{col.split}.blocks.tsv")),
                                                   evaluate.detokenizer(ds.tgt, ds.detok))
        score, signature = evaluate.corpus_bleu(documents, refs, col.sacrebleu_tokenize, col.lowercase)
        return score.score, f"{signature} (d-BLEU over {len(documents)} documents)"
    hyps = evaluate.read_hypotheses(str(generated), ds.tgt, detok=ds.detok)
    score, signature = evaluate.corpus_bleu(hyps, refs, col.sacrebleu_tokenize, col.lowercase)
    return score.score, str(signature)


def train_words_per_second(log: Path) -> float:
    """Median words/s of the logged training intervals (the first one, warm-up, left out when there are more)."""
    rates = [float(m.group(1)) for line in log.read_text(encoding="utf-8").splitlines()
             if "train_inner" in line or "| train |" in line for m in [re.search(r"\bwps (\d+(?:\.\d+)?)", line)] if m]
    if not rates:
        raise StepError(f"{log}: no 'wps' in the training log; lower --log-interval")
    return statistics.median(rates[1:] if len(rates) > 2 else rates)


def trained_params(log: Path) -> int:
    match = re.search(r"num\. (?:shared )?model params: [\d,]+ \(num\. trained: ([\d,]+)\)", log.read_text(encoding="utf-8"))
    if not match:
        raise StepError(f"{log}: no parameter count in the training log")
    return int(match.group(1).replace(",", ""))


VALID_LOSS = re.compile(r"\| valid on 'valid' subset \| loss ([\d.]+)")
EPOCH_VALID_LOSS = re.compile(r"epoch (\d+) \| valid on 'valid' subset \| loss ([\d.]+)")
EPOCH_TRAIN_LOSS = re.compile(r"\| train \| epoch (\d+) \| loss ([\d.]+)")  # the epoch's mean, not train_inner's
EPOCH_DONE = re.compile(r"end of epoch (\d+)")
WALL = re.compile(r"\bwall[= ](\d+(?:\.\d+)?)")  # not train_wall


def logged_values(log: Path, pattern: re.Pattern, missing: str) -> List[float]:
    """Every value ``pattern`` captures in a training log, in order; StepError naming ``missing`` if none."""
    values = [float(m.group(1)) for m in pattern.finditer(log.read_text(encoding="utf-8"))]
    if not values:
        raise StepError(f"{log}: {missing} in the training log")
    return values


def trained_epochs(log: Path) -> int:
    """The number of epochs training ran (early stopping by --patience ends it before --max-epoch)."""
    return int(max(logged_values(log, EPOCH_DONE, "no 'end of epoch' line")))


def training_seconds(log: Path) -> float:
    """fairseq's wall-clock time of a training run, validation included: its last ``wall`` value, summed
    over the legs of a run that was stopped and resumed (fairseq restarts the clock; the log is appended)."""
    walls = logged_values(log, WALL, "no 'wall' time")
    ends = [a for a, b in zip(walls, walls[1:]) if b < a]  # the clock went back: the previous leg ended at a
    return sum(ends) + walls[-1]


# the table runner's line in the log of a training it ran beside others (--jobs)
SIDE_BY_SIDE_MARK = "fairseq_sparse.tables: this leg trained side by side with other jobs"


# the Slurm launcher's first line in the log of a step whose running time a column reads (a decode speed)
TIMED_ON_NODE_MARK = "fairseq_sparse.tables: timed alone on node"


def timed_on_node(log: Path) -> str:
    """The cluster node a timed step ran on, alone (``--exclusive``), or "" where it ran on this machine."""
    if not log.is_file():
        return ""
    with open(log, encoding="utf-8", errors="replace") as f:
        first = f.readline()
    return first[len(TIMED_ON_NODE_MARK):].split()[0] if first.startswith(TIMED_ON_NODE_MARK) else ""


def trained_side_by_side(log: Path) -> bool:
    """Whether any leg of the run shared the machine with other trainings (its clock then ran slower)."""
    return log.is_file() and SIDE_BY_SIDE_MARK in log.read_text(encoding="utf-8", errors="replace")


def valid_loss_per_epoch(log: Path) -> Dict[int, float]:
    """{epoch: validation loss} of a training run ({} without validation); an epoch logged twice (a
    leg killed between validating and saving, run again) keeps its last value."""
    return _per_epoch(EPOCH_VALID_LOSS, log)


def train_loss_per_epoch(log: Path) -> Dict[int, float]:
    """{epoch: mean training loss over the epoch's updates, dropout on} of a training run: beside the
    validation loss it tells a gap of fit (both higher) from one of generalisation (training lower),
    for a model that computes the same in training (hard retrieval samples there)."""
    return _per_epoch(EPOCH_TRAIN_LOSS, log)


def _per_epoch(pattern: "re.Pattern[str]", log: Path) -> Dict[int, float]:
    if not log.is_file():
        return {}
    return {int(m.group(1)): float(m.group(2)) for m in pattern.finditer(log.read_text(encoding="utf-8", errors="replace"))}


def best_valid_loss(log: Path) -> float:
    """The lowest validation loss (base 2, fairseq's) of a training run."""
    return min(logged_values(log, VALID_LOSS, "no validation line (training ran with --disable-validation?)"))


def alignment_error_rate(csv_path: Path, mode: str, over: str) -> float:
    """AER (%) from the aer analysis' CSV, averaged over layers: of each layer's mean attention (``over``
    "layer": ReLA's AoL) or of its best head ("best_head": AoH), for ``mode`` normal or shifted attention."""
    from fairseq_sparse.analysis.alignment import aer_by_layer

    with open(csv_path, encoding="utf-8") as f:
        rows = [{"mode": r["mode"], "layer": int(r["layer"]), "head": r["head"], "aer": float(r["aer"])}
                for r in csv.DictReader(f)]
    table = aer_by_layer(rows, mode)
    if not table:
        raise StepError(f"{csv_path}: no {mode} attention rows")
    column = 3 if over == "layer" else 2
    return 100.0 * statistics.mean(layer[column] for layer in table)


def encoder_outputs_pruned(output: Path) -> float:
    """% of source encodings pruned, from ``python -m fairseq_sparse.l0drop_pruned``'s output."""
    match = re.search(r"(\d+) of (\d+) source encodings pruned", output.read_text(encoding="utf-8"))
    if not match:
        raise StepError(f"{output}: no line of pruned encodings")
    return 100.0 * int(match.group(1)) / max(int(match.group(2)), 1)


def zero_weights(csv_path: Path) -> float:
    """% of attention weights exactly 0, over every sublayer, layer and head."""
    with open(csv_path, encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    weights = sum(int(r["weights"]) for r in rows)
    # the share column is "zero_weights"; files written before the rename call it "sparsity"
    share = "zero_weights" if rows and "zero_weights" in rows[0] else "sparsity"
    return 100.0 * sum(float(r[share]) * int(r["weights"]) for r in rows) / max(weights, 1)


def null_rate(csv_path: Path) -> float:
    """% of queries whose attention weights are all 0 (ReLA's null attention), over every sublayer, layer and head."""
    with open(csv_path, encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    queries = sum(int(r["queries"]) for r in rows)
    return 100.0 * sum(float(r["null_rate"]) * int(r["queries"]) for r in rows) / max(queries, 1)
