"""fairseq-preprocess -> fairseq-train -> checkpoint -> fairseq-generate -> sacreBLEU, on real bitext,
each console script in a process of its own.

A few hundred German-English verse pairs from the offline Bible corpus
(fairseq_sparse.data.bible), a tiny transformer_sparse_mini, a few updates.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import EVAL_PAIRS
from fairseq_sparse.evaluate import corpus_bleu, read_hypotheses

ROOT = Path(__file__).resolve().parents[1]
USER_DIR = str(ROOT / "fairseq_sparse")
BIN = Path(sys.executable).parent
TINY_MODEL = [
    "--arch", "transformer_sparse_mini", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
    "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
    "--encoder-attention-heads", "4", "--decoder-attention-heads", "4", "--share-all-embeddings",
]


def run(tool, *args, stdin=None):
    """A fairseq console script, or a module of this package (``fairseq_sparse.train``)."""
    command = [sys.executable, "-m", tool] if tool.startswith("fairseq_sparse.") else [str(BIN / tool)]
    result = subprocess.run([*command, *map(str, args)], capture_output=True, text=True, input=stdin, timeout=600)
    if result.returncode != 0:
        raise AssertionError(f"{tool} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result.stdout + result.stderr


def train(bible, save_dir, *extra, updates=5, tool="fairseq-train"):
    return run(
        tool, bible / "bin", "--user-dir", USER_DIR, *TINY_MODEL, "--optimizer", "adam", "--lr", "0.002",
        "--max-tokens", "2000", "--max-update", updates, "--save-dir", save_dir, "--no-epoch-checkpoints",
        "--cpu", "--log-format", "simple", "--log-interval", "1", "--seed", "1", "--dropout", "0.1", *extra,
    )


def generate(bible, checkpoint, *extra):
    return run(
        "fairseq-generate", bible / "bin", "--user-dir", USER_DIR, "--path", checkpoint, "--beam", "4",
        "--batch-size", "16", "--max-len-a", "1.2", "--max-len-b", "5", "--cpu", "--scoring", "sacrebleu",
        # fairseq otherwise drops a last batch whose size is not a multiple of 8
        "--required-batch-size-multiple", "1",
        "--post-process", "subword_nmt", *extra,
    )


def check_generation(output: str, bible: Path, tmp_path: Path):
    assert re.search(r"Generate test with beam=4: BLEU = \d+\.\d+", output), output[-2000:]
    log = tmp_path / "generate.log"
    log.write_text(output)
    hyps = read_hypotheses(str(log), "en")
    refs = (bible / "test.raw.en").read_text().splitlines()
    assert len(hyps) == len(refs) == EVAL_PAIRS
    score, signature = corpus_bleu(hyps, refs)
    assert 0.0 <= score.score <= 100.0
    assert "tok:13a" in str(signature) and "version:2.6.0" in str(signature)


@pytest.fixture(scope="module")
def softmax_checkpoint(bible, tmp_path_factory):
    """fairseq-train in a process of its own that loads the plugin from --user-dir. Every registered
    function is trained and decoded by fairseq-train and fairseq-generate in test_fairseq_features (in
    one process: the same code, without a start-up per function)."""
    save_dir = tmp_path_factory.mktemp("softmax")
    log = train(bible, save_dir)
    assert "num_updates 5" in log and "nan" not in re.findall(r"loss[= ](\S+)", log)
    return save_dir


def test_restore_file_continues_training(bible, softmax_checkpoint):
    log = train(bible, softmax_checkpoint, "--restore-file", softmax_checkpoint / "checkpoint_last.pt", updates=7)
    assert re.search(r"Loaded checkpoint .*checkpoint_last\.pt \(epoch \d+ @ 5 updates\)", log), log[-3000:]
    assert "num_updates 7" in log


def test_soft_trained_model_decodes_hard_via_model_overrides(bible, softmax_checkpoint, tmp_path):
    overrides = "{'decoder_attn_fn': 'hard', 'cross_attn_fn': 'hard', 'encoder_attn_fn': 'topk', 'attn_k': 3}"
    output = generate(bible, softmax_checkpoint / "checkpoint_last.pt", "--model-overrides", overrides)
    check_generation(output, bible, tmp_path)


def test_model_overrides_to_a_function_with_parameters_fails_clearly(bible, softmax_checkpoint):
    result = subprocess.run(
        [str(BIN / "fairseq-generate"), str(bible / "bin"), "--user-dir", USER_DIR, "--path",
         str(softmax_checkpoint / "checkpoint_last.pt"), "--cpu", "--model-overrides", "{'cross_attn_fn': 'rela_g'}"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr  # one line (core/errors.py)
    assert result.stderr.strip().splitlines()[-1].endswith(
        "checkpoint_last.pt was trained with cross attention 'softmax', not 'rela_g': the two functions do not have "
        "the same parameters")


def test_a_checkpoint_of_other_sizes_stops_fairseq_train_with_our_message_last(bible, softmax_checkpoint, tmp_path):
    """fairseq's trainer re-raises a failed load as "Cannot load model parameters ... ensure that the
    architectures match": our explanation (which parameters, which shapes) is what the user reads."""
    result = subprocess.run(
        [str(BIN / "fairseq-train"), str(bible / "bin"), "--user-dir", USER_DIR, *TINY_MODEL, "--encoder-embed-dim", "16",
         "--decoder-embed-dim", "16", "--optimizer", "adam", "--lr", "0.001", "--max-tokens", "2000", "--cpu",
         "--restore-file", str(softmax_checkpoint / "checkpoint_last.pt"), "--save-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("fairseq-train: error: checkpoint parameters do not fit") and ", 32) in the checkpoint" in last and ", 16) here" in last


