"""--model-overrides as fairseq applies them, with a name that no option has refused."""

from pathlib import Path

import pytest

import fairseq_sparse  # noqa: F401 - registers the model and wraps fairseq's loader
from fairseq import checkpoint_utils

from fairseq_sparse.core.errors import UsageError

CHECKPOINT = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints" / "c1f65fb_topk_hard_relag_l0drop.pt"


def test_a_misspelt_override_is_refused_naming_the_closest_option():
    with pytest.raises(UsageError) as failure:
        checkpoint_utils.load_checkpoint_to_cpu(str(CHECKPOINT), {"cros_attn_fn": "softmax"})
    message = str(failure.value)
    assert "\n" not in message
    assert "'cros_attn_fn' is no option" in message and str(CHECKPOINT) in message
    assert "did you mean 'cross_attn_fn'?" in message


def test_known_overrides_are_applied_including_options_newer_than_the_checkpoint():
    state = checkpoint_utils.load_checkpoint_to_cpu(str(CHECKPOINT), None)
    model = state["cfg"]["model"]
    assert getattr(model, "attn_impl", None) is None   # saved before --attn-impl existed
    state = checkpoint_utils.load_checkpoint_to_cpu(
        str(CHECKPOINT), {"encoder_attn_fn": "softmax", "attn_impl": "reference", "beam": 3, "model": {}})
    model = state["cfg"]["model"]
    assert model.encoder_attn_fn == "softmax" and model.attn_impl == "reference"
    assert state["cfg"]["generation"]["beam"] == 3


def test_fairseq_generate_reports_the_misspelt_override_in_one_line(bible):
    import subprocess
    import sys

    result = subprocess.run(
        [str(Path(sys.executable).parent / "fairseq-generate"), str(bible / "bin"), "--user-dir",
         str(Path(fairseq_sparse.__file__).parent), "--path", str(CHECKPOINT), "--cpu", "--gen-subset", "test",
         "--model-overrides", "{'cros_attn_fn': 'hard'}"],
        capture_output=True, text=True, timeout=300)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"fairseq-generate: error: --model-overrides: 'cros_attn_fn' is no option of fairseq or of the model in "
        f"{CHECKPOINT}; did you mean 'cross_attn_fn'?")
