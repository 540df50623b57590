"""Half precision: every attention function, L0Drop and rule pattern in float16 and bfloat16.

The model is cast as fairseq's --fp16 / --bf16 / --memory-efficient-fp16 cast it (every
parameter and buffer in the half dtype). One training step through the real criterion, with
the loss multiplied by fairseq's default initial loss scale (128) as its fp16 optimisers do,
must give a finite loss and finite gradients; a beam search must give finite scores. The CLI
test trains through fairseq-train itself.
"""

from pathlib import Path

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

from attention_cases import CASES, NAMES
from fairseq_sparse.criterions.l0drop import L0DropCriterion
from fairseq_sparse.modules.prune_patterns import PATTERNS
from helpers import TinyTask, build_model, random_batch

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
LOSS_SCALE = 128.0  # fairseq's --fp16-init-scale default

# (row id, model options, uses the L0 criterion): every registered function where it may
# run (all three sublayers; self-attention-only patterns in the two self-attentions), both
# L0Drop variants and every rule pattern.
ROWS = [(name, {"encoder_attn_fn": name, "decoder_attn_fn": name,
                "cross_attn_fn": "softmax" if CASES[name].self_only else name, "attn_k": CASES[name].k}, False)
        for name in NAMES]
ROWS += [("l0drop", {"l0drop": True}, True), ("l0drop_every_layer", {"l0drop": True, "l0drop_every_layer": True}, True)]
ROWS += [(f"pattern_{p}", {"encoder_prune_pattern": p}, False) for p in PATTERNS]


def build(options, tmp_path):
    if options.get("encoder_prune_pattern") == "pos":
        table = Path(tmp_path) / "pos.txt"
        table.write_text("w1\nw2\nw3\n")
        options = {**options, "encoder_prune_pos_table": str(table)}
    return build_model(**options)


def criterion_for(uses_l0):
    task = TinyTask()
    if uses_l0:
        return L0DropCriterion(task, False, 0.1, l0_lambda=0.3, l0_lambda_warmup_updates=0)
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

    return LabelSmoothedCrossEntropyCriterion(task, False, 0.1)


def sample_of(batch):
    target = torch.cat([batch["prev_output_tokens"][:, 1:], batch["prev_output_tokens"][:, :1]], dim=1)
    return {"net_input": batch, "target": target, "ntokens": int(target.ne(1).sum())}


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("row,options,uses_l0", ROWS, ids=[r[0] for r in ROWS])
def test_training_step_and_beam_search_in_half_precision(row, options, uses_l0, dtype, tmp_path):
    model = build(options, tmp_path).to(DTYPES[dtype]).train()
    batch = random_batch(lengths=[7, 5, 9], tgt_lengths=[6, 3, 6], seed=5)
    torch.manual_seed(0)
    loss, _, logging_output = criterion_for(uses_l0)(model, sample_of(batch))
    assert torch.isfinite(loss), f"{row}: loss {loss}"
    (loss * LOSS_SCALE).backward()
    for name, parameter in model.named_parameters():
        if parameter.grad is not None:
            assert parameter.grad.dtype == DTYPES[dtype]
            assert torch.isfinite(parameter.grad).all(), f"{row}: non-finite gradient of {name}"
    if uses_l0:  # expected open gates, summed over the gated layers (two with --l0drop-every-layer)
        gated_layers = 2 if options.get("l0drop_every_layer") else 1
        assert 0 < float(logging_output["l0_open"]) <= gated_layers * float(logging_output["src_tokens"])

    model.eval()
    generator = SequenceGenerator([model], TinyTask().target_dictionary, beam_size=3, max_len_b=6, min_len=1)
    with torch.no_grad():
        hypotheses = generator.generate([model], {"net_input": {k: batch[k] for k in ("src_tokens", "src_lengths")}})
    for sentence in hypotheses:
        assert sentence and all(torch.isfinite(h["score"].float()) for h in sentence)
        assert all(torch.isfinite(h["positional_scores"].float()).all() for h in sentence)
