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
from fairseq_sparse.core.attention.norms import RMSNorm
from fairseq_sparse.core.criterions.l0drop import L0DropCriterion
from fairseq_sparse.core.modules.prune_patterns import PATTERNS
from helpers import TinyTask, build_model, random_batch
from test_end_to_end import train

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


def test_rmsnorm_passes_no_gradient_through_a_null_row_in_float16():
    """A ReLA row that attends to nothing is exactly zero: its gradient must not be gain / sqrt(eps)."""
    norm = RMSNorm(8, gated=True).half()
    x = torch.randn(3, 8).half()
    x[1] = 0.0
    x.requires_grad_(True)
    y = norm(x)
    assert (y[1] == 0).all()
    (y.float() * 1e3).sum().backward()  # a large upstream gradient, as under a loss scale
    assert torch.isfinite(x.grad).all() and (x.grad[1] == 0).all() and (x.grad[0] != 0).any()


def cli_groups():
    """(encoder, decoder, cross) functions: every registered name in some run, few runs."""
    self_only = [n for n in NAMES if CASES[n].self_only]
    others = [n for n in NAMES if not CASES[n].self_only]
    groups = []
    while self_only or others:
        encoder = self_only.pop(0) if self_only else others.pop(0)
        decoder = self_only.pop(0) if self_only else (others.pop(0) if others else encoder)
        cross = others.pop(0) if others else "softmax"
        groups.append((encoder, decoder, cross))
    return groups


CLI_RUNS = [(f"{e}+{d}+{c}", ["--encoder-attn-fn", e, "--decoder-attn-fn", d, "--cross-attn-fn", c, "--attn-k", "4"])
            for e, d, c in cli_groups()]
CLI_RUNS += [("l0drop", ["--l0drop", "--l0drop-every-layer", "--criterion", "label_smoothed_cross_entropy_l0drop",
                         "--label-smoothing", "0.1"]),
             ("pattern_group", ["--encoder-prune-pattern", "group"])]


def test_cli_runs_cover_every_function():
    covered = {name for run_id, _ in CLI_RUNS for name in run_id.split("+")}
    assert set(NAMES) <= covered


@pytest.mark.parametrize("run_id,options", CLI_RUNS, ids=[r[0] for r in CLI_RUNS])
def test_fairseq_train_fp16_keeps_the_default_loss_scale(run_id, options, bible, tmp_path):
    """fairseq-train --fp16 (memory-efficient: the variant that runs on CPU) at the default
    initial loss scale: no overflow in the first updates, finite losses, scale still 128."""
    output = train(bible, tmp_path, "--fp16", "--memory-efficient-fp16", "--no-save", *options, updates=4)
    assert "gradient overflow" not in output, output[-3000:]
    updates = [line for line in output.splitlines() if "| train_inner |" in line]
    assert len(updates) == 4, output[-3000:]
    for line in updates:
        assert "loss_scale=128," in line and "loss=nan" not in line and "loss=inf" not in line, line


BF16_RUNS = [CLI_RUNS[0], *[run for run in CLI_RUNS if run[0] in ("l0drop", "pattern_group")]]


@pytest.mark.parametrize("run_id,options", BF16_RUNS, ids=[r[0] for r in BF16_RUNS])
def test_bf16_training_through_the_cli(run_id, options, bible, tmp_path):
    """fairseq 0.12 reads --bf16 as "on a TPU" (fairseq-train --bf16 --cpu dies in torch_xla);
    python -m fairseq_sparse.train takes fairseq-train's arguments and trains in bfloat16 on the
    device asked for: finite losses, nothing else changed."""
    output = train(bible, tmp_path, "--bf16", "--memory-efficient-bf16", "--no-save", *options, updates=3,
                   tool="fairseq_sparse.train")
    updates = [line for line in output.splitlines() if "| train_inner |" in line]
    assert len(updates) == 3, output[-3000:]
    for line in updates:
        assert "loss=nan" not in line and "loss=inf" not in line, line


def test_bf16_entry_point_keeps_fairseq_options_but_not_the_tpu(bible):
    from fairseq_sparse.train import parse

    base = [str(bible / "bin"), "--arch", "transformer_sparse_mini", "--optimizer", "adam", "--lr", "0.001", "--cpu"]
    cfg = parse([*base, "--bf16"])
    assert cfg.common.bf16 and not cfg.common.tpu and cfg.optimization.lr == [0.001]
    assert parse([*base, "--bf16", "--tpu"]).common.tpu  # a TPU run asks for one
    assert not parse(base).common.bf16
