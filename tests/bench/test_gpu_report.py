"""The GPU report's run on any machine, with stand-in commands: a failed step is recorded and the run goes on,
the training check reads the logged losses, and the report and logs are written."""

import sys
import tarfile

from fairseq_sparse.bench.gpu_plan import ReportStep
from fairseq_sparse.bench.gpu_report import execute, parse_args

PY = sys.executable


def losses(*values):
    """A stand-in fairseq-train that logs these training losses as --log-format json does."""
    lines = "".join(f"print('| train_inner | ' + json.dumps({{'loss': {v}}}))\n" for v in values)
    return [PY, "-c", f"import json\n{lines}"]


def test_a_failed_step_is_recorded_and_the_run_goes_on(tmp_path):
    args = parse_args(["--out", str(tmp_path / "report" / "REPORT.md"), "--work-dir", str(tmp_path / "work"), "--jobs", "2"])
    data = tmp_path / "work" / "data" / "bin"
    steps = [ReportStep("environment", "environment", "the versions"),
             ReportStep("data", "data", "data:", command=[PY, "-c", f"import os; os.makedirs({str(data)!r})"]),
             ReportStep("train softmax fp16", "train", "t", command=losses(5.0, 4.0), row="softmax", precision="fp16"),
             ReportStep("train softmax bf16", "train", "t", command=losses(3.0, 3.5), row="softmax", precision="bf16"),
             ReportStep("equality", "equality", "e", command=[PY, "-c", "raise ValueError('different logits')"]),
             ReportStep("memory", "memory", "m", command=[PY, "-c", "print('# Memory'); print('IN' + 'FO: a logging line')"]),
             ReportStep("run", "run", "r", command=[PY, "-c", "import time; time.sleep(60)"], timeout=1)]
    assert execute(steps, args) == 1
    assert [s.status for s in steps] == ["ok", "ok", "ok", "FAILED", "FAILED", "ok", "FAILED"]
    assert steps[2].losses == [5.0, 4.0] and steps[3].note == "loss did not fall (3.000 -> 3.500)"
    assert steps[4].note == "exit 1: ValueError: different logits" and steps[6].note == "timed out after 1 s"
    report = args.out.read_text()
    assert "* result: 3 of 7 steps FAILED" in report and "| softmax | " in report and "5.000 → 4.000 | ok" in report
    assert "\n## Memory\n" in report and "INFO: a logging line" not in report  # headings one level down, no logging
    assert "### equality" in report and "ValueError: different logits" in report
    with tarfile.open(args.out.parent / "logs.tar.gz") as tar:
        names = tar.getnames()
    assert {"logs/equality.log", "logs/equality.stderr.log", "logs/train_softmax_fp16.log"} <= set(names)


def test_a_budget_cuts_each_step_to_what_is_left_and_starts_none_past_it(tmp_path):
    """--budget (a lent machine's time): the report is written inside it, a step's time limit is what is left,
    and steps that would start with less than the shortest step's time are not run, with the reason."""
    args = parse_args(["--out", str(tmp_path / "REPORT.md"), "--work-dir", str(tmp_path / "work"), "--budget", "40",
                       "--only", "equality", "memory", "run"])
    steps = [ReportStep("equality", "equality", "e", command=[PY, "-c", "print('same')"]),
             ReportStep("memory", "memory", "m", command=[PY, "-c", "import time; time.sleep(60)"]),
             ReportStep("run", "run", "r", command=[PY, "-c", "print('never')"])]
    assert execute(steps, args) == 1
    assert [s.status for s in steps] == ["ok", "FAILED", "not run"]
    assert steps[1].note.startswith("timed out after") and steps[1].seconds < 30  # cut from 600 s to what was left
    assert steps[2].note == "the --budget of 40 s was spent"
    report = args.out.read_text()
    assert "* result: 1 of 3 steps FAILED, 1 not run" in report and "the --budget of 40 s was spent" in report


def test_a_budget_cuts_each_training_run_when_it_starts(tmp_path):
    """Trainings run --jobs at a time: each is measured against what is left of --budget when it starts, so a
    run queued behind a long one is not started past the budget."""
    args = parse_args(["--out", str(tmp_path / "REPORT.md"), "--work-dir", str(tmp_path / "work"), "--budget", "40",
                       "--jobs", "1", "--only", "train"])
    (tmp_path / "work" / "data" / "bin").mkdir(parents=True)
    steps = [ReportStep("train softmax fp16", "train", "t", command=[PY, "-c", "import time; time.sleep(60)"], row="softmax", precision="fp16"),
             ReportStep("train softmax bf16", "train", "t", command=losses(5.0, 4.0), row="softmax", precision="bf16")]
    assert execute(steps, args) == 1
    assert steps[0].note.startswith("timed out after") and steps[0].seconds < 30
    assert steps[1].status == "not run" and steps[1].note == "the --budget of 40 s was spent"
