"""L0Drop: hard-concrete gates, the L0 criterion and the count-aware compressed decoder."""


import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

from fairseq_sparse.core.criterions.l0drop import L0DropCriterion, MissingGatesError, expected_open_rate
from fairseq_sparse.core.modules.l0drop import (
    HardConcreteGate,
    compress_memory,
    counted_padding,
    expected_gate,
    probability_open,
    sample_gate,
)

from helpers import TinyTask, build_model, close_some_gates, random_batch


@pytest.mark.parametrize("log_alpha", [-3.0, -1.0, 0.0, 0.5, 2.0])
def test_closed_form_probabilities_match_the_sampler(log_alpha):
    torch.manual_seed(0)
    samples = sample_gate(torch.full((400_000,), log_alpha))
    assert ((samples >= 0) & (samples <= 1)).all()
    assert abs((samples == 0).float().mean().item() - (1 - probability_open(torch.tensor(log_alpha)).item())) < 0.004
    # the stretched-and-clipped sample's mean lies between 0 and 1 and is exactly 1 far to the right
    assert expected_gate(torch.tensor(10.0)).item() == 1.0 and expected_gate(torch.tensor(-10.0)).item() == 0.0


def test_open_init_starts_every_gate_open_and_gradients_reach_the_gate_weights():
    gate = HardConcreteGate(8, "open")
    x = torch.randn(5, 3, 8)
    padding = torch.zeros(3, 5, dtype=torch.bool)
    padding[0, :2] = True
    gated, out = gate.eval()(x, padding)
    assert (out.gates[~padding] == 1).all() and (out.gates[padding] == 0).all() and not out.closed.any()
    assert torch.equal(gated.transpose(0, 1)[~padding], x.transpose(0, 1)[~padding])
    gate.train()
    torch.manual_seed(1)
    gated, out = gate(x, padding)
    (gated.pow(2).sum() + out.expected_l0.sum()).backward()
    assert gate.log_alpha.weight.grad.abs().sum() > 0 and gate.log_alpha.bias.grad.abs() > 0
    assert (out.expected_l0[padding] == 0).all()


def test_official_init_is_glorot_uniform_with_zero_bias():
    torch.manual_seed(0)
    gate = HardConcreteGate(512)
    bound = (6.0 / (512 + 1)) ** 0.5  # Glorot uniform of a (1, 512) weight: the official variance scaling, fan_avg
    weight = gate.log_alpha.weight
    assert gate.log_alpha.bias.item() == 0.0
    assert weight.abs().max().item() <= bound and weight.abs().max().item() > 0.95 * bound
    assert abs(weight.var().item() - bound ** 2 / 3) < 0.15 * bound ** 2 / 3
    # on layer-normalised encodings log alpha spreads around 0 (std about 1.4): most gates' g_hat lies
    # strictly inside (0, 1), where the penalty's gradient is strong, instead of every gate at 1
    x = torch.nn.functional.layer_norm(torch.randn(40, 8, 512), (512,))
    _, out = gate.eval()(x, None)
    assert 0.6 < out.expected_l0.mean().item() < 0.95
    assert 0.75 < ((out.gates > 0) & (out.gates < 1)).float().mean().item() < 0.99


def test_unknown_gate_init_is_one_clear_error():
    with pytest.raises(ValueError, match="--l0drop-gate-init must be one of official, open, got 'closed'"):
        HardConcreteGate(8, "closed")


def test_compressed_memory_layout():
    x = torch.arange(1, 13, dtype=torch.float).view(4, 3, 1).expand(4, 3, 2).contiguous()  # (T=4, B=3, C=2)
    gates = torch.tensor([[1.0, 0.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 1.0, 1.0]])
    padding = torch.tensor([[False] * 4, [True, True, False, False], [True, False, False, False]])
    memory, counts = compress_memory(x, gates, padding)
    assert counts.tolist() == [[2, 1, 1, 0], [2, 0, 0, 0], [0, 1, 1, 1]]
    assert counted_padding(counts)[0].tolist() == (counts == 0).tolist()
    assert counted_padding(padding) == (padding, None)
    assert memory[:, 0, 0].tolist() == [0, 1, 7, 0]  # zero slot, then tokens 0 and 2 of sentence 0
    assert memory[:, 2, 0].tolist() == [0, 6, 9, 12]


