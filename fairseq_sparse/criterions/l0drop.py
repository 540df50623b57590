"""``label_smoothed_cross_entropy_l0drop``: label-smoothed CE + lambda x expected L0 (L0Drop eq. 12).

Scaling: fairseq sums the loss over target tokens and divides the gradient by the
sample size (target tokens). The penalty is the expected number of open gates (eq.
10, padding excluded) times sample_size / source tokens, so after fairseq's division
the objective is mean CE per target token + lambda x expected fraction of open
gates per source token, the normalisation of the official L0Drop code (lambda values
from the paper, 0.1-1.5, mean the same here).

Logged in train and valid: ``l0_loss`` (expected open-gate rate, before lambda),
``sparsity`` (closed gates g_hat = 0 / source tokens, the paper's definition) and
``l0_lambda`` (the current, possibly ramped, weight).
"""

from dataclasses import dataclass, field

import torch
from fairseq import metrics, utils
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)


@dataclass
class L0DropCriterionConfig(LabelSmoothedCrossEntropyCriterionConfig):
    l0_lambda: float = field(default=0.3, metadata={"help": "weight of the expected L0 penalty (paper: 0.2-0.3)"})
    l0_lambda_warmup_updates: int = field(
        default=0,
        metadata={"help": "ramp lambda linearly from 0 over this many updates (training from scratch); "
                          "0 uses lambda from the start (fine-tuning a converged model)"},
    )


class MissingGatesError(ValueError):
    pass


@register_criterion("label_smoothed_cross_entropy_l0drop", dataclass=L0DropCriterionConfig)
class L0DropCriterion(LabelSmoothedCrossEntropyCriterion):
    MISSING_GATES = ("criterion label_smoothed_cross_entropy_l0drop needs a model with L0Drop gates: train "
                     "--arch transformer_sparse* with --l0drop (or use --criterion label_smoothed_cross_entropy)")

    def __init__(self, task, sentence_avg, label_smoothing, l0_lambda, l0_lambda_warmup_updates,
                 ignore_prefix_size=0, report_accuracy=False):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        if getattr(task, "model_has_l0drop_gates", None) is False:
            raise MissingGatesError(self.MISSING_GATES)
        if l0_lambda < 0 or l0_lambda_warmup_updates < 0:
            raise ValueError("--l0-lambda and --l0-lambda-warmup-updates must be >= 0")
        self.l0_lambda = l0_lambda
        self.warmup_updates = l0_lambda_warmup_updates

    def current_lambda(self, model) -> float:
        if self.warmup_updates == 0:
            return self.l0_lambda
        return self.l0_lambda * min(1.0, getattr(model, "num_updates", 0) / self.warmup_updates)

    def forward(self, model, sample, reduce=True):
        net_output = model(**sample["net_input"])
        extra = net_output[1]
        if "l0drop_expected_l0" not in extra:  # a model from outside this plugin
            raise MissingGatesError(self.MISSING_GATES)
        loss, nll_loss = self.compute_loss(model, net_output, sample, reduce=reduce)
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        src_tokens = sample["net_input"]["src_tokens"].ne(self.padding_idx).sum()
        expected_l0 = extra["l0drop_expected_l0"].sum()
        weight = self.current_lambda(model)
        loss = loss + weight * expected_l0 * (sample_size / src_tokens.clamp(min=1))
        logging_output = {
            "loss": loss.data,
            "nll_loss": nll_loss.data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
            "l0_open": expected_l0.data,
            "l0_closed": extra["l0drop_closed"].sum().data,
            "src_tokens": src_tokens.data,
            "l0_lambda": weight,
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
            metrics.log_scalar("sparsity", closed / src_tokens, src_tokens, round=4)
        if logging_outputs:
            metrics.log_scalar("l0_lambda", logging_outputs[0].get("l0_lambda", 0.0), weight=0, round=4)
