"""Properties of the plain attention functions, parametrised over the registry."""

import pytest
import torch
import torch.nn.functional as F
from entmax import entmax15, sparsemax

from attention_cases import CASES, NAMES
from fairseq_sparse.core.attention import AttentionContext, attention_names, check_k, get_attention
from fairseq_sparse.core.attention.entmax_family import LearnedAlpha

B, H, T, S, D = 2, 3, 5, 7, 4


def make_inputs(dtype=torch.float32, seed=0, requires_grad=False):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(B, H, T, S, generator=gen, dtype=dtype).requires_grad_(requires_grad)
    values = torch.randn(B, H, S, D, generator=gen, dtype=dtype).requires_grad_(requires_grad)
    return scores, values


def padding_mask(lengths=(S, 4)):
    """(B, 1, 1, S) mask, True at padded keys."""
    return (torch.arange(S)[None, :] >= torch.tensor(lengths)[:, None])[:, None, None, :]


def context(name, **kwargs):
    spec = get_attention(name)
    head_params = spec.build_head_params(H)() if spec.build_head_params else None
    kwargs.setdefault("k", CASES[name].k)
    return AttentionContext(head_params=head_params, **kwargs)


def test_registry_has_a_test_row_for_every_function():
    assert sorted(attention_names()) == NAMES


def test_unknown_name_and_bad_k_are_rejected_with_the_choices():
    with pytest.raises(ValueError, match="valid choices: .*softmax.*topk"):
        get_attention("top-k")
    for bad in (0, -3, 2.5, None):
        with pytest.raises(ValueError, match="positive integer"):
            check_k(bad)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("training", [False, True])
def test_masked_keys_get_zero_weight_and_shapes(name, training):
    scores, values = make_inputs()
    mask = padding_mask()
    torch.manual_seed(0)
    out, weights = get_attention(name).fn(scores, values, mask, context(name, training=training))
    assert out.shape == (B, H, T, D)
    assert weights.shape == (B, H, T, S)
    assert (weights.masked_select(mask.expand_as(weights)) == 0).all()
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("training", [False, True])
def test_fully_masked_query_gives_zero_output_and_finite_gradients(name, training):
    scores, values = make_inputs(requires_grad=True)
    mask = torch.zeros(B, 1, T, S, dtype=torch.bool)
    mask[0, 0, 2] = True  # query 2 of sentence 0 sees no key
    ctx = context(name, training=training)
    torch.manual_seed(0)
    out, weights = get_attention(name).fn(scores, values, mask, ctx)
    assert torch.isfinite(out).all()
    assert (out[0, :, 2] == 0).all()
    assert (weights[0, :, 2] == 0).all()
    (out * torch.randn_like(out)).sum().backward()
    assert torch.isfinite(values.grad).all()
    if scores.grad is not None:  # hard inference (argmax) has no gradient path to the scores
        assert torch.isfinite(scores.grad).all()
        assert (scores.grad[0, :, 2] == 0).all()


@pytest.mark.parametrize("name", NAMES)
def test_bfloat16_scores_and_values_give_finite_output(name):
    scores, values = make_inputs()
    mask = padding_mask()
    mask = mask | torch.zeros(B, 1, T, S, dtype=torch.bool).index_fill_(2, torch.tensor([1]), True)
    out, weights = get_attention(name).fn(scores.float(), values.bfloat16(), mask, context(name))
    assert out.dtype == torch.bfloat16
    assert torch.isfinite(out.float()).all() and torch.isfinite(weights).all()


@pytest.mark.parametrize("name", [n for n in NAMES if CASES[n].gradcheck])
def test_gradcheck(name):
    scores, values = make_inputs(dtype=torch.float64, requires_grad=True)
    mask = padding_mask()
    ctx = context(name)
    if ctx.head_params is not None:
        ctx.head_params = ctx.head_params.double()
    fn = get_attention(name).fn

    def output(s, v):
        return fn(s, v, mask, ctx)[0]

    assert torch.autograd.gradcheck(output, (scores, values), eps=1e-6, atol=1e-4)