def generate(model, batch, beam, compress):
    model.encoder.compress = compress
    generator = SequenceGenerator([model], TinyTask().target_dictionary, beam_size=beam, max_len_b=8, min_len=1)
    with torch.no_grad():
        return generator.generate([model], {"net_input": {k: batch[k] for k in ("src_tokens", "src_lengths")}})


CROSS_FUNCTIONS = ["softmax", "topk", "hard", "rela_g"]


@pytest.mark.parametrize("mask_pruned", [False, True], ids=["paper", "mask-pruned"])
@pytest.mark.parametrize("cross", CROSS_FUNCTIONS)
@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("sentences", [[6], [7, 5, 9, 3, 8]], ids=["batch1", "batch5"])
def test_compressed_decoding_equals_uncompressed(cross, beam, sentences, mask_pruned):
    batch = random_batch(lengths=sentences, tgt_lengths=[2] * len(sentences), seed=5)
    model = build_model(l0drop=True, cross_attn_fn=cross, attn_k=3, l0drop_mask_pruned=mask_pruned).eval()
    close_some_gates(model, batch)
    with torch.no_grad():
        closed = model.encoder(batch["src_tokens"], src_lengths=batch["src_lengths"])["l0drop_closed"][0]
    assert 0 < closed.sum() < batch["src_tokens"].ne(1).sum(), "the test needs some closed and some open gates"
    compressed = generate(model, batch, beam, compress=True)
    uncompressed = generate(model, batch, beam, compress=False)
    for hyps_c, hyps_u in zip(compressed, uncompressed):
        assert len(hyps_c) == len(hyps_u) == beam
        for hc, hu in zip(hyps_c, hyps_u):
            assert torch.equal(hc["tokens"], hu["tokens"])
            assert abs(hc["score"] - hu["score"]) <= 1e-5
            assert (hc["positional_scores"] - hu["positional_scores"]).abs().max() <= 1e-5


@pytest.mark.parametrize("cross", CROSS_FUNCTIONS)
def test_compressed_memory_gives_the_same_teacher_forced_outputs(cross):
    batch = random_batch(lengths=[7, 5, 9], tgt_lengths=[6, 4, 6], seed=2)
    model = close_some_gates(build_model(l0drop=True, cross_attn_fn=cross, attn_k=3).eval(), batch)
    with torch.no_grad():
        model.encoder.compress = True
        compressed, _ = model(**batch)
        model.encoder.compress = False
        uncompressed, _ = model(**batch)
    assert (compressed - uncompressed).abs().max() <= 1e-5


def test_key_counts_are_an_argument_of_each_call_not_module_state():
    """The decoder's extract_features (as fairseq's forward and a direct caller use it) passes the
    compressed memory's counts to its cross-attention for that call only: afterwards no hook and no
    attribute remains, and a cross-attention called directly sees no counts."""
    batch = random_batch(lengths=[7, 5, 9], tgt_lengths=[6, 4, 6], seed=2)
    model = close_some_gates(build_model(l0drop=True).eval(), batch)
    tokens, lengths = batch["src_tokens"], batch["src_lengths"]
    with torch.no_grad():
        model.encoder.compress = False
        plain, _ = model.decoder.extract_features(batch["prev_output_tokens"], model.encoder(tokens, src_lengths=lengths))
        model.encoder.compress = True
        memory = model.encoder(tokens, src_lengths=lengths)
        counted, _ = model.decoder.extract_features(batch["prev_output_tokens"], memory)
        assert (counted - plain).abs().max() <= 1e-5
        x = torch.randn(6, 3, model.decoder.embed_dim)
        slots, counts = memory["encoder_out"][0], memory["encoder_padding_mask"][0]
        layer = model.decoder.layers[-1]
        once = layer.encoder_attn(x, slots, slots, key_padding_mask=counts.eq(0), static_kv=True)[0]
        weighted = layer.encoder_attn(x, slots, slots, key_padding_mask=counts, static_kv=True)[0]
        assert counts.dtype == torch.long and (counts > 1).any() and not torch.allclose(once, weighted)


def test_functions_without_key_counts_decode_uncompressed(caplog):
    model = build_model(l0drop=True, cross_attn_fn="sparsemax")
    assert model.encoder.compress is False
    assert "cannot read a compressed memory" in caplog.text


