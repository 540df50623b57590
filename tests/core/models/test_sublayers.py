"""Every attention function in every sublayer of a real transformer_sparse model.

incremental decoding == full forward, padding does not change a sentence's outputs (both with
layer normalisation after each sublayer, fairseq's default, and before it, as
``--encoder-normalize-before --decoder-normalize-before`` set it), training runs the sparse
function (not a fused dense path), half precision is finite.
"""

import dataclasses
import unittest.mock

import pytest
import torch

from attention_cases import CASES, NAMES
from fairseq_sparse.core.modules.sparse_multihead_attention import SparseMultiheadAttention
from helpers import build_model, random_batch

SUBLAYERS = ("encoder", "decoder", "cross")
GRID = [(name, sublayer) for name in NAMES for sublayer in SUBLAYERS if not (sublayer == "cross" and CASES[name].self_only)]
NORMS = pytest.mark.parametrize("normalize_before", [False, True], ids=["post-norm", "pre-norm"])


def model_with(name, sublayer, normalize_before=False, **kwargs):
    model = build_model(**{f"{sublayer}_attn_fn": name, "attn_k": CASES[name].k}, encoder_normalize_before=normalize_before,
                        decoder_normalize_before=normalize_before, **kwargs)
    return model.eval()


def full_forward(model, batch):
    logits, extra = model(**batch)
    return logits, extra["attn"][0]


def incremental_forward(model, batch):
    encoder_out = model.encoder(batch["src_tokens"], src_lengths=batch["src_lengths"])
    state = {}
    steps, attns = [], []
    for t in range(batch["prev_output_tokens"].size(1)):
        logits, extra = model.decoder(batch["prev_output_tokens"][:, : t + 1], encoder_out=encoder_out, incremental_state=state)
        steps.append(logits)
        attns.append(extra["attn"][0])
    return torch.cat(steps, dim=1), torch.cat(attns, dim=1)


@NORMS
@pytest.mark.parametrize("name,sublayer", GRID)
def test_incremental_decoding_equals_full_forward(name, sublayer, normalize_before):
    model = model_with(name, sublayer, normalize_before)
    batch = random_batch(lengths=[7, 5, 9], tgt_lengths=[6, 6, 6])
    with torch.no_grad():
        full_logits, full_attn = full_forward(model, batch)
        inc_logits, inc_attn = incremental_forward(model, batch)
    assert (full_logits - inc_logits).abs().max() <= 1e-5
    assert (full_attn - inc_attn).abs().max() <= 1e-5


@pytest.mark.parametrize("order", [[1, 1, 3, 2], [2, 3]], ids=["within-sentence", "sentence-finished"])
@pytest.mark.parametrize("name,sublayer", GRID)
def test_incremental_decoding_survives_beam_reordering(name, sublayer, order):
    """Reordering the cache as beam search does equals decoding the reordered hypotheses.

    Rows are 2 sentences x beam 2. Beam search permutes hypotheses within a sentence
    and drops finished sentences; it never moves a hypothesis to another sentence.
    """
    model = model_with(name, sublayer)
    model.decoder.set_beam_size(2)  # as fairseq's SequenceGenerator does
    sentences = random_batch(lengths=[7, 5], tgt_lengths=[5, 5], seed=3)
    beams = torch.tensor([0, 0, 1, 1])
    batch = {key: value.index_select(0, beams) for key, value in sentences.items()}
    batch["prev_output_tokens"] = random_batch(lengths=[7] * 4, tgt_lengths=[5] * 4, seed=4)["prev_output_tokens"]
    order = torch.tensor(order)
    reordered = {key: value.index_select(0, order) for key, value in batch.items()}
    with torch.no_grad():
        expected, _ = full_forward(model, reordered)
        encoder_out = model.encoder(batch["src_tokens"], src_lengths=batch["src_lengths"])
        state = {}
        for t in range(2):  # the incremental decoder consumes one new token per call
            model.decoder(batch["prev_output_tokens"][:, : t + 1], encoder_out=encoder_out, incremental_state=state)
        model.decoder.reorder_incremental_state_scripting(state, order)
        encoder_out = model.encoder.reorder_encoder_out(encoder_out, order)
        prev = reordered["prev_output_tokens"]
        steps = [model.decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=state)[0] for t in range(2, 5)]
    assert (torch.cat(steps, dim=1) - expected[:, 2:5]).abs().max() <= 1e-5