def test_topk_with_k_at_least_length_equals_softmax_exactly():
    scores, values = make_inputs()
    mask = padding_mask()
    soft_out, soft_w = get_attention("softmax").fn(scores, values, mask, AttentionContext())
    for k in (S, S + 5):
        out, w = get_attention("topk").fn(scores, values, mask, AttentionContext(k=k))
        assert torch.equal(out, soft_out) and torch.equal(w, soft_w)


@pytest.mark.parametrize("k", [1, 2, 3, 6])
def test_topk_keeps_exactly_the_k_largest_unmasked_scores(k):
    scores, values = make_inputs()
    mask = padding_mask(lengths=(S, 4))
    _, weights = get_attention("topk").fn(scores, values, mask, AttentionContext(k=k))
    masked = scores.masked_fill(mask, float("-inf"))
    for b, valid in enumerate((S, 4)):
        kept = min(k, valid)
        top = masked[b].topk(kept, dim=-1).indices
        expected = torch.zeros(H, T, S, dtype=torch.bool).scatter_(-1, top, True)
        assert torch.equal(weights[b] > 0, expected)
        # the kept weights are the softmax over the kept scores
        ref = torch.softmax(masked[b].masked_fill(~expected, float("-inf")), dim=-1)
        torch.testing.assert_close(weights[b], ref)


def test_topk_keeps_every_key_tied_with_the_kth_score():
    scores = torch.tensor([[[[3.0, 1.0, 2.0, 2.0, 0.0]]]])
    _, weights = get_attention("topk").fn(scores, torch.randn(1, 1, 5, 2), None, AttentionContext(k=2))
    assert (weights[0, 0, 0] > 0).tolist() == [True, False, True, True, False]


