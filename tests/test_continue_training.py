"""python -m fairseq_sparse.train --continue-from: a run carried on with new parameters or a new criterion,
its optimizer state and schedule kept (L0Drop's official fine-tune)."""

import math
import re
import shutil
import subprocess
import sys

import pytest
import torch

from test_end_to_end import TINY_MODEL, USER_DIR, train

SCHEDULE = ("--lr-scheduler", "inverse_sqrt", "--warmup-updates", "4", "--dropout", "0.1")
L0DROP = ("--l0drop", "--criterion", "label_smoothed_cross_entropy_l0drop", "--l0-lambda", "0.3", "--label-smoothing", "0.1")


def losses_by_update(log: str) -> dict:
    return {int(n): float(loss) for loss, n in re.findall(r"\| train_inner \|.* loss=([\d.]+),.* num_updates=(\d+)", log)}


def learning_rates(log: str) -> dict:
    return {int(n): float(lr) for n, lr in re.findall(r"num_updates=(\d+), lr=([\d.e-]+)", log)}


@pytest.fixture(scope="module")
def base(bible, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("base")
    train(bible, save_dir, *SCHEDULE, updates=4)
    return save_dir / "checkpoint_last.pt"


def test_continuing_without_changes_equals_training_on(bible, base, tmp_path):
    """Same model and criterion: the continuation is the uninterrupted run (fairseq seeds every update)."""
    straight = train(bible, tmp_path / "straight", *SCHEDULE, updates=7)
    continued = train(bible, tmp_path / "continued", *SCHEDULE, "--continue-from", base, "--continue-updates", 3,
                      updates=99, tool="fairseq_sparse.train")  # --max-update becomes the base's 4 + 3
    assert "@ 4 updates" in continued and "num_updates 7" in continued
    expected = {n: loss for n, loss in losses_by_update(straight).items() if n > 4}
    assert sorted(expected) == [5, 6, 7] and losses_by_update(continued) == expected
    a = torch.load(tmp_path / "straight" / "checkpoint_last.pt", weights_only=False)["model"]
    b = torch.load(tmp_path / "continued" / "checkpoint_last.pt", weights_only=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_l0drop_continues_the_optimizer_and_schedule_with_new_gates(bible, base, tmp_path):
    from fairseq_sparse.continue_training import Continuation, prepare
    from fairseq_sparse.train import parse

    save_dir = tmp_path / "l0drop"
    argv = [str(bible / "bin"), "--user-dir", USER_DIR, *TINY_MODEL, "--optimizer", "adam", "--lr", "0.002",
            "--max-tokens", "2000", "--cpu", *SCHEDULE, *L0DROP, "--save-dir", str(save_dir)]
    cfg = parse(argv)
    prepare(cfg, Continuation(str(base), 2))
    assert cfg.optimization.max_update == 6
    written = torch.load(save_dir / "checkpoint_last.pt", weights_only=False)
    before = torch.load(base, weights_only=False)
    assert written["optimizer_history"][-1]["criterion_name"] == "L0DropCriterion"
    assert written["optimizer_history"][-1]["num_updates"] == 4
    kept, old = written["last_optimizer_state"]["state"], before["last_optimizer_state"]["state"]
    assert len(kept) == len(old) and len(written["last_optimizer_state"]["param_groups"][0]["params"]) == len(old) + 2
    # the gate parameters come after the encoder's layers: every moment is found under its parameter's new index
    moments = sorted(torch.cat([s["exp_avg"].flatten() for s in kept.values()]).tolist())
    assert moments == sorted(torch.cat([s["exp_avg"].flatten() for s in old.values()]).tolist())

    log = train(bible, save_dir, *SCHEDULE, *L0DROP, "--continue-from", base, "--continue-updates", 2, updates=99,
                tool="fairseq_sparse.train")
    assert "gate parameters are not in the checkpoint" in log and "num_updates 6" in log
    warmup_then_decay = 0.002 * (4 ** 0.5) * (5 ** -0.5)  # inverse_sqrt at update 5, warm-up 4: not restarted
    assert learning_rates(log)[5] == pytest.approx(warmup_then_decay, rel=1e-4)
    resumed = train(bible, save_dir, *SCHEDULE, *L0DROP, "--continue-from", base, "--continue-updates", 3, updates=99,
                    tool="fairseq_sparse.train")
    assert "@ 6 updates" in resumed and "num_updates 7" in resumed  # its own checkpoint, not the base again


@pytest.mark.parametrize("extra, message", [
    (("--reset-optimizer",), "--reset-optimizer contradicts it"),
    (("--lr-scheduler", "fixed"), "learning-rate scheduler 'inverse_sqrt', this run uses 'fixed'"),
    (("--finetune-from-model", "BASE"), "--finetune-from-model contradicts it"),
])
def test_a_continuation_that_cannot_be_is_one_line(bible, base, tmp_path, extra, message):
    schedule = SCHEDULE if "fixed" not in extra else SCHEDULE[4:]
    extra = [str(base) if word == "BASE" else word for word in extra]
    result = subprocess.run(
        [sys.executable, "-m", "fairseq_sparse.train", str(bible / "bin"), "--user-dir", USER_DIR, *TINY_MODEL,
         "--optimizer", "adam", "--lr", "0.002", "--max-tokens", "2000", "--cpu", *schedule, *extra,
         "--save-dir", str(tmp_path), "--continue-from", str(base), "--continue-updates", "1"],
        capture_output=True, text=True, timeout=300)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert message in result.stderr.strip().splitlines()[-1], result.stderr[-2000:]


@pytest.mark.parametrize("kind, message", [
    ("averaged", "is an average of checkpoints: its optimizer state belongs to the newest of them"),
    ("exported", "has no optimizer state"),
])
def test_a_checkpoint_without_its_own_optimizer_state_cannot_be_continued(bible, base, tmp_path, kind, message):
    given = tmp_path / f"{kind}.pt"
    if kind == "averaged":  # average_checkpoints keeps the newest checkpoint's optimizer state
        (tmp_path / "epochs").mkdir()
        shutil.copy(base, tmp_path / "epochs" / "checkpoint1.pt")
        subprocess.run([sys.executable, "-m", "fairseq_sparse.average_checkpoints", str(tmp_path / "epochs"), "--last",
                        "1", "--output", str(given)], check=True, capture_output=True, timeout=300)
    else:  # weights only, as --no-save-optimizer-state writes them
        state = torch.load(base, weights_only=False)
        state["last_optimizer_state"] = None
        torch.save(state, given)
    result = subprocess.run(
        [sys.executable, "-m", "fairseq_sparse.train", str(bible / "bin"), "--user-dir", USER_DIR, *TINY_MODEL,
         "--optimizer", "adam", "--lr", "0.002", "--max-tokens", "2000", "--cpu", *SCHEDULE,
         "--save-dir", str(tmp_path / "run"), "--continue-from", str(given), "--continue-updates", "1"],
        capture_output=True, text=True, timeout=300)
    assert result.returncode != 0 and message in result.stderr.strip().splitlines()[-1], result.stderr[-2000:]


def test_a_bfloat16_run_continues_in_bfloat16(bible, tmp_path):
    """--bf16 --memory-efficient-bf16 (1.35x faster on a CPU with avx512_bf16) keeps one optimizer state per parameter,
    so the continuation maps it by name as in float32 (fairseq saves the weights in float32 either way)."""
    bf16 = ("--bf16", "--memory-efficient-bf16")
    train(bible, tmp_path / "base", *SCHEDULE, *bf16, updates=3, tool="fairseq_sparse.train")
    log = train(bible, tmp_path / "l0drop", *SCHEDULE, *L0DROP, *bf16, "--continue-from",
                tmp_path / "base" / "checkpoint_last.pt", "--continue-updates", 2, updates=99, tool="fairseq_sparse.train")
    assert "gate parameters are not in the checkpoint" in log and "num_updates 5" in log
    written = torch.load(tmp_path / "l0drop" / "checkpoint_last.pt", weights_only=False)
    assert sorted(losses_by_update(log)) == [4, 5] and all(map(math.isfinite, losses_by_update(log).values()))
    gates = [name for name in written["model"] if "gate" in name]
    assert gates and all(torch.isfinite(written["model"][name]).all() for name in gates)
    assert all(torch.isfinite(s["exp_avg"]).all() for s in written["last_optimizer_state"]["state"].values())