def test_fairseq_interactive(bible, softmax_checkpoint):
    sources = "\n".join((bible / "test.de").read_text().splitlines()[:3]) + "\n"
    output = run(
        "fairseq-interactive", bible / "bin", "--user-dir", USER_DIR, "--path", softmax_checkpoint / "checkpoint_last.pt",
        "--source-lang", "de", "--target-lang", "en", "--beam", "2", "--cpu", stdin=sources,
    )
    assert len(re.findall(r"^H-\d+\t", output, flags=re.M)) == 3


def test_hub_interface_with_overrides(bible, softmax_checkpoint):
    from fairseq_sparse.core.models.sparse_transformer import SparseTransformerModel

    hub = SparseTransformerModel.from_pretrained(
        str(softmax_checkpoint), checkpoint_file="checkpoint_last.pt", data_name_or_path=str(bible / "bin"),
        decoder_attn_fn="hard",
    )
    assert hub.models[0].decoder.layers[0].self_attn.attn_fn == "hard"
    source = (bible / "test.de").read_text().splitlines()[0]
    translation = hub.translate(source, beam=2)
    assert isinstance(translation, str) and translation.strip()


def test_missing_data_directory_is_a_clear_error(tmp_path):
    result = subprocess.run(
        [str(BIN / "fairseq-train"), str(tmp_path / "missing"), "--user-dir", USER_DIR, *TINY_MODEL, "--cpu", "--max-update", "1", "--max-tokens", "100"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode != 0
    assert "missing" in result.stderr and ("No such file" in result.stderr or "not found" in result.stderr.lower())


def hypotheses(output: str):
    return sorted(re.findall(r"^H-(\d+)\t(\S+)\t(.*)$", output, flags=re.M))


def test_l0drop_fine_tuning_and_compressed_generation(bible, softmax_checkpoint, tmp_path):
    """The paper's recipe: fine-tune a trained softmax model with L0Drop, decode from the compressed memory."""
    save_dir = tmp_path / "l0drop"
    log = train(
        bible, save_dir, "--l0drop", "--criterion", "label_smoothed_cross_entropy_l0drop", "--l0-lambda", "3.0",
        "--label-smoothing", "0.1", "--restore-file", softmax_checkpoint / "checkpoint_last.pt",
        "--reset-optimizer", "--reset-dataloader", "--reset-meters", "--lr", "0.3", updates=20,
    )
    assert "gate parameters are not in the checkpoint; initialising them" in log
    pruned = [float(s) for s in re.findall(r"\| pruned ([\d.]+)", log)]
    assert pruned and "l0_loss" in log and "valid on 'valid' subset" in log
    assert pruned[-1] > 0.0, "a large lambda should close some gates"
    checkpoint = save_dir / "checkpoint_last.pt"
    short = ("--max-len-a", "0", "--max-len-b", "12")  # the over-driven model babbles: keep decoding short
    compressed = generate(bible, checkpoint, *short)
    check_generation(compressed, bible, tmp_path)
    uncompressed = generate(bible, checkpoint, *short, "--model-overrides", "{'l0drop_compress': False}")
    pairs = list(zip(hypotheses(compressed), hypotheses(uncompressed)))
    assert len(pairs) == EVAL_PAIRS
    for (i, score_c, text_c), (j, score_u, text_u) in pairs:
        assert (i, text_c) == (j, text_u) and abs(float(score_c) - float(score_u)) <= 1e-5
    report = subprocess.run([sys.executable, "-m", "fairseq_sparse.l0drop_pruned", str(bible / "bin"), "--path", str(checkpoint)],
                            capture_output=True, text=True, timeout=300, check=True).stdout
    found = re.search(r"test: (\d+) of (\d+) source encodings pruned \(40 sentences\): ([\d.]+)% pruned", report)
    assert found, report
    assert int(found.group(1)) > 0 and float(found.group(3)) == pytest.approx(100 * int(found.group(1)) / int(found.group(2)), abs=0.01)


def test_tensorboard_logging_works_and_no_install_warning(bible, tmp_path):
    """fairseq prints "Please install tensorboardX" on import when it is missing, and
    --tensorboard-logdir then silently logs nothing; tensorboardX is a declared dependency."""
    output = train(bible, tmp_path / "ck", "--tensorboard-logdir", tmp_path / "tb", updates=2)
    assert "install tensorboardX" not in output
    assert list((tmp_path / "tb").rglob("events.out.tfevents.*")), "no tensorboard event file written"