def test_every_layer_gates_add_their_penalties():
    model = build_model(l0drop=True, l0drop_every_layer=True, l0drop_gate_init="open").train()
    assert model.encoder.layers[0].l0drop_gate is not None and model.encoder.layers[-1].l0drop_gate is None
    batch = random_batch(lengths=[7, 5], tgt_lengths=[6, 4])
    _, extra = model(**batch)
    real = batch["src_tokens"].ne(1)
    # two gates (after layer 1 and on the output), each nearly open: about 2 expected open gates per token
    per_token = extra["l0drop_expected_l0"][0][real]
    assert ((per_token > 1.9) & (per_token <= 2.0)).all()


@pytest.mark.parametrize("checkpoint_activations", [False, True])
def test_every_layer_penalty_reaches_the_inner_gate(checkpoint_activations):
    """The inner gate's expected L0 leaves its layer as the layer's second output (no hook), so its
    gradient flows also when fairseq recomputes the layer (activation checkpointing)."""
    model = build_model(l0drop=True, l0drop_every_layer=True, checkpoint_activations=checkpoint_activations).train()
    batch = random_batch(lengths=[7, 5], tgt_lengths=[6, 4])
    encoded = model.encoder(batch["src_tokens"], src_lengths=batch["src_lengths"])
    assert encoded["encoder_states"] == [] and encoded["fc_results"] == []  # not asked for
    encoded["l0drop_expected_l0"][0].sum().backward()
    inner = model.encoder.layers[0].l0drop_gate.log_alpha.weight.grad
    assert inner is not None and inner.abs().sum() > 0
    with_states = model.encoder(batch["src_tokens"], src_lengths=batch["src_lengths"], return_all_hiddens=True)
    assert len(with_states["encoder_states"]) == len(model.encoder.layers) + 1


def criterion(l0_lambda=0.5, warmup=0, label_smoothing=0.1, normalization="sentence"):
    return L0DropCriterion(TinyTask(), sentence_avg=False, label_smoothing=label_smoothing, l0_lambda=l0_lambda,
                           l0_lambda_warmup_updates=warmup, l0_normalization=normalization)


def sample_from(batch):
    target = torch.cat([batch["prev_output_tokens"][:, 1:], torch.full((len(batch["prev_output_tokens"]), 1), 2)], 1)
    target = target.masked_fill(batch["prev_output_tokens"].eq(1), 1)
    return {"net_input": batch, "target": target, "ntokens": int(target.ne(1).sum())}


def test_expected_open_rate_per_sentence_and_per_token_by_hand():
    """Lengths 3, 8 and 20; every gate of a sentence open with probability 0.9, 0.5, 0.2."""
    lengths, probabilities = [3, 8, 20], [0.9, 0.5, 0.2]
    padding = torch.tensor([[i >= n for i in range(20)] for n in lengths])
    expected_l0 = torch.tensor([[p if i < n else 0.0 for i in range(20)] for n, p in zip(lengths, probabilities)])
    # the official code: (3*0.9/3 + 8*0.5/8 + 20*0.2/20) / 3 = (0.9 + 0.5 + 0.2) / 3
    assert expected_open_rate(expected_l0, padding, "sentence").item() == pytest.approx(1.6 / 3)
    # pooled: (2.7 + 4 + 4) / 31
    assert expected_open_rate(expected_l0, padding, "token").item() == pytest.approx(10.7 / 31)
    with pytest.raises(ValueError, match="'sentence' or 'token'"):
        expected_open_rate(expected_l0, padding, "batch")
    # a sentence of padding only counts for nothing; a batch of them gives 0, with a gradient
    padding[1] = True
    expected_l0[1] = 0.0
    assert expected_open_rate(expected_l0, padding, "sentence").item() == pytest.approx(1.1 / 2)
    gates = torch.zeros(2, 4, requires_grad=True)
    rate = expected_open_rate(gates, torch.ones(2, 4, dtype=torch.bool), "sentence")
    rate.backward()
    assert rate.item() == 0.0 and gates.grad is not None


def test_the_penalty_reads_nothing_on_the_host():
    from fairseq_sparse.bench.dispatch_counts import count

    padding = torch.tensor([[False, False, True], [False, True, True]])
    expected_l0 = torch.rand(2, 3)
    for normalization in ("sentence", "token"):
        assert count(lambda: expected_open_rate(expected_l0, padding, normalization)).synchronisations == []


