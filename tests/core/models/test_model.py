"""transformer_sparse options, architectures, start-up errors and checkpoint loading."""

import argparse
import dataclasses
import os
import pickle
from pathlib import Path
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from fairseq import checkpoint_utils
from fairseq.models import ARCH_MODEL_NAME_REGISTRY
from omegaconf import OmegaConf

from fairseq_sparse.core.checkpoint_loading import CheckpointLoadError
from fairseq_sparse.core.models.options import SparseModelOptions
from fairseq_sparse.core.modules.sparse_multihead_attention import SparseMultiheadAttention
from helpers import build_model, model_args, random_batch

ARCHS = {
    # arch: (encoder layers, embed dim, heads, {sublayer: fn})
    "transformer_sparse": (6, 512, 8, {}),
    "transformer_sparse_wmt_en_de_big": (6, 1024, 16, {}),
    "transformer_sparse_iwslt_de_en": (6, 512, 4, {}),
    "transformer_sparse_mini": (2, 512, 4, {}),
    "transformer_topk_iwslt_de_en": (6, 512, 4, {"encoder": "topk", "decoder": "topk", "cross": "topk"}),
    "transformer_hard_wmt_en_de": (6, 512, 8, {"encoder": "softmax", "decoder": "hard", "cross": "hard"}),
    "transformer_rela_wmt_en_de": (6, 512, 8, {"encoder": "rela_g", "decoder": "rela_g", "cross": "rela_g"}),
    "transformer_sparsemax_iwslt_de_en": (6, 512, 4, {"encoder": "sparsemax", "decoder": "sparsemax", "cross": "sparsemax"}),
    "transformer_entmax15_iwslt_de_en": (6, 512, 4, {"encoder": "entmax15", "decoder": "entmax15", "cross": "entmax15"}),
}


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_architecture_presets(arch):
    layers, dim, heads, fns = ARCHS[arch]
    assert ARCH_MODEL_NAME_REGISTRY[arch] == "transformer_sparse"
    args = argparse.Namespace()
    from fairseq.models import ARCH_CONFIG_REGISTRY

    ARCH_CONFIG_REGISTRY[arch](args)
    assert (args.encoder_layers, args.encoder_embed_dim, args.encoder_attention_heads) == (layers, dim, heads)
    for sublayer, fn in fns.items():
        assert getattr(args, f"{sublayer}_attn_fn") == fn
    assert args.attn_k == 8


def test_preset_keeps_options_given_on_the_command_line():
    args = model_args("transformer_topk_iwslt_de_en", attn_k=4, cross_attn_fn="softmax")
    assert (args.attn_k, args.cross_attn_fn, args.encoder_attn_fn) == (4, "softmax", "topk")


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"cross_attn_fn": "top-k"}, "--cross-attn-fn: unknown attention function 'top-k'; valid choices: .*softmax"),
        ({"attn_k": 0}, "--attn-k must be a positive integer"),
        ({"decoder_attn_k": -2}, "--decoder-attn-k must be a positive integer"),
        ({"hard_train": "gumbel"}, "--hard-train must be one of sample, argmax"),
        ({"l0drop": True, "l0drop_gate_init": "closed"}, "--l0drop-gate-init must be one of official, open"),
    ],
)
def test_bad_options_are_rejected_when_the_model_is_built(overrides, message):
    with pytest.raises(ValueError, match=message):
        build_model(**overrides)


