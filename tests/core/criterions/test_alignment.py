"""fairseq's alignment criterion (transformer_align's supervision) with every attention function in cross-attention.

Functions that give exact zeros (top-k, sparsemax, entmax, the patterns, ReLA) made fairseq's
criterion infinite and its gradients NaN; the plugin's class under the same name keeps both finite
and, for softmax, equals fairseq's own.
"""

import math

import pytest
import torch
from fairseq.criterions import CRITERION_REGISTRY
from fairseq.criterions.label_smoothed_cross_entropy_with_alignment import (
    LabelSmoothedCrossEntropyCriterionWithAlignment,
)

from attention_cases import CASES, NAMES
from fairseq_sparse.core.criterions.alignment import NAME, ZeroSafeAlignmentCriterion
from helpers import TinyTask, build_model, random_batch

CROSS = [name for name in NAMES if not CASES[name].self_only]


def alignment_sample():
    batch = random_batch(lengths=[9, 6], tgt_lengths=[5, 4], seed=3)
    target = batch["prev_output_tokens"].roll(-1, dims=1)
    tgt_len = target.size(1)
    # every target position of both sentences aligned to the first and the last real source token
    links = [(src, b * tgt_len + t) for b, n in enumerate([5, 4]) for t in range(n) for src in (9 - [9, 6][b], 8)]
    return {"net_input": batch, "target": target, "ntokens": int(target.ne(1).sum()),
            "alignments": torch.tensor(links), "align_weights": torch.ones(len(links))}


def loss_and_gradients(criterion_class, name):
    model = build_model(cross_attn_fn=name, attn_k=1, alignment_layer=1, seed=5).train()
    criterion = criterion_class(TinyTask(), sentence_avg=False, label_smoothing=0.1, alignment_lambda=0.5)
    loss, _, logged = criterion(model, alignment_sample())
    loss.backward()
    return loss.item(), logged["alignment_loss"], [p.grad for p in model.parameters() if p.grad is not None]


def test_the_plugin_serves_fairseqs_criterion_name():
    assert CRITERION_REGISTRY[NAME] is ZeroSafeAlignmentCriterion


@pytest.mark.parametrize("name", CROSS)
def test_alignment_loss_and_gradients_are_finite(name):
    loss, alignment_loss, grads = loss_and_gradients(ZeroSafeAlignmentCriterion, name)
    assert math.isfinite(loss) and math.isfinite(alignment_loss)
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_fairseqs_own_criterion_fails_where_a_link_has_weight_zero():
    """What the plugin's class fixes: top-k with k = 1 gives most links weight 0."""
    loss, _, grads = loss_and_gradients(LabelSmoothedCrossEntropyCriterionWithAlignment, "topk")
    assert not math.isfinite(loss) or not all(torch.isfinite(g).all() for g in grads)


def test_softmax_trains_exactly_as_with_fairseqs_criterion():
    ours, theirs = (loss_and_gradients(c, "softmax") for c in (ZeroSafeAlignmentCriterion,
                                                                 LabelSmoothedCrossEntropyCriterionWithAlignment))
    assert ours[0] == theirs[0] and ours[1] == theirs[1]
    assert all(torch.equal(a, b) for a, b in zip(ours[2], theirs[2]))