@pytest.mark.parametrize("normalization", ["sentence", "token"])
def test_criterion_adds_lambda_times_the_open_rate_scaled_to_target_tokens(normalization):
    model = build_model(l0drop=True, l0drop_gate_init="open").eval()
    sample = sample_from(random_batch(lengths=[7, 2, 9], tgt_lengths=[6, 4, 6]))
    base, _, _ = criterion(l0_lambda=0.0, normalization=normalization)(model, sample)
    with_l0, sample_size, log = criterion(l0_lambda=0.5, normalization=normalization)(model, sample)
    padding = sample["net_input"]["src_tokens"].eq(1)
    open_probability = float(probability_open(torch.tensor(3.0)))  # every gate at its initialisation
    lengths = (~padding).sum(dim=1).float()
    # every gate open with probability p: the rate is p per sentence and pooled
    assert (with_l0 - base).item() == pytest.approx(0.5 * open_probability * sample_size, rel=1e-5)
    src_tokens = int(lengths.sum())
    assert log["l0_open"] == pytest.approx(open_probability * src_tokens, rel=1e-5)
    assert log["src_tokens"] == src_tokens and log["l0_closed"] == 0


def test_per_sentence_penalty_pushes_short_sentences_harder():
    """d rate / d expected L0 of one gate: 1 / (sentences x its sentence's length) per sentence,
    1 / source tokens pooled. Lengths 2 and 16: 1/4 and 1/32 against 1/18 for both."""
    padding = torch.tensor([[i >= n for i in range(16)] for n in (2, 16)])
    grads = {}
    for normalization in ("sentence", "token"):
        expected_l0 = (~padding).float().mul(0.5).requires_grad_(True)
        expected_open_rate(expected_l0, padding, normalization).backward()
        grads[normalization] = expected_l0.grad
    assert grads["sentence"][0, 0].item() == pytest.approx(1 / 4) and grads["sentence"][1, 0].item() == pytest.approx(1 / 32)
    assert grads["token"][0, 0].item() == pytest.approx(1 / 18) and grads["token"][1, 0].item() == pytest.approx(1 / 18)


def test_logged_lambda_is_an_average_of_summed_outputs():
    """fairseq sums logging outputs over processes and --update-freq batches before reducing them."""
    from fairseq.logging import metrics

    logs = [{"l0_lambda": 0.3, "l0_batches": 1, "src_tokens": 10, "l0_open": 5.0, "l0_closed": 2,
             "loss": 1.0, "nll_loss": 1.0, "ntokens": 10, "nsentences": 2, "sample_size": 10}] * 2
    summed = {key: sum(log[key] for log in logs) for key in logs[0]}
    with metrics.aggregate() as aggregator:
        L0DropCriterion.reduce_metrics([summed])
        values = aggregator.get_smoothed_values()
    assert values["l0_lambda"] == pytest.approx(0.3)
    assert values["l0_loss"] == pytest.approx(0.5) and values["pruned"] == pytest.approx(0.2)


def test_mask_pruned_hides_pruned_encodings_in_training_only():
    """--l0drop-mask-pruned (the official code): pruned encodings are masked in training; decoding
    keeps the zero slot with its count, so it equals the paper's model exactly."""
    batch = random_batch(lengths=[7, 5, 9], tgt_lengths=[6, 4, 6], seed=2)
    masked = close_some_gates(build_model(l0drop=True, l0drop_mask_pruned=True, seed=2).eval(), batch)
    paper = build_model(l0drop=True, seed=2).eval()
    paper.load_state_dict(masked.state_dict())
    masked.encoder.compress = paper.encoder.compress = False
    with torch.no_grad():
        encoded = masked.encoder(batch["src_tokens"], src_lengths=batch["src_lengths"])
        padding = batch["src_tokens"].eq(1)
        assert torch.equal(encoded["encoder_padding_mask"][0], padding)  # evaluation: nothing hidden
        assert torch.equal(masked(**batch)[0], paper(**batch)[0])
        masked.encoder.compress = True
        compressed = masked.encoder(batch["src_tokens"], src_lengths=batch["src_lengths"])
        closed = encoded["l0drop_closed"][0]
        assert compressed["encoder_padding_mask"][0][:, 0].tolist() == closed.sum(dim=1).tolist()
        masked.train()
        torch.manual_seed(0)
        trained = masked.encoder(batch["src_tokens"], src_lengths=batch["src_lengths"])
    sampled_closed = trained["encoder_out"][0].transpose(0, 1).abs().sum(-1) == 0
    assert torch.equal(trained["encoder_padding_mask"][0], padding | (sampled_closed & ~padding))


