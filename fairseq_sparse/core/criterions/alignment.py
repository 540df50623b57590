"""fairseq's alignment criterion, safe with attention functions that give exact zeros.

``label_smoothed_cross_entropy_with_alignment`` (Garg et al., 2019; fairseq's transformer_align)
adds -log p of the attention weight at each reference alignment link. Top-k, sparsemax, the
entmax family, the patterns and ReLA give exactly 0 to keys outside their selection, and log 0
makes the loss infinite and every gradient NaN. Here the weights are floored at the smallest
normal float before the log: the loss stays finite, and a link the function gives weight 0
contributes no gradient (the function's own gradient there is 0 as well). Weights above the
floor, every weight softmax gives in practice, are untouched, so softmax models train exactly
as with fairseq's criterion.

The plugin registers this class under fairseq's own criterion name, so
``--criterion label_smoothed_cross_entropy_with_alignment`` needs no change.
"""

import torch
from fairseq.criterions import CRITERION_REGISTRY
from fairseq.criterions.label_smoothed_cross_entropy_with_alignment import (
    LabelSmoothedCrossEntropyCriterionWithAlignment,
)

NAME = "label_smoothed_cross_entropy_with_alignment"


class ZeroSafeAlignmentCriterion(LabelSmoothedCrossEntropyCriterionWithAlignment):
    def compute_alignment_loss(self, sample, net_output):
        attn = net_output[1]["attn"][0]
        floored = attn.clamp(min=torch.finfo(attn.dtype).tiny)
        return super().compute_alignment_loss(sample, (net_output[0], {**net_output[1], "attn": [floored]}))


# fairseq's registry refuses a second registration of a name; the class behind it is replaced instead
CRITERION_REGISTRY[NAME] = ZeroSafeAlignmentCriterion