@NORMS
@pytest.mark.parametrize("name,sublayer", GRID)
def test_padding_does_not_change_a_sentence(name, sublayer, normalize_before):
    model = model_with(name, sublayer, normalize_before)
    batch = random_batch(lengths=[4, 9, 6], tgt_lengths=[3, 7, 5], seed=1)
    with torch.no_grad():
        batched, batched_attn = full_forward(model, batch)
        for i, (n, m) in enumerate(zip([4, 9, 6], [3, 7, 5])):
            alone = {
                "src_tokens": batch["src_tokens"][i : i + 1, -n:],
                "src_lengths": batch["src_lengths"][i : i + 1],
                "prev_output_tokens": batch["prev_output_tokens"][i : i + 1, :m],
            }
            logits, attn = full_forward(model, alone)
            assert (batched[i, :m] - logits[0]).abs().max() <= 1e-5
            src_len = batch["src_tokens"].size(1)
            assert (batched_attn[i, :m, src_len - n :] - attn[0]).abs().max() <= 1e-5
            assert (batched_attn[i, :m, : src_len - n] == 0).all()


@pytest.mark.parametrize("name,sublayer", GRID)
def test_training_runs_the_chosen_function_with_gradients(name, sublayer):
    model = model_with(name, sublayer).train()
    calls = []
    attention = next(m for m in model.modules() if isinstance(m, SparseMultiheadAttention) and m.attn_fn == name)
    # A method registered with a selection runs it (then the fused kernel); any other runs its function.
    spec = attention.spec
    hook = "selection" if spec.selection is not None else "fn"
    original = getattr(spec, hook)
    attention.spec = dataclasses.replace(spec, **{hook: lambda *args: calls.append(1) or original(*args)})
    batch = random_batch(lengths=[7, 5], tgt_lengths=[6, 4], seed=2)
    torch.manual_seed(0)
    logits, _ = model(**batch)
    logits.logsumexp(-1).sum().backward()
    assert calls, f"{name} was not called in training ({sublayer})"
    grads = [p.grad for p in attention.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any((g != 0).any() for g in grads)


@pytest.mark.parametrize("name", NAMES)
def test_bfloat16_forward_is_finite_in_every_sublayer(name):
    cross = "softmax" if CASES[name].self_only else name
    model = build_model(encoder_attn_fn=name, decoder_attn_fn=name, cross_attn_fn=cross, attn_k=CASES[name].k)
    model = model.eval().to(torch.bfloat16)
    batch = random_batch(lengths=[7, 5, 9], tgt_lengths=[6, 3, 6])
    with torch.no_grad():
        logits, extra = model(**batch)
        inc_logits, _ = incremental_forward(model, batch)
    assert torch.isfinite(logits.float()).all() and torch.isfinite(inc_logits.float()).all()
    assert torch.isfinite(extra["attn"][0].float()).all()


@pytest.mark.parametrize("name", [n for n in NAMES if CASES[n].null_attention and CASES[n].output_norm])
def test_null_attention_stays_exactly_zero_through_the_output_norm(name):
    attention = SparseMultiheadAttention(16, 4, attn_fn=name, self_attention=True).eval()
    with torch.no_grad():
        attention.k_proj.weight.zero_()
        attention.k_proj.bias.fill_(1.0)
        attention.q_proj.weight.zero_()
        attention.q_proj.bias.fill_(-1.0)  # every score negative -> null attention
        x = torch.randn(5, 2, 16)
        out, weights = attention(x, x, x, need_head_weights=True)
        assert (weights == 0).all()
        # output = out_proj(norm(0)) = out_proj bias exactly
        assert torch.equal(out, attention.out_proj.bias.expand_as(out))


def test_sparse_attention_is_used_in_every_sublayer():
    model = build_model(encoder_attn_fn="topk", decoder_attn_fn="hard", cross_attn_fn="rela_g", attn_k=5, decoder_attn_k=2)
    fns = {}
    for name, module in model.named_modules():
        if isinstance(module, SparseMultiheadAttention):
            fns[name] = (module.attn_fn, module.attn_k)
    assert fns["encoder.layers.0.self_attn"] == ("topk", 5)
    assert fns["decoder.layers.1.self_attn"] == ("hard", 2)
    assert fns["decoder.layers.1.encoder_attn"] == ("rela_g", 5)
    assert not any(type(m).__name__ == "MultiheadAttention" for m in model.modules())


def test_positions_count_real_tokens_in_full_and_incremental_passes():
    """Functions registered with uses_positions see the same positions for a sentence
    whether it is left-padded, alone, or decoded step by step."""
    model = build_model()
    seen = {}
    for name, module in model.named_modules():
        if isinstance(module, SparseMultiheadAttention):
            def record(*args, _name=name, _fn=module.spec.fn, _select=module.spec.selection):
                ctx = args[-1]  # fn(scores, values, mask, ctx) or, on the fused path, selection(scores, mask, ctx)
                seen.setdefault(_name, []).append((ctx.query_positions.clone(), ctx.key_positions.clone()))
                return (_fn if len(args) == 4 else _select)(*args)

            module.spec = dataclasses.replace(module.spec, uses_positions=True, fn=record, selection=record)
            module.uses_positions = True  # the module's copy of the flag (TorchScript reads no spec)
    batch = random_batch(lengths=[3, 5], tgt_lengths=[4, 4])
    with torch.no_grad():
        model.eval()(**batch)
        full = {k: v[0] for k, v in seen.items()}
        seen.clear()
        incremental_forward(model, batch)
    enc_q, enc_k = full["encoder.layers.0.self_attn"]
    assert enc_k.tolist() == [[[-1, -1, 0, 1, 2]], [[0, 1, 2, 3, 4]]]
    assert torch.equal(enc_q, enc_k)
    dec_q, dec_k = full["decoder.layers.0.self_attn"]
    assert dec_q.tolist() == [[[0, 1, 2, 3]]] and dec_k.tolist() == [[[0, 1, 2, 3]]]
    cross_q, cross_k = full["decoder.layers.1.encoder_attn"]
    assert cross_q.tolist() == [[[0, 1, 2, 3]]] and torch.equal(cross_k, enc_k)
    for name in ("decoder.layers.0.self_attn", "decoder.layers.1.encoder_attn"):
        steps = seen[name]
        assert [q.expand(2, 1, 1).flatten().tolist() for q, _ in steps] == [[t, t] for t in range(4)]
        assert [k.size(-1) for _, k in steps] == ([1, 2, 3, 4] if "self" in name else [5] * 4)


def test_self_attention_only_functions_are_rejected_in_cross_attention():
    from fairseq_sparse.core.attention import get_attention

    spec = dataclasses.replace(get_attention("softmax"), self_attention_only=True)
    with unittest.mock.patch("fairseq_sparse.core.modules.sparse_multihead_attention.get_attention", return_value=spec):
        SparseMultiheadAttention(16, 4, attn_fn="softmax", self_attention=True)
        with pytest.raises(ValueError, match="self-attention only"):
            SparseMultiheadAttention(16, 4, attn_fn="softmax", encoder_decoder_attention=True)


CROSS_SELF = [name for name in NAMES if not CASES[name].self_only]


@pytest.mark.parametrize("name", CROSS_SELF)
def test_cross_self_attention_decodes_incrementally_as_the_full_pass(name):
    """fairseq's --cross-self-attention: the decoder's self-attention attends over the source states and the
    target prefix in one distribution; the first step caches the source keys, later steps add one key.
    Incremental decoding equals the full pass, and padding changes nothing (beam search's cache reorder:
    test_fairseq_features)."""
    model = build_model(decoder_attn_fn=name, attn_k=CASES[name].k, cross_self_attention=True).eval()
    attention = model.decoder.layers[0].self_attn
    assert attention.attn_fn == name and not attention.self_attention
    batch = random_batch(lengths=[7, 5, 9], tgt_lengths=[6, 4, 6], seed=5)
    # stock fairseq's layer too gives padded target positions other outputs step by step than in the full
    # pass (their keys are masked differently); no real position reads them
    real = batch["prev_output_tokens"].ne(1)
    with torch.no_grad():
        full_logits, full_attn = full_forward(model, batch)
        inc_logits, inc_attn = incremental_forward(model, batch)
        assert (full_logits - inc_logits)[real].abs().max() <= 1e-5
        assert (full_attn - inc_attn)[real].abs().max() <= 1e-5
        alone = {"src_tokens": batch["src_tokens"][1:2, -5:], "src_lengths": batch["src_lengths"][1:2],
                 "prev_output_tokens": batch["prev_output_tokens"][1:2, :4]}
        assert (full_forward(model, alone)[0][0] - full_logits[1, :4]).abs().max() <= 1e-5


@pytest.mark.parametrize("name", [name for name in NAMES if CASES[name].self_only])
def test_cross_self_attention_is_refused_for_patterns_over_one_sequence(name):
    from fairseq_sparse.core.errors import UsageError

    with pytest.raises(UsageError, match=rf"--cross-self-attention: decoder self-attention function '{name}' is a pattern"):
        build_model(decoder_attn_fn=name, attn_k=CASES[name].k, cross_self_attention=True)