def test_lambda_ramps_linearly_over_warmup():
    model = build_model(l0drop=True)
    ramp = criterion(l0_lambda=0.4, warmup=100)
    model.set_num_updates(0)
    assert ramp.current_lambda(model) == 0.0
    model.set_num_updates(50)
    assert ramp.current_lambda(model) == pytest.approx(0.2)
    model.set_num_updates(500)
    assert ramp.current_lambda(model) == pytest.approx(0.4)


def test_criterion_on_a_model_without_gates_is_a_clear_error():
    sample = sample_from(random_batch(lengths=[4], tgt_lengths=[3]))
    with pytest.raises(MissingGatesError, match="needs a model with L0Drop gates.*--l0drop"):
        criterion()(build_model(), sample)
    loss, _, _ = criterion()(build_model(l0drop=True), sample)
    assert torch.isfinite(loss)


@pytest.mark.parametrize("gate_init", ["open", "official"])
def test_fine_tuning_a_softmax_model_restores_it_and_adds_gates(gate_init):
    """New gate parameters keep their initialisation, the rest is restored. Open gates leave the
    outputs unchanged; the official initialisation starts with gates spread inside (0, 1)."""
    baseline = build_model(seed=3).eval()
    gated = build_model(seed=4, l0drop=True, l0drop_gate_init=gate_init).eval()
    gate_before = {k: v.clone() for k, v in gated.encoder.l0drop_gate.state_dict().items()}
    gated.load_state_dict(baseline.state_dict())
    assert all(torch.equal(v, gated.encoder.l0drop_gate.state_dict()[k]) for k, v in gate_before.items())
    batch = random_batch(lengths=[7, 5, 9], tgt_lengths=[6, 4, 6])
    with torch.no_grad():
        change = (gated(**batch)[0] - baseline(**batch)[0]).abs().max()
        gates = gated.encoder(batch["src_tokens"], batch["src_lengths"])["l0drop_expected_l0"][0]
    if gate_init == "open":
        assert change <= 1e-5
    else:
        assert change > 1e-2 and gates[batch["src_tokens"].ne(1)].max() < 0.999


@pytest.mark.parametrize("l0_lambda,expect_sparse", [(0.0, False), (5.0, True)])
def test_lambda_controls_sparsity_in_a_short_run(l0_lambda, expect_sparse):
    torch.manual_seed(0)
    model = build_model(l0drop=True)
    loss_fn = criterion(l0_lambda=l0_lambda)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    sample = sample_from(random_batch(lengths=[9, 7, 8, 6], tgt_lengths=[6, 5, 6, 4], seed=7))
    for _ in range(60):
        model.train()
        optimizer.zero_grad()
        loss, sample_size, _ = loss_fn(model, sample)
        (loss / sample_size).backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        _, _, log = loss_fn(model, sample)
    sparsity = float(log["l0_closed"]) / float(log["src_tokens"])
    assert (sparsity > 0.3) if expect_sparse else (sparsity < 0.05), sparsity


@pytest.mark.parametrize("cross", CROSS_FUNCTIONS)
def test_attention_over_the_compressed_memory_is_given_over_source_positions(cross):
    """The decoder's cross-attention (what --print-alignment and the analysis tools read) maps the
    compressed slots back to the source positions: equal to the uncompressed model's attention,
    in a teacher-forced pass and in every hypothesis of beam search."""
    batch = random_batch(lengths=[7, 5, 9], tgt_lengths=[6, 4, 6], seed=2)
    model = close_some_gates(build_model(l0drop=True, cross_attn_fn=cross, attn_k=3).eval(), batch)
    attention = []
    for compress in (True, False):
        model.encoder.compress = compress
        with torch.no_grad():
            attention.append(model(**batch)[1]["attn"][0])
    assert attention[0].shape == attention[1].shape == (3, 6, 9)
    assert (attention[0] - attention[1]).abs().max() <= 1e-5
    compressed, uncompressed = generate(model, batch, 4, compress=True), generate(model, batch, 4, compress=False)
    for hyps_c, hyps_u in zip(compressed, uncompressed):
        for hc, hu in zip(hyps_c, hyps_u):
            assert hc["attention"].shape == hu["attention"].shape
            assert (hc["attention"] - hu["attention"]).abs().max() <= 1e-5
