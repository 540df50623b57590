"""Bad input as a new user gives it, one case per kind: each gets one line naming the problem (and the file
where there is one), no traceback, and writes or changes nothing. The kinds of issue 75 (a checkpoint's
identity against what a command asks, checks that Python's coercions got past, guesses said aloud) and
earlier ones (a file that is no checkpoint, a misspelt override).

The models are tiny transformer_sparse_mini trainings of a few updates on the ``bible`` fixture (de-en).
"""

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_end_to_end import BIN, TINY_MODEL, USER_DIR, train

import fairseq_sparse  # noqa: F401  (wraps fairseq's loader)
from fairseq import checkpoint_utils
from fairseq_sparse.core.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def models(bible, tmp_path_factory):
    """Three de-en trainings of three updates: softmax everywhere, and top-k (k = 4, k = 2) in the encoder."""
    root = tmp_path_factory.mktemp("probes")
    train(bible, root / "softmax", updates=3)
    for k in (4, 2):
        train(bible, root / f"topk{k}", "--encoder-attn-fn", "topk", "--attn-k", k, updates=3)
    return root


def files(folder: Path) -> dict:
    """Every file under ``folder`` with its size and modification time: what a refused command must leave as is."""
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*")) if p.is_file()} \
        if folder.exists() else {}


def refused(command, program: str, *named: str, stdin=None) -> str:
    """Run ``command``; it fails with one error line naming each of ``named``, and no traceback. Returns the line."""
    result = subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=300, input=stdin)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "Traceback" not in output, output[-3000:]
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0] == result.stderr.strip().splitlines()[-1], result.stderr[-3000:]
    line = errors[0]
    assert line.startswith(f"{program}: error: "), line
    for name in named:
        assert str(name) in line, (name, line)
    return line


def generate(bible, checkpoint, *extra):
    return [BIN / "fairseq-generate", bible / "bin", "--user-dir", USER_DIR, "--path", checkpoint, "--cpu",
            "--beam", "2", "--batch-size", "16", "--required-batch-size-multiple", "1", *extra]


def training(bible, save_dir, *extra, tool=None):
    start = [sys.executable, "-m", tool] if tool else [BIN / "fairseq-train"]
    return [*start, bible / "bin", "--user-dir", USER_DIR, *TINY_MODEL, "--optimizer", "adam", "--lr", "0.002",
            "--max-tokens", "2000", "--max-update", "2", "--save-dir", save_dir, "--cpu", *extra]


# ---------------------------------------------------------------- a checkpoint's identity against the request

@pytest.mark.parametrize("override, named", [
    ("{'l0drop': True}", ["--l0drop False, not True", "no such L0Drop gates"]),
    ("{'cross_attn_fn': 'rela_g'}", ["cross attention 'softmax', not 'rela_g'"]),
])
def test_an_override_that_would_invent_parameters_is_refused(bible, models, override, named):
    checkpoint = models / "softmax" / "checkpoint_last.pt"
    before = files(models)
    refused(generate(bible, checkpoint, "--model-overrides", override), "fairseq-generate", checkpoint, *named)
    assert files(models) == before


def test_override_of_the_shape_is_refused(models):
    checkpoint = models / "softmax" / "checkpoint_last.pt"
    with pytest.raises(UsageError, match=r"--encoder-attention-heads 4, not 8: its parameters were trained in that"):
        checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint), {"encoder_attention_heads": 8})


def test_a_language_pair_the_model_was_not_trained_on_is_refused(bible, models):
    checkpoint = models / "softmax" / "checkpoint_last.pt"
    line = refused(generate(bible, checkpoint, "--source-lang", "en", "--target-lang", "de"), "fairseq-generate",
                   "trained de->en", "reads en->de", bible / "bin")
    assert "give --source-lang de --target-lang en" in line


