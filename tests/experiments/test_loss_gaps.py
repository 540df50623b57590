"""The gap of a method to softmax read where softmax reached the same loss (results/study's batch comparison)."""

import csv

import pytest

from fairseq_sparse.experiments.loss_gaps import gap_at_softmax_loss, main

SOFTMAX = {1: 6.0, 2: 5.0, 3: 4.0}
METHOD = {1: 7.0, 2: 5.5, 3: 4.3}  # gaps 1.0, 0.5, 0.3


def test_the_gap_is_read_linearly_between_the_epochs_around_the_loss():
    assert gap_at_softmax_loss(SOFTMAX, METHOD, 4.5) == pytest.approx(0.4)
    assert gap_at_softmax_loss(SOFTMAX, METHOD, 5.0) == pytest.approx(0.5)
    assert gap_at_softmax_loss(SOFTMAX, METHOD, 6.0) == pytest.approx(1.0)


def test_a_loss_the_curve_never_spans_or_spans_only_across_a_missing_epoch_has_no_gap():
    assert gap_at_softmax_loss(SOFTMAX, METHOD, 3.9) is None and gap_at_softmax_loss(SOFTMAX, METHOD, 6.1) is None
    assert gap_at_softmax_loss({1: 6.0, 3: 4.0}, METHOD, 5.0) is None


def write_curves(path, curves):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["dataset", "row", "seed", "model", "epoch", "valid_loss", "train_loss"])
        writer.writeheader()
        for (row, seed), curve in curves.items():
            writer.writerows({"dataset": "d", "row": row, "seed": seed, "model": f"{row}-x", "epoch": e,
                              "valid_loss": loss, "train_loss": ""} for e, loss in curve.items())


def test_each_epoch_of_a_pair_is_set_beside_a_slower_pair_at_the_same_softmax_loss(tmp_path, capsys):
    # the slower pair learns at half the speed per epoch with the same gap per softmax loss
    slow_softmax = {1: 7.0, 2: 6.0, 3: 5.5, 4: 5.0, 5: 4.5, 6: 4.0}
    slow_method = {e: loss + gap_at_softmax_loss(SOFTMAX, METHOD, loss) for e, loss in slow_softmax.items() if e > 1}
    write_curves(tmp_path / "fast.csv", {("softmax", "1"): SOFTMAX, ("hard", "1"): METHOD})
    write_curves(tmp_path / "slow.csv", {("softmax", "1"): slow_softmax, ("hard", "1"): slow_method})
    table = main(["--pair", str(tmp_path / "slow.csv"), "softmax", "hard", "1",
                  "--against", str(tmp_path / "fast.csv"), "softmax", "hard", "1"])
    assert [epoch for epoch, *_ in table] == [2, 3, 4, 5, 6]
    for epoch, loss, gap, (theirs,) in table:
        assert theirs == pytest.approx(gap)
    assert "+0.000" in capsys.readouterr().out


def test_a_missing_file_or_curve_or_an_ambiguous_one_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="no such curves file"):
        main(["--pair", str(tmp_path / "none.csv"), "softmax", "hard", "1", "--against", str(tmp_path / "none.csv"), "a", "b", "1"])
    write_curves(tmp_path / "c.csv", {("softmax", "1"): SOFTMAX})
    with pytest.raises(SystemExit, match="no curve for row 'hard', seed 1"):
        main(["--pair", str(tmp_path / "c.csv"), "softmax", "hard", "1", "--against", str(tmp_path / "c.csv"), "softmax", "hard", "1"])
    with open(tmp_path / "c.csv", "a") as f:  # the same row and seed on a second dataset
        f.write("e,softmax,1,softmax-y,1,6.5,\n")
    with pytest.raises(SystemExit, match="two curves for row 'softmax', seed 1"):
        main(["--pair", str(tmp_path / "c.csv"), "softmax", "hard", "1", "--against", str(tmp_path / "c.csv"), "softmax", "hard", "1"])


def test_a_row_trained_twice_by_one_command_is_read_by_the_run_it_names(tmp_path):
    """A continuation that needs a model whose checkpoints were lost trains its command again: the curves
    hold both runs, and reading the row without naming one of them is refused rather than guessed."""
    rerun = {1: 6.0, 2: 5.2, 3: 4.2}  # gaps 1.0, 0.3, 0.1 against the method
    write_curves(tmp_path / "c.csv", {("softmax", "1"): SOFTMAX, ("hard", "1"): METHOD})
    with open(tmp_path / "c.csv", newline="") as f:
        lines = [dict(line, run="1") for line in csv.DictReader(f)]
    lines += [{"dataset": "d", "row": "softmax", "seed": "1", "run": "2", "model": "softmax-x", "epoch": e,
               "valid_loss": loss, "train_loss": ""} for e, loss in rerun.items()]
    with open(tmp_path / "c.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["dataset", "row", "seed", "run", "model", "epoch", "valid_loss", "train_loss"])
        writer.writeheader()
        writer.writerows(lines)
    against = ["--against", str(tmp_path / "c.csv"), "softmax@1", "hard", "1"]
    with pytest.raises(SystemExit, match=r"2 runs of row 'softmax', seed 1 .*softmax@RUN, RUN one of 1, 2"):
        main(["--pair", str(tmp_path / "c.csv"), "softmax", "hard", "1"] + against)
    with pytest.raises(SystemExit, match="no run '3' of row 'softmax'"):
        main(["--pair", str(tmp_path / "c.csv"), "softmax@3", "hard", "1"] + against)
    assert [gap for _, _, gap, _ in main(["--pair", str(tmp_path / "c.csv"), "softmax@1", "hard", "1"] + against)] \
        == pytest.approx([1.0, 0.5, 0.3])
    assert [gap for _, _, gap, _ in main(["--pair", str(tmp_path / "c.csv"), "softmax@2", "hard", "1"] + against)] \
        == pytest.approx([1.0, 0.3, 0.1])