@pytest.mark.parametrize("name,mapping", [("sparsemax", sparsemax), ("entmax15", entmax15)])
def test_sparsemax_and_entmax15_match_the_entmax_package(name, mapping):
    scores, values = make_inputs()
    mask = padding_mask()
    out, weights = get_attention(name).fn(scores, values, mask, AttentionContext())
    expected = mapping(scores.masked_fill(mask, float("-inf")), dim=-1)
    torch.testing.assert_close(weights, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(out, expected @ values, rtol=0, atol=1e-6)
    assert (weights == 0).any(), "sparse mappings should produce exact zeros here"


def test_entmax_alpha_learns_alpha_per_head():
    scores, values = make_inputs()
    alphas = get_attention("entmax_alpha").build_head_params(H)
    assert isinstance(alphas, LearnedAlpha)
    torch.testing.assert_close(alphas(), torch.full((H,), 1.5))
    ctx = AttentionContext(training=True, head_params=alphas())
    out, _ = get_attention("entmax_alpha").fn(scores, values, padding_mask(), ctx)
    (out * torch.randn_like(out)).sum().backward()
    grad = alphas.pre_alpha.grad
    assert grad is not None and torch.isfinite(grad).all() and (grad != 0).all()
    with torch.no_grad():
        alphas.pre_alpha.fill_(-10.0)
    assert torch.allclose(alphas(), torch.tensor(1.01))


def test_entmax_alpha_at_two_equals_sparsemax():
    scores, values = make_inputs(dtype=torch.float64)
    alphas = get_attention("entmax_alpha").build_head_params(H)
    with torch.no_grad():
        alphas.pre_alpha.fill_(30.0)  # sigmoid -> 1, alpha -> 2
    ctx = AttentionContext(head_params=alphas().double())
    _, weights = get_attention("entmax_alpha").fn(scores, values, None, ctx)
    torch.testing.assert_close(weights, sparsemax(scores, dim=-1), atol=1e-5, rtol=0)


def test_hard_inference_equals_dense_one_hot_attention():
    scores, values = make_inputs()
    mask = padding_mask()
    out, weights = get_attention("hard").fn(scores, values, mask, AttentionContext())
    index = scores.masked_fill(mask, float("-inf")).argmax(-1)
    one_hot = F.one_hot(index, S).float()
    torch.testing.assert_close(out, one_hot @ values, rtol=0, atol=0)
    assert torch.equal(weights, one_hot)
    _, no_weights = get_attention("hard").fn(scores, values, mask, AttentionContext(need_weights=False))
    assert no_weights is None


@pytest.mark.parametrize("hard_train", ["sample", "argmax"])
def test_hard_training_gradients_follow_the_straight_through_equations(hard_train):
    """Eqs. 7-10: forward reads V[i]; grad_P = grad_out V^T; grad_V sums grad_out into row i."""
    scores, values = make_inputs(requires_grad=True)
    mask = padding_mask()
    grad_out = torch.randn(B, H, T, D)
    torch.manual_seed(123)
    out, _ = get_attention("hard").fn(scores, values, mask, AttentionContext(training=True, hard_train=hard_train))
    out.backward(grad_out)

    ref_scores = scores.detach().clone().requires_grad_(True)
    ref_values = values.detach().clone().requires_grad_(True)
    probs = torch.softmax(ref_scores.masked_fill(mask, float("-inf")), dim=-1)
    if hard_train == "argmax":
        index = probs.argmax(-1)
    else:
        torch.manual_seed(123)
        index = torch.multinomial(probs.detach().reshape(-1, S), 1).view(B, H, T)
    one_hot = F.one_hot(index, S).to(probs.dtype)
    p_hard = probs + (one_hot - probs).detach()  # value one-hot, gradient passed straight to P (eq. 8)
    ref_out = p_hard @ ref_values
    ref_out.backward(grad_out)

    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-6)
    torch.testing.assert_close(scores.grad, ref_scores.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(values.grad, ref_values.grad, rtol=1e-5, atol=1e-6)
    assert (index.unsqueeze(-1) < torch.tensor((S, 4)).view(B, 1, 1, 1)).all(), "sampled a padded key"


def test_hard_training_samples_follow_the_softmax():
    scores = torch.tensor([[[[0.0, 1.0, 2.0]]]]).expand(1, 1, 4000, 3).contiguous()
    values = torch.eye(3)[None, None]
    torch.manual_seed(0)
    out, _ = get_attention("hard").fn(scores, values, None, AttentionContext(training=True))
    freq = out[0, 0].mean(0)
    torch.testing.assert_close(freq, torch.softmax(torch.tensor([0.0, 1.0, 2.0]), -1), atol=0.03, rtol=0)


@pytest.mark.parametrize("name", [n for n in NAMES if CASES[n].null_attention])
def test_all_negative_scores_give_null_attention(name):
    scores, values = make_inputs()
    scores = -scores.abs() - 0.1
    out, weights = get_attention(name).fn(scores, values, None, context(name))
    assert (weights == 0).all() and (out == 0).all()


@pytest.mark.parametrize("hard_train", ["sample", "argmax"])
def test_hard_training_reads_nothing_when_dropout_removes_every_key(hard_train, monkeypatch):
    from fairseq_sparse.core.attention import hard_retrieval

    scores, values = make_inputs(requires_grad=True)
    drop_query_1 = torch.ones(B, H, T, S)
    drop_query_1[:, :, 1] = 0.0
    monkeypatch.setattr(hard_retrieval, "attention_dropout", lambda p, ctx: p * drop_query_1)

    ctx = AttentionContext(training=True, hard_train=hard_train, dropout_p=0.5)
    out, _ = get_attention("hard").fn(scores, values, None, ctx)
    assert (out[:, :, 1] == 0).all() and (out[:, :, 0] != 0).any()
    out.sum().backward()
    assert torch.isfinite(scores.grad).all() and torch.isfinite(values.grad).all()


@pytest.mark.parametrize("num_keys", [30, 64, 300])  # both sides of TOPK_FROM_KEYS
def test_kth_largest_is_the_same_by_kthvalue_and_by_topk(num_keys):
    from fairseq_sparse.core.attention import functions

    gen = torch.Generator().manual_seed(4)
    scores = torch.randn(2, 3, 5, num_keys, generator=gen).round(decimals=1)  # ties
    scores[0, :, :, num_keys // 2:] = float("-inf")  # masked keys
    scores[1, 0, 0, 2:] = float("-inf")  # fewer visible keys than k
    results = []
    for threshold in (10**9, 1):  # kthvalue only, then topk only
        results.append([functions.kth_largest(scores, k, topk_from_keys=threshold) for k in (1, 8, num_keys, num_keys + 3)])
    for by_kthvalue, by_topk in zip(*results):
        assert torch.equal(by_kthvalue, by_topk)
    assert results[0][1][1, 0, 0].item() == float("-inf")