def test_bad_options_stop_fairseq_train_at_start_up(tmp_path):
    """An unknown name fails in argument parsing, before any data is read, naming the choices."""
    cmd = [os.path.join(os.path.dirname(sys.executable), "fairseq-train"), str(tmp_path / "no-data"),
           "--user-dir", str(Path(__file__).resolve().parents[3] / "fairseq_sparse"),
           "--arch", "transformer_sparse_mini", "--encoder-attn-fn", "sparse-softmax"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "invalid choice: 'sparse-softmax'" in result.stderr and "topk" in result.stderr


def test_softmax_checkpoint_decodes_with_parameter_free_functions():
    """--model-overrides may swap softmax for topk/hard (no parameters) but not for ReLA."""
    trained = build_model()
    state = trained.state_dict()
    hard = build_model(decoder_attn_fn="hard", cross_attn_fn="hard", encoder_attn_fn="topk")
    hard.load_state_dict(state)
    assert torch.equal(hard.encoder.layers[0].self_attn.q_proj.weight, trained.encoder.layers[0].self_attn.q_proj.weight)
    rela = build_model(cross_attn_fn="rela_g")
    with pytest.raises(RuntimeError, match=r"do not fit this transformer_sparse model \(encoder=softmax, decoder=softmax, cross=rela_g\).*missing"):
        rela.load_state_dict(state)


def test_module_rejects_bad_arguments():
    with pytest.raises(ValueError, match="valid choices"):
        SparseMultiheadAttention(16, 4, attn_fn="nope")
    with pytest.raises(ValueError, match="positive integer"):
        SparseMultiheadAttention(16, 4, attn_fn="topk", attn_k=0)
    SparseMultiheadAttention(16, 4, attn_fn="topk_oow", attn_k=4, oow_window=4, self_attention=True)  # no picks
    for window, message in ((5, "--topk-oow-window 5 is more than the module's k = 4"), (0, "positive integer, got 0"),
                            (True, "positive integer, got True"), (2.0, "positive integer, got 2.0")):
        with pytest.raises(ValueError, match=re.escape(message)):
            SparseMultiheadAttention(16, 4, attn_fn="topk_oow", attn_k=4, oow_window=window, self_attention=True)
    with pytest.raises(ValueError, match="attention function 'topk' has no window to size"):
        SparseMultiheadAttention(16, 4, attn_fn="topk", attn_k=4, oow_window=2)
    with pytest.raises(ValueError, match="add_bias_kv"):
        SparseMultiheadAttention(16, 4, add_bias_kv=True)


def test_fairseq_checkpoint_types_load_with_the_weights_only_loader(tmp_path):
    path = tmp_path / "checkpoint.pt"
    state = {
        "args": argparse.Namespace(arch="transformer_sparse_mini", lr=[0.001]),
        "cfg": OmegaConf.create({"model": {"arch": "transformer_sparse_mini", "dropout": 0.1}, "task": None}),
        "model": build_model().state_dict(),
        "extra_state": {"val_loss": np.float64(3.5), "best": np.array([1.0, 2.0])},
    }
    torch.save(state, path)
    loaded = torch.load(path, map_location="cpu")  # torch's default: weights_only=True
    assert loaded["args"].arch == "transformer_sparse_mini"
    assert loaded["cfg"].model.dropout == 0.1
    assert loaded["extra_state"]["val_loss"] == 3.5


class NotAllowed:
    pass


def test_unloadable_checkpoint_gives_one_clear_error(tmp_path):
    path = tmp_path / "checkpoint.pt"
    torch.save({"model": {}, "something": NotAllowed()}, path)
    with pytest.raises(CheckpointLoadError, match="safe \\(weights-only\\) loader.*NotAllowed.*add_safe_globals") as info:
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert isinstance(info.value.__cause__, pickle.UnpicklingError)


def _cut_in_half(path, legacy: bool = False) -> None:
    torch.save({"model": build_model().state_dict()}, path, _use_new_zipfile_serialization=not legacy)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("case,what", [
    ("empty", "the file is empty"),
    ("html", "it is an HTML page"),
    ("truncated", "its zip archive has no end"),
    ("truncated-legacy", r"torch finds it damaged \(unexpected EOF"),
    ("random", "it starts with the bytes"),
])
def test_a_file_that_is_not_a_checkpoint_gives_one_clear_error(tmp_path, case, what):
    path = tmp_path / "checkpoint_best.pt"
    if case == "empty":
        path.write_bytes(b"")
    elif case == "html":  # what a failed download of a model URL often saves
        path.write_text("<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head><body></body></html>\n")
    elif case == "random":
        path.write_bytes(bytes(range(7, 256)))
    else:
        _cut_in_half(path, legacy=case == "truncated-legacy")
    # before: EOFError, RuntimeError, or "it holds Weights only load failed..., a type fairseq checkpoints
    # do not normally hold" with advice to switch the safe loader off
    with pytest.raises(CheckpointLoadError, match=f"^{path} is not a PyTorch checkpoint: {what}.*HTML page") as info:
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert "weights_only" not in str(info.value) and "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD" not in str(info.value)


def test_a_checkpoint_of_an_unregistered_architecture_gives_one_clear_error():
    """fairseq's own error here has a formatting bug: IndexError: Replacement index 1 out of range."""
    from fairseq import models

    with pytest.raises(CheckpointLoadError, match="no model architecture 'my_plugin_arch' is registered.*--user-dir"):
        models.build_model(argparse.Namespace(_name="my_plugin_arch", arch="my_plugin_arch"), task=None, from_checkpoint=True)


def test_a_checkpoint_of_other_sizes_names_the_parameters_of_another_shape():
    wider = build_model(encoder_embed_dim=32, decoder_embed_dim=32)
    with pytest.raises(RuntimeError, match=r"do not fit this transformer_sparse model .*0 missing .*0 unexpected .*"
                                           r"of another shape \(e\.g\. \['encoder\.embed_tokens\.weight \(24, 16\) in the "
                                           r"checkpoint, \(24, 32\) here'"):
        wider.load_state_dict(build_model().state_dict())


def test_a_k_that_is_not_positive_stops_fairseq_train_with_one_line(tmp_path):
    cmd = [os.path.join(os.path.dirname(sys.executable), "fairseq-train"), str(tmp_path / "no-data"),
           "--user-dir", str(Path(__file__).resolve().parents[3] / "fairseq_sparse"),
           "--arch", "transformer_sparse_mini", "--attn-k", "0"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    # argparse prints fairseq-train's (long) usage, then the error as the last line, and exits with 2
    assert result.returncode == 2 and "Traceback" not in result.stderr
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line == "fairseq-train: error: argument --attn-k: must be a positive integer, got '0'"


@pytest.mark.parametrize("option,value", [("--attn-k", "-1"), ("--decoder-attn-k", "0"), ("--cross-attn-k", "two"),
                                          ("--topk-oow-window", "0")])
def test_k_options_reject_what_is_not_a_positive_integer_in_argument_parsing(option, value, capsys):
    parser = argparse.ArgumentParser(prog="fairseq-train")
    SparseModelOptions.add_args(parser)
    assert parser.parse_args([option, "3"]).__dict__[option[2:].replace("-", "_")] == 3
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args([option, value])
    assert exit_.value.code == 2
    assert f"error: argument {option}: must be a positive integer, got '{value}'" in capsys.readouterr().err


def test_each_model_option_is_declared_once_with_its_default_and_command_line_form():
    parser = argparse.ArgumentParser()
    SparseModelOptions.add_args(parser)
    declared = {action.dest: action for action in parser._actions if action.dest != "help"}
    on_command_line = [spec.name for spec in dataclasses.fields(SparseModelOptions) if spec.metadata["help"]]
    assert sorted(declared) == sorted(on_command_line)
    # the one option set by the plugin, not the user, under the name the pos-table loader writes
    from fairseq_sparse.core.modules.prune_patterns import STORED_TABLE_OPTION
    assert {spec.name for spec in dataclasses.fields(SparseModelOptions)} - set(on_command_line) == {STORED_TABLE_OPTION}
    # no argparse defaults: an architecture fills what the user left unset
    assert all(action.default is None for action in declared.values())
    args = parser.parse_args([])
    SparseModelOptions.fill_defaults(args)
    assert SparseModelOptions.from_cfg(args) == SparseModelOptions()
    given = parser.parse_args(["--cross-attn-fn", "topk", "--cross-attn-k", "3", "--l0drop", "--l0drop-compress", "False"])
    options = SparseModelOptions.from_cfg(given)
    assert (options.attn_fn_of("cross"), options.attn_k_of("cross"), options.attn_k_of("encoder")) == ("topk", 3, 8)
    assert options.l0drop and not options.l0drop_compress and options.uses_gated_encoder


@pytest.mark.parametrize("given,message", [
    (dict(decoder_attn_fn="nope"), "--decoder-attn-fn: unknown attention function 'nope'"),
    (dict(attn_k=0), "--attn-k must be a positive integer, got 0"),
    (dict(encoder_attn_k=-2), "--encoder-attn-k must be a positive integer, got -2"),
    (dict(hard_train="greedy"), "--hard-train must be one of sample, argmax"),
    (dict(encoder_prune_pattern="group", l0drop=True), "use it without --l0drop"),
    (dict(encoder_prune_pattern="nouns"), "--encoder-prune-pattern must be one of group"),
    (dict(l0drop_gate_init="closed"), "--l0drop-gate-init must be one of official, open, got 'closed'"),
    (dict(encoder_attn_fn="topk_oow", topk_oow_window=9),
     "--topk-oow-window 9 is more than the encoder self-attention's k = 8: Top-k (OOW)'s window is part of its k keys"),
    (dict(decoder_attn_fn="topk_oow", attn_k=12, decoder_attn_k=4, topk_oow_window=8),
     "--topk-oow-window 8 is more than the decoder self-attention's k = 4"),
    (dict(encoder_attn_fn="topk_oow", topk_oow_window=0), "--topk-oow-window must be a positive integer, got 0"),
    (dict(encoder_attn_fn="topk", topk_oow_window=-1), "--topk-oow-window must be a positive integer, got -1"),
    (dict(encoder_attn_fn="topk_oow", topk_oow_window=True), "--topk-oow-window: True is a bool, the option takes an integer"),
    (dict(encoder_attn_fn="topk_oow", topk_oow_window=4.0), "--topk-oow-window: 4.0 is a float, the option takes an integer"),
])
def test_bad_model_options_are_one_clear_error(given, message):
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        SparseModelOptions.from_cfg(argparse.Namespace(**given))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("given, ignored", [
    (dict(attn_k=4), "--attn-k 4: no sublayer takes it (encoder softmax, decoder softmax, cross softmax)"),
    (dict(attn_k=4, encoder_attn_fn="topk", encoder_attn_k=2), "--attn-k 4: no sublayer takes it"),
    (dict(cross_attn_k=2, encoder_attn_fn="topk"), "--cross-attn-k 2: the cross function softmax does not take k"),
    (dict(hard_train="argmax", decoder_attn_fn="topk"), "--hard-train argmax: no sublayer's function reads it"),
    (dict(attn_pattern_seed=7, encoder_attn_fn="window"), "--attn-pattern-seed 7: no sublayer's function reads it"),
    (dict(l0drop_mask_pruned=True), "--l0drop-mask-pruned: without --l0drop there are no gates"),
    (dict(l0drop_every_layer=True), "--l0drop-every-layer: without --l0drop there are no gates"),
    (dict(l0drop_gate_init="open"), "--l0drop-gate-init open: without --l0drop there are no gates"),
    (dict(l0drop_compress=False), "l0drop_compress False: nothing prunes the encoder outputs"),
    (dict(encoder_prune_pos_table="types.txt", encoder_prune_pattern="freq"), "read by --encoder-prune-pattern pos only"),
    (dict(topk_oow_window=3, encoder_attn_fn="topk"), "--topk-oow-window 3: no sublayer's function reads it (encoder topk"),
])
def test_options_nothing_reads_are_named_in_a_warning(given, ignored, caplog):
    notes = SparseModelOptions.from_cfg(argparse.Namespace(**given)).ignored()
    assert len(notes) == 1 and ignored in notes[0], notes
    build_model(**given)
    assert any(record.levelname == "WARNING" and ignored in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize("given", [
    dict(attn_k=4, encoder_attn_fn="topk"), dict(cross_attn_k=2, cross_attn_fn="topk"),
    dict(hard_train="argmax", decoder_attn_fn="hard"), dict(attn_pattern_seed=7, encoder_attn_fn="random"),
    dict(l0drop=True, l0drop_mask_pruned=True, l0drop_gate_init="open", l0drop_compress=False),
    dict(attn_k=8), dict(),  # defaults cannot be told from given values: never reported
    dict(topk_oow_window=3, decoder_attn_fn="topk_oow", attn_k=4), dict(topk_oow_window=8, encoder_attn_fn="topk_oow"),
])
def test_options_something_reads_are_not_reported(given):
    assert SparseModelOptions.from_cfg(argparse.Namespace(**given)).ignored() == []


def test_gates_without_the_l0_penalty_are_named_in_a_warning(caplog):
    build_model(l0drop=True, criterion="label_smoothed_cross_entropy")
    assert any("the gates get no L0 penalty" in record.getMessage() for record in caplog.records)
    caplog.clear()
    build_model(l0drop=True, criterion="label_smoothed_cross_entropy_l0drop")
    build_model(criterion="label_smoothed_cross_entropy")
    assert not any("L0 penalty" in record.getMessage() for record in caplog.records)


def test_options_missing_from_an_old_checkpoint_take_their_defaults():
    old = argparse.Namespace(encoder_attn_fn="topk", attn_k=4)  # saved before the other options existed
    options = SparseModelOptions.from_cfg(old)
    assert options.encoder_attn_fn == "topk" and options.attn_k_of("encoder") == 4
    assert options.cross_attn_fn == "softmax" and options.l0drop_compress is True


def test_a_preset_naming_an_unknown_option_fails_at_registration():
    from fairseq_sparse.core.models.sparse_transformer import _preset, sparse_base_architecture

    with pytest.raises(ValueError, match=r"\['cros_attn_fn'\] are not transformer_sparse options"):
        _preset("transformer_sparse_typo", sparse_base_architecture, "a typo", cros_attn_fn="topk")
    assert "transformer_sparse_typo" not in ARCH_MODEL_NAME_REGISTRY


@pytest.mark.parametrize("retained", [["TransformerEncoder", "TransformerEncoderLayer"], ["MultiheadAttention"],
                                      ["TransformerDecoderLayer", "TransformerDecoder"], None])
@pytest.mark.parametrize("options", [{"encoder_attn_fn": "topk", "decoder_attn_fn": "hard", "cross_attn_fn": "rela_g"},
                                     {"l0drop": True}], ids=["functions", "l0drop"])
def test_retain_dropout_modules_takes_stock_fairseqs_class_names(options, retained):
    """fairseq's --retain-dropout --retain-dropout-modules NAMES (Monte Carlo dropout at inference): the
    dropout modules it keeps on are the ones it keeps on in stock fairseq's transformer."""
    from types import SimpleNamespace

    from fairseq.modules.fairseq_dropout import FairseqDropout

    generation = SimpleNamespace(generation=SimpleNamespace(retain_dropout=True, retain_dropout_modules=retained))
    kept = []
    for model in (build_model("transformer_iwslt_de_en", dropout=0.1, attention_dropout=0.1, activation_dropout=0.1),
                  build_model(dropout=0.1, attention_dropout=0.1, activation_dropout=0.1, **options)):
        model.prepare_for_inference_(generation)
        kept.append({name for name, m in model.named_modules() if isinstance(m, FairseqDropout) and m.apply_during_inference})
    assert kept[0] and kept[1] == kept[0]


def test_transformer_align_options_give_stock_transformer_aligns_outputs():
    """--alignment-layer / --alignment-heads / --full-context-alignment on a transformer_sparse architecture:
    with stock transformer_align's weights, the same logits and the same supervised attention."""
    batch = random_batch(lengths=[7, 4, 9], tgt_lengths=[6, 3, 5], seed=7)
    options = dict(alignment_layer=0, alignment_heads=2, full_context_alignment=True)
    stock = build_model("transformer_align", encoder_layers=2, decoder_layers=2, **options).eval()
    ours = build_model(**options).eval()
    ours.load_state_dict(stock.state_dict())
    plain = build_model().eval()
    plain.load_state_dict(stock.state_dict())
    with torch.no_grad():
        (expected, extra), (got, got_extra), (_, plain_extra) = stock(**batch), ours(**batch), plain(**batch)
    assert torch.equal(got, expected) and torch.equal(got_extra["attn"][0], extra["attn"][0])
    assert not torch.allclose(plain_extra["attn"][0], extra["attn"][0])  # the options change what is supervised
    with pytest.raises(ValueError, match="--alignment-layer 2: the decoder has layers 0..1"):
        build_model(alignment_layer=2)


def test_the_oow_window_is_part_of_a_sublayers_method_as_k_is():
    """Averaging refuses checkpoints of two windows (a given window of ceil(k/2) is the default split); an override
    of the window, like one of k, keeps a parameter-free method's parameters and is let through."""
    from fairseq_sparse.core.checkpoint_identity import CheckpointIdentity, check_overrides, differences
    from fairseq_sparse.core.errors import UsageError

    def identity(**given):
        return CheckpointIdentity.of(model_args(**{"encoder_attn_fn": "topk_oow", "attn_k": 12, **given}))

    windowed, default = identity(topk_oow_window=8), identity()
    assert differences(windowed, default) == [("encoder attention", "topk_oow k=12 topk_oow_window=8", "topk_oow k=12")]
    assert differences(windowed, identity(topk_oow_window=4)) == [
        ("encoder attention", "topk_oow k=12 topk_oow_window=8", "topk_oow k=12 topk_oow_window=4")]
    assert differences(identity(topk_oow_window=6), default) == []
    assert differences(identity(topk_oow_window=8, encoder_attn_fn="topk"), identity(encoder_attn_fn="topk")) == []
    for asked in (default, identity(topk_oow_window=4), identity(attn_k=8), identity(encoder_attn_fn="topk")):
        check_overrides(windowed, asked, {}, "checkpoint.pt")
    with pytest.raises(UsageError, match="trained with encoder attention 'topk_oow k=12 topk_oow_window=8', not 'rela_g'"):
        check_overrides(windowed, identity(encoder_attn_fn="rela_g"), {}, "checkpoint.pt")