def test_the_hub_refuses_languages_that_contradict_the_checkpoint(bible, models):
    from fairseq_sparse import SparseTransformerModel

    with pytest.raises(UsageError, match="trained with source language 'de', not 'en'"):
        SparseTransformerModel.from_pretrained(str(models / "softmax"), checkpoint_file="checkpoint_last.pt",
                                               data_name_or_path=str(bible / "bin"), source_lang="en", target_lang="de")


@pytest.mark.parametrize("first, second, named", [
    ("topk4", "topk2", "encoder attention 'topk k=2' there, 'topk k=4' in checkpoint1.pt"),
    ("softmax", "topk4", "encoder attention 'topk k=4' there, 'softmax' in checkpoint1.pt"),
])
def test_averaging_refuses_checkpoints_of_other_methods(models, tmp_path, first, second, named):
    save_dir = tmp_path / "run"
    save_dir.mkdir()
    shutil.copy(models / first / "checkpoint_last.pt", save_dir / "checkpoint1.pt")
    shutil.copy(models / second / "checkpoint_last.pt", save_dir / "checkpoint2.pt")
    before = files(save_dir)
    refused([sys.executable, "-m", "fairseq_sparse.average_checkpoints", save_dir, "--last", "2", "--output",
             save_dir / "averaged.pt"], "average_checkpoints", save_dir / "checkpoint2.pt", named)
    assert files(save_dir) == before


@pytest.mark.parametrize("change, named", [
    (["--encoder-attention-heads", "2"], ["--encoder-attention-heads 4, this run asks for 2"]),
    (["--source-lang", "en", "--target-lang", "de"], ["trained de->en", "reads en->de"]),
])
def test_a_continuation_that_contradicts_its_base_is_refused(bible, models, tmp_path, change, named):
    base = models / "softmax" / "checkpoint_last.pt"
    refused(training(bible, tmp_path / "run", "--continue-from", base, "--continue-updates", "2", *change,
                     tool="fairseq_sparse.train"), "fairseq_sparse.train", *named)
    assert files(tmp_path / "run") == {}


# ---------------------------------------------------------------- checks that mean what they say

def test_an_override_of_another_type_is_refused_in_one_line(bible, models):
    checkpoint = models / "softmax" / "checkpoint_last.pt"
    refused(generate(bible, checkpoint, "--model-overrides", "{'attn_k': True}"), "fairseq-generate",
            "attn_k=True is a bool, the option takes an integer", checkpoint)


@pytest.mark.parametrize("name, value, takes", [("attn_k", 1.0, "an integer"), ("attn_k", "8", "an integer"),
                                                ("l0drop_compress", 1, "True or False"), ("beam", True, "an integer")])
def test_values_python_would_coerce_are_refused(models, name, value, takes):
    with pytest.raises(UsageError, match=f"{name}={value!r} is a {type(value).__name__}, the option takes {takes}"):
        checkpoint_utils.load_checkpoint_to_cpu(str(models / "softmax" / "checkpoint_last.pt"), {name: value})


@pytest.mark.parametrize("text", ["1_0", "٨", "True", "8.0"])
def test_integer_options_take_digits_only(text, tmp_path, capsys):
    from fairseq_sparse import average_checkpoints

    with pytest.raises(SystemExit):
        average_checkpoints.main([str(tmp_path), "--last", text, "--output", str(tmp_path / "out.pt")])
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        f"error: argument --last: must be a whole number written in digits, got {text!r}")
    assert files(tmp_path) == {}


def test_a_model_option_of_another_type_is_refused():
    from fairseq_sparse.core.models.options import SparseModelOptions

    with pytest.raises(UsageError, match="--attn-k: True is a bool, the option takes an integer"):
        SparseModelOptions(attn_k=True).validate()


def test_half_a_language_pair_at_training_is_refused(bible, tmp_path):
    refused(training(bible, tmp_path / "run", "--source-lang", "en"), "fairseq-train",
            "--source-lang en without --target-lang", "(de-en)", bible / "bin")
    assert files(tmp_path / "run") == {}


