"""``label_smoothed_cross_entropy_l0drop``: label-smoothed CE + lambda x expected L0 (L0Drop eq. 12).

Scaling: fairseq sums the loss over target tokens and divides the gradient by the
sample size (target tokens). The penalty is an expected open-gate rate (eq. 10,
padding excluded) times sample_size, so after fairseq's division the objective is
mean CE per target token + lambda x that rate. ``--l0-normalization`` chooses the rate:

* ``sentence`` (default, the official code): each sentence's expected number of open
  gates over its own length, averaged over the sentences of the batch;
* ``token``: the batch's expected open gates over its source tokens (a long sentence's
  gates weigh more, a short one's less).

Lambda values from the paper (0.1-1.5) mean the same with either.

Logged in train and valid: ``l0_loss`` (expected open-gate rate per source token, before
lambda; summed over the gated layers with --l0drop-every-layer), ``pruned`` (closed gates
g_hat = 0 / source tokens, the paper's "sparsity rate"; logged as ``sparsity`` before) and ``l0_lambda`` (the current, possibly
ramped, weight).
"""

import logging
from dataclasses import dataclass, field
from typing import Optional

import torch
from fairseq import metrics, utils
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)
from fairseq.dataclass import ChoiceEnum
from torch import Tensor

from ..errors import UsageError

logger = logging.getLogger(__name__)

NORMALIZATIONS = ("sentence", "token")
L0_NORMALIZATION_CHOICES = ChoiceEnum(list(NORMALIZATIONS))


@dataclass
class L0DropCriterionConfig(LabelSmoothedCrossEntropyCriterionConfig):
    l0_lambda: float = field(default=0.3, metadata={"help": "weight of the expected L0 penalty (paper: 0.2-0.3)"})
    l0_normalization: L0_NORMALIZATION_CHOICES = field(
        default="sentence",
        metadata={"help": "expected open-gate rate penalised: per sentence, then averaged over sentences "
                          "(the official code), or pooled over the batch's source tokens"},
    )
    l0_lambda_warmup_updates: int = field(
        default=0,
        metadata={"help": "ramp lambda linearly from 0 over this many updates (training from scratch); "
                          "0 uses lambda from the start (fine-tuning a converged model)"},
    )


class MissingGatesError(UsageError):
    """The L0-regularised criterion on a model without gates."""


def check_normalization(normalization: str) -> str:
    if normalization not in NORMALIZATIONS:
        raise UsageError(f"--l0-normalization must be 'sentence' or 'token', got {normalization!r}")
    return str(normalization)


def expected_open_rate(expected_l0: Tensor, padding: Optional[Tensor], normalization: str) -> Tensor:
    """The L0 penalty before lambda: an expected open-gate rate of the batch (a scalar).

    expected_l0: (B, T) expected L0 of each gate, 0 at padding; padding: (B, T) True at padding.
    ``sentence``: mean over sentences of (sum over the sentence / its length);
    ``token``: sum over the batch / number of real tokens.
    """
    real = torch.ones_like(expected_l0, dtype=torch.bool) if padding is None else ~padding
    open_gates = expected_l0.float().sum(dim=1)
    lengths = real.sum(dim=1)
    if check_normalization(normalization) == "token":
        return open_gates.sum() / lengths.sum().clamp(min=1)
    # the mean over sentences with a real token (0 for a batch of none), without asking the device
    # whether there is one (boolean indexing or any() would stall a GPU's host every training step)
    nonempty = lengths > 0
    per_sentence = (open_gates / lengths.clamp(min=1)).masked_fill(~nonempty, 0.0)
    return per_sentence.sum() / nonempty.sum().clamp(min=1)


@register_criterion("label_smoothed_cross_entropy_l0drop", dataclass=L0DropCriterionConfig)
class L0DropCriterion(LabelSmoothedCrossEntropyCriterion):
    MISSING_GATES = ("criterion label_smoothed_cross_entropy_l0drop needs a model with L0Drop gates: train "
                     "--arch transformer_sparse* with --l0drop (or use --criterion label_smoothed_cross_entropy)")

    def __init__(self, task, sentence_avg, label_smoothing, l0_lambda, l0_lambda_warmup_updates,
                 l0_normalization="sentence", ignore_prefix_size=0, report_accuracy=False):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        if l0_lambda < 0 or l0_lambda_warmup_updates < 0:
            raise UsageError("--l0-lambda and --l0-lambda-warmup-updates must be >= 0")
        self.l0_lambda = l0_lambda
        self.warmup_updates = l0_lambda_warmup_updates
        self.normalization = check_normalization(l0_normalization)
        logger.info(f"L0Drop penalty: lambda {l0_lambda} x expected open-gate rate per "
                    f"{'sentence, averaged over sentences' if self.normalization == 'sentence' else 'source token'}"
                    + (f", lambda ramped over {l0_lambda_warmup_updates} updates" if l0_lambda_warmup_updates else ""))

    def current_lambda(self, model) -> float:
        if self.warmup_updates == 0:
            return self.l0_lambda
        return self.l0_lambda * min(1.0, getattr(model, "num_updates", 0) / self.warmup_updates)

    def forward(self, model, sample, reduce=True):
        net_output = model(**sample["net_input"])
        extra = net_output[1]
        # fairseq builds the criterion from the task alone, so a model without gates shows at its
        # first batch, before any update or checkpoint
        if "l0drop_expected_l0" not in extra:
            raise MissingGatesError(self.MISSING_GATES)
        loss, nll_loss = self.compute_loss(model, net_output, sample, reduce=reduce)
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        padding = sample["net_input"]["src_tokens"].eq(self.padding_idx)
        src_tokens = (~padding).sum()
        gates_expected_l0 = extra["l0drop_expected_l0"][0]  # (B, S); a list, as every entry of fairseq's extra
        expected_l0 = gates_expected_l0.sum()
        weight = self.current_lambda(model)
        penalty = expected_open_rate(gates_expected_l0, padding, self.normalization)
        loss = loss + weight * penalty.to(loss.dtype) * sample_size
        logging_output = {
            "loss": loss.data,
            "nll_loss": nll_loss.data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
            "l0_open": expected_l0.data,
            "l0_closed": extra["l0drop_closed"][0].sum().data,
            "src_tokens": src_tokens.data,
            # logging outputs are summed over processes and --update-freq batches: log the
            # weight with a count, so reduce_metrics can average it back
            "l0_lambda": weight,
            "l0_batches": 1,
        }
        if self.report_accuracy:
            n_correct, total = self.compute_accuracy(model, net_output, sample)
            logging_output["n_correct"] = utils.item(n_correct.data)
            logging_output["total"] = utils.item(total.data)
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        src_tokens = sum(log.get("src_tokens", 0) for log in logging_outputs)
        src_tokens = float(src_tokens) if not torch.is_tensor(src_tokens) else src_tokens.float().item()
        if src_tokens > 0:
            open_gates = sum(float(log.get("l0_open", 0)) for log in logging_outputs)
            closed = sum(float(log.get("l0_closed", 0)) for log in logging_outputs)
            metrics.log_scalar("l0_loss", open_gates / src_tokens, src_tokens, round=4)
            metrics.log_scalar("pruned", closed / src_tokens, src_tokens, round=4)
        batches = sum(log.get("l0_batches", 0) for log in logging_outputs)
        if batches:
            weights = sum(float(log.get("l0_lambda", 0.0)) for log in logging_outputs)
            metrics.log_scalar("l0_lambda", weights / float(batches), weight=0, round=4)
