"""TorchScript, as fairseq 0.12's own ``tests/test_export.py`` and ``TestJitSequenceGenerator``
(``tests/test_sequence_generator.py``) check it for stock fairseq's transformer, for every method.

Rows: every registered attention function that TorchScript can compile (a function defined for
self-attention only runs in encoder and decoder self-attention, softmax in cross-attention), Top-k (OOW)
with its window set (``attention_cases.SETTINGS``), L0Drop
decoding from a compressed memory with about half of its encodings pruned, L0Drop's rule-based
``freq`` pattern, and ``stock``, fairseq's own transformer of the same sizes, the reference row. The
functions of the entmax package, and L0Drop gates after every encoder layer, do not script: one
clear error each. Whole-model pickling (``torch.save(model)``) is checked here too.
"""

import copy
import io

import pytest
import torch
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.sequence_generator import SequenceGenerator

from attention_cases import NAMES, SETTINGS, case_of, function_of, model_options
from fairseq_sparse.core.attention import get_attention
from fairseq_sparse.core.errors import UsageError
from helpers import TinyTask, build_model, close_some_gates, model_args, random_batch

SCRIPTABLE = [name for name in NAMES if get_attention(name).scriptable]
UNSCRIPTABLE = [name for name in NAMES if not get_attention(name).scriptable]
ROWS = [*SCRIPTABLE, *SETTINGS, "l0drop", "l0drop_freq", "stock"]
BATCH = dict(lengths=[7, 5, 9, 3], tgt_lengths=[6, 4, 6, 2], seed=2)


def model_of(row: str) -> torch.nn.Module:
    """The row's tiny model, untrained, in evaluation mode."""
    if row == "stock":
        torch.manual_seed(0)
        return ARCH_MODEL_REGISTRY["transformer"].build_model(model_args("transformer"), TinyTask()).eval()
    if row == "l0drop":
        return close_some_gates(build_model(l0drop=True, cross_attn_fn="topk", attn_k=3).eval(), random_batch(**BATCH))
    if row == "l0drop_freq":
        return build_model(encoder_prune_pattern="freq").eval()
    cross = "softmax" if case_of(row).self_only else function_of(row)
    return build_model(**model_options(row, "encoder", "decoder"), cross_attn_fn=cross).eval()


def saved_and_loaded(scripted: torch.jit.ScriptModule) -> torch.jit.ScriptModule:
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)
    buffer.seek(0)
    return torch.jit.load(buffer)


@pytest.mark.parametrize("row", ROWS)
def test_scripted_model_gives_the_eager_outputs_also_after_save_and_load(row):
    model = model_of(row)
    batch = random_batch(**BATCH)
    if row == "l0drop":
        closed = model.encoder(batch["src_tokens"], batch["src_lengths"])["l0drop_closed"][0]
        assert 0 < closed.sum() < batch["src_tokens"].ne(1).sum(), "the row needs some pruned and some kept encodings"
    scripted = torch.jit.script(model)
    with torch.no_grad():
        eager_logits, eager_extra = model(**batch)
        for compiled in (scripted, saved_and_loaded(scripted)):
            logits, extra = compiled(**batch)
            torch.testing.assert_close(logits, eager_logits, rtol=0, atol=1e-5)
            torch.testing.assert_close(extra["attn"][0], eager_extra["attn"][0], rtol=0, atol=1e-6)


@pytest.mark.parametrize("row", ROWS)
def test_scripted_sequence_generator_gives_the_eager_hypotheses(row):
    """Beam search with incremental decoding (and, for L0Drop, the compressed memory reordered with the
    beam): tokens, scores and the cross-attention alignments of every n-best hypothesis."""
    model = model_of(row)
    dictionary = TinyTask().target_dictionary
    batch = random_batch(**BATCH)
    sample = {"net_input": {"src_tokens": batch["src_tokens"], "src_lengths": batch["src_lengths"]}}
    settings = dict(beam_size=3, max_len_b=8, min_len=2)
    eager = SequenceGenerator([model], dictionary, **settings)
    scripted = torch.jit.script(SequenceGenerator([model], dictionary, **settings))
    with torch.no_grad():
        expected, found = eager.forward(sample), scripted.forward(sample)
    assert len(found) == len(expected) == len(BATCH["lengths"])
    for hyps_found, hyps_expected in zip(found, expected):
        assert len(hyps_found) == len(hyps_expected) == 3
        for hyp, ref in zip(hyps_found, hyps_expected):
            assert torch.equal(hyp["tokens"], ref["tokens"])
            torch.testing.assert_close(hyp["positional_scores"], ref["positional_scores"], rtol=0, atol=1e-5)
            torch.testing.assert_close(hyp["attention"], ref["attention"], rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", UNSCRIPTABLE)
def test_entmax_functions_are_one_clear_error_for_the_model_and_the_generator(name):
    model = build_model(decoder_attn_fn=name).eval()
    for target in (model, SequenceGenerator([model], TinyTask().target_dictionary, beam_size=2)):
        with pytest.raises(UsageError, match=rf"attention function '{name}' cannot be compiled by TorchScript"):
            torch.jit.script(target)


def test_gates_after_every_encoder_layer_are_one_clear_error():
    model = build_model(l0drop=True, l0drop_every_layer=True).eval()
    with pytest.raises(UsageError, match="--l0drop-every-layer.*cannot be compiled by TorchScript"):
        torch.jit.script(model)


def test_scripting_leaves_the_eager_model_as_it_was():
    """torch.jit.script prepares (``__prepare_scriptable__``) the eager modules in place: the eager
    model must still train (the fused attention path, hard retrieval's sampling) afterwards."""
    model = build_model(encoder_attn_fn="topk", decoder_attn_fn="hard", cross_attn_fn="hard")
    batch = random_batch(**BATCH)
    torch.jit.script(model.eval())
    model.train()
    logits, _ = model(**batch)
    logits.sum().backward()
    assert model.encoder.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("row", [*NAMES, "l0drop"])
def test_whole_model_pickles_and_deep_copies(row):
    """torch.save(model) (the module, not its state_dict) and copy.deepcopy work as for stock's
    transformer: the attention module keeps its function's name and looks the function up again."""
    model = model_of(row) if row in ROWS else build_model(decoder_attn_fn=row).eval()
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    batch = random_batch(**BATCH)
    with torch.no_grad():
        expected = model(**batch)[0]
        for loaded in (torch.load(buffer, weights_only=False), copy.deepcopy(model)):
            assert torch.equal(loaded(**batch)[0], expected)