def test_a_folder_of_the_package_given_as_user_dir_is_named(bible, tmp_path):
    command = training(bible, tmp_path / "run")
    command[command.index(USER_DIR)] = str(ROOT / "fairseq_sparse" / "data")
    refused(command, "fairseq-train", f"--user-dir {ROOT / 'fairseq_sparse' / 'data'} is a folder of fairseq-sparse, "
            f"not the plugin: pass --user-dir {ROOT / 'fairseq_sparse'}")
    assert not (tmp_path / "run").exists()


def test_flex_training_on_the_cpu_is_refused_before_the_first_step(bible, tmp_path):
    refused(training(bible, tmp_path / "run", "--encoder-attn-fn", "window", "--attn-impl", "flex"), "fairseq-train",
            "--attn-impl flex trains on CUDA only", "window attention")
    assert files(tmp_path / "run") == {}  # no crash.pt


def test_the_printout_says_the_implementation_each_sublayer_runs():
    from helpers import build_model

    printout = str(build_model(encoder_attn_fn="window", attn_impl="flex"))
    assert "attn_fn=window, k=8, heads=4, impl=flex" in printout
    assert "attn_fn=softmax, heads=4\n" in printout and "softmax, heads=4, impl" not in printout


def _datasets_tests():
    spec = importlib.util.spec_from_file_location("datasets_tests", Path(__file__).parent / "data" / "test_datasets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("character, shown", [("\x00", "U+0000 (NUL)"), ("\x1b", "U+001B (escape)")])
def test_a_control_character_in_raw_text_is_refused_with_its_file_and_line(tmp_path, capsys, character, shown):
    datasets = _datasets_tests()
    script, extra, writer, _ = datasets.CASES["iwslt14.de-en"]
    raw_dir = writer(tmp_path / "raw")
    victim = next(p for p in sorted(raw_dir.rglob("train.tags.*")) if p.is_file())
    lines = victim.read_text(encoding="utf-8").split("\n")
    number = next(i for i, line in enumerate(lines) if not line.startswith("<")) + 1
    lines[number - 1] = lines[number - 1].replace(" ", f" W{character}ort ", 1)
    victim.write_text("\n".join(lines), encoding="utf-8")
    out = tmp_path / "out"
    rc = datasets.SCRIPTS[script].main(["--raw", str(raw_dir), "--out", str(out), *extra])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("error:") == 1 and "Traceback" not in err, err
    assert f"{victim}: line {number} holds the control character {shown}" in err
    assert files(out) == {}


def test_an_over_long_interactive_input_is_one_line_and_counted(bible, models):
    """The three inputs in one buffer: the others keep their numbers around the skipped one."""
    sources = (bible / "test.de").read_text().splitlines()[:2]
    stdin = "\n".join([sources[0], " ".join(["und"] * 1100), sources[1]]) + "\n"
    result = subprocess.run(
        [str(BIN / "fairseq-interactive"), str(bible / "bin"), "--user-dir", USER_DIR, "--path",
         str(models / "softmax" / "checkpoint_last.pt"), "--beam", "2", "--cpu", "--buffer-size", "3"],
        capture_output=True, text=True, timeout=300, input=stdin)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    said = [line for line in result.stderr.splitlines() if line.startswith("fairseq-interactive:")]
    assert said == ["fairseq-interactive: input 1 skipped: 1101 tokens, the model reads at most 1024 "
                    "(--max-source-positions)",
                    "fairseq-interactive: skipped 1 input(s) longer than 1024 tokens"]
    assert [line.split("\t")[0] for line in result.stdout.splitlines() if line.startswith("H-")] == ["H-0", "H-2"]


# ---------------------------------------------------------------- kinds of earlier issues

def test_a_file_that_is_no_checkpoint_is_one_line(bible, tmp_path):
    empty = tmp_path / "checkpoint_last.pt"
    empty.write_bytes(b"")
    before = files(tmp_path)
    refused(generate(bible, empty), "fairseq-generate", f"{empty} is not a PyTorch checkpoint: the file is empty")
    assert files(tmp_path) == before
