"""Answers about fairseq's masks are read from the device once per mask, not once per call."""

import torch

from fairseq_sparse.bench.dispatch_counts import count
from fairseq_sparse.core.modules import attention_masks


def future_mask(length):
    return torch.triu(torch.full((length, length), float("-inf")), 1)


def test_a_view_of_a_seen_mask_is_answered_without_reading_the_device():
    """fairseq's decoder cuts its cached future mask afresh each step: the same answer, no host read."""
    cached = future_mask(16)
    assert attention_masks.is_future_mask(cached[:8, :8], 8, 8)
    again = count(lambda: attention_masks.is_future_mask(cached[:8, :8], 8, 8))
    assert again.synchronisations == []
    assert count(lambda: attention_masks.combine_masks(cached[:8, :8], None)).synchronisations != []  # first bias question
    assert count(lambda: attention_masks.combine_masks(cached[:8, :8], None)).synchronisations == []


def test_a_changed_or_new_mask_is_asked_again():
    mask = future_mask(6)
    assert attention_masks.is_future_mask(mask, 6, 6)
    mask[5, 0] = float("-inf")  # in place: the version counter moves on
    assert not attention_masks.is_future_mask(mask, 6, 6)
    assert attention_masks.is_future_mask(future_mask(6), 6, 6)
    biased = torch.zeros(4, 4)
    biased[1, 2] = 0.5
    assert attention_masks.combine_masks(biased, None)[1] is not None
    assert attention_masks.combine_masks(torch.zeros(4, 4), None)[1] is None


def test_answers_die_with_their_mask():
    before = len(attention_masks._ANSWERS)
    mask = future_mask(5)
    attention_masks.is_future_mask(mask, 5, 5)
    assert len(attention_masks._ANSWERS) == before + 1
    del mask
    assert len(attention_masks._ANSWERS) == before
