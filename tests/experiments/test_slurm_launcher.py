"""The table runner on a real Slurm cluster (``--launcher slurm``): the one-node cluster that
``scripts/slurm-local.sh start`` runs on this machine (scripts/test.sh and .ci/run start it). Nothing here
fakes ``sbatch``: jobs are submitted, run, cancelled, preempted and requeued by Slurm itself.

The tables share one data and model folder (``root``); the test table is
``tests/fixtures/tables/slurm_resume.yaml`` (trainings with hard retrieval, about a second an update, so a
test can stop one between its checkpoint at update 6 and its end at update 12)."""

import csv
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "tests" / "fixtures" / "tables" / "slurm_resume.yaml"
HOST = subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    status = subprocess.run(["bash", str(ROOT / "scripts" / "slurm-local.sh"), "status"], capture_output=True, text=True)
    assert status.returncode == 0, ("these tests need the one-node cluster: bash scripts/slurm-local.sh start\n"
                                    + status.stderr)
    return tmp_path_factory.mktemp("slurm")


def tables(root: Path, table: Path, out: str, *args: str, env: Dict[str, str] = None) -> subprocess.CompletedProcess:
    """``python -m fairseq_sparse.tables`` in ``root``, one thread a command (the same in a job: sbatch
    exports this environment)."""
    return subprocess.run([sys.executable, "-m", "fairseq_sparse.tables", str(table), "--profile", "smoke",
                           "--out", out, "--models-root", "models", "--data-root", "data", *args],
                          cwd=root, capture_output=True, text=True, timeout=1200,
                          env=env or {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})


def queued() -> List[str]:
    """The cluster's jobs that are queued or running."""
    return subprocess.run(["squeue", "--noheader", "--format=%i"], capture_output=True, text=True,
                          check=True).stdout.split()


def job_details(job: str) -> str:
    return subprocess.run(["scontrol", "show", "job", "--oneliner", job], capture_output=True, text=True).stdout


def wait_for(predicate, timeout: float, what: str, every: float = 0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"waited {timeout:.0f} s for {what}")


def measured(csv_path: Path) -> Dict[Tuple[str, str], str]:
    with open(csv_path, encoding="utf-8") as f:
        return {(line["row"], line["column"]): line["ours"] for line in csv.DictReader(f)}


def model_dir(root: Path, row: str) -> Path:
    (found,) = (root / "models" / "smoke" / "bible_de_en").glob(f"{row}-*")
    return found


def job_of(run: Path) -> str:
    return (run / ".train.done.slurm-job").read_text().strip()


def jobs_listed(out: Path) -> List[List[str]]:
    return [line.split("\t") for line in (out / "slurm" / "jobs.tsv").read_text().splitlines()]


def test_stopped_trainings_resume_and_the_report_equals_the_local_runners(root):
    """A training cancelled mid-way and one preempted mid-way (Slurm's signal: submitit requeues it): the same
    command again resubmits only what did not finish, both go on from checkpoint_last.pt, no step runs twice
    to completion, and every measured cell equals the local runner's (the speed ratio is a clock's)."""
    local = tables(root, TABLE, "local", "--models-root", "models-local")
    assert local.returncode == 0, local.stdout[-3000:] + local.stderr[-3000:]
    status = tables(root, TABLE, "local", "--models-root", "models-local", "--status")  # the local runner's, too
    steps = [line for line in status.stdout.splitlines() if line.strip().startswith("[")]
    assert steps and all(line.split()[1] == "done" for line in steps) and "0 of" in status.stdout.splitlines()[-1]

    launch = tables(root, TABLE, "slurm", "--launcher", "slurm", "--detach", "--poll", "1")
    assert launch.returncode == 0, launch.stdout[-3000:] + launch.stderr[-3000:]
    assert "the report follows as job" in launch.stdout
    listed = jobs_listed(root / "slurm")  # every step to run a job
    assert len(listed) == launch.stdout.count("submitted as job") > 0
    submitted = {job for job, *_ in listed} | {launch.stdout.split("the report follows as job ")[1].split(".")[0]}

    cancelled, preempted = model_dir(root, "hard_cancelled"), model_dir(root, "hard_preempted")
    stopped = set()
    while len(stopped) < 2:  # each as soon as its checkpoint at update 6 exists, before its end at 12
        for run, how in ((cancelled, []), (preempted, ["--signal=USR2"])):
            if run not in stopped and (run / "checkpoints" / "checkpoint_last.pt").exists():
                subprocess.run(["scancel", *how, job_of(run)], check=True)
                stopped.add(run)
        assert not (cancelled / "train.done").exists() or cancelled in stopped
        time.sleep(0.02)
    for run in (cancelled, preempted):
        assert not (run / "train.done").exists(), f"{run.name} finished before it was stopped: the test needs slower training"
    # submitit requeued the preempted job (the same id); Slurm holds a requeued job back two minutes, which
    # the test lifts as an administrator would
    requeued = job_of(preempted)
    wait_for(lambda: "Restarts=1" in job_details(requeued) and "JobState=PENDING" in job_details(requeued), 60,
             "the preempted training to be requeued", every=0.5)
    subprocess.run(["scontrol", "update", f"JobId={requeued}", "StartTime=now"], check=True)
    wait_for(lambda: not (set(queued()) & submitted), 900, "the first launch's jobs to end", every=1)

    status = tables(root, TABLE, "slurm", "--status")
    assert status.returncode == 0 and "Traceback" not in status.stderr
    lines = status.stdout.splitlines()
    train_cancelled = next(line for line in lines if "train hard_cancelled" in line)
    assert train_cancelled.split()[1] == "stopped" and f"log: {cancelled / 'train.log'}" in train_cancelled
    assert next(line for line in lines if "decode hard_cancelled" in line).split()[1] == "cancelled"
    assert next(line for line in lines if "train hard_preempted" in line).split()[1] == "done"
    assert "steps left" in lines[-1] and not lines[-1].strip().startswith("0 of")

    again = tables(root, TABLE, "slurm", "--launcher", "slurm", "--poll", "1")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    resubmitted = [line for line in again.stdout.splitlines() if "submitted as job" in line]
    assert resubmitted and all("hard_cancelled" in line for line in resubmitted), resubmitted

    for run in (cancelled, preempted):  # one run to completion, its second leg from the checkpoint at update 6
        log = (run / "train.log").read_text()
        assert log.count("done training") == 1, run.name
        assert "(epoch 1 @ 6 updates" in log, run.name
    # the preempted training stayed one job (requeued), the cancelled one took a second
    listed = jobs_listed(root / "slurm")
    trainings = [label for _, kind, label, _ in listed if kind == "train"]
    assert trainings.count("train hard_preempted on bible_de_en (seed 1)") == 1
    assert trainings.count("train hard_cancelled on bible_de_en (seed 1)") == 2
    labels = [label for _, _, label, _ in listed]
    assert all(labels.count(label) == 1 for label in labels if "hard_cancelled" not in label)

    ours, theirs = measured(root / "slurm" / "slurm_resume.csv"), measured(root / "local" / "slurm_resume.csv")
    assert ours.keys() == theirs.keys()
    for cell, value in theirs.items():
        assert value not in ("", "failed") and ours[cell] not in ("", "failed"), cell
        if cell[1] != "speed":  # a speed ratio is two decodes' clocks: equal only by chance
            assert ours[cell] == value, (cell, ours[cell], value)
    report = (root / "slurm" / "slurm_resume.md").read_text()
    assert f"Timed on a Slurm node of their own (`--exclusive`): " in report and f": {HOST}" in report


def test_a_failed_step_cancels_its_dependents_and_the_fixed_table_finishes(root, tmp_path):
    broken = tmp_path / "slurm_failure.yaml"
    text = TABLE.read_text().replace("name: slurm_resume", "name: slurm_failure")
    text = text.replace('{id: softmax, label: "softmax", args: "--max-update 800"}',
                        '{id: softmax, label: "softmax", args: "--max-update 800 --dropout 0.2 --no-such-option"}')
    broken.write_text(text)
    failed = tables(root, broken, "failure", "--launcher", "slurm", "--poll", "1", "--rows", "softmax", "topk")
    assert failed.returncode != 0
    assert "Traceback" not in failed.stderr
    run = next(r for r in (root / "models" / "smoke" / "bible_de_en").glob("softmax-*") if not (r / "train.done").exists())
    assert f"tables: error: train softmax on bible_de_en (seed 1): failed; log: {run / 'train.log'}" in failed.stderr
    assert "--no-such-option" in (run / "train.log").read_text()
    status = tables(root, broken, "failure", "--status")
    states = {line.split(None, 2)[2].split(" (job ")[0]: line.split()[1] for line in status.stdout.splitlines()
              if line.strip().startswith("[")}
    assert states["train softmax on bible_de_en (seed 1)"] == "failed"
    for step in ("average softmax on bible_de_en (seed 1)", "decode softmax on bible_de_en test (seed 1)",
                 "decode topk on bible_de_en test (seed 1)", "zero attention weights of topk on bible_de_en (seed 1)"):
        assert states[step] == "cancelled", (step, status.stdout)
    assert not [j for j in queued()], "nothing is left pending"

    broken.write_text(text.replace(" --no-such-option", ""))
    fixed = tables(root, broken, "failure", "--launcher", "slurm", "--poll", "1", "--rows", "softmax", "topk")
    assert fixed.returncode == 0, fixed.stdout[-3000:] + fixed.stderr[-3000:]
    cells = measured(root / "failure" / "slurm_failure.csv")
    assert all(cells[(row, col)] not in ("", "failed") for row in ("softmax", "topk") for col in ("bleu", "zero"))


@pytest.mark.parametrize("case", ["no sbatch", "unknown partition", "refused request", "option without the launcher",
                                  "jobs with the launcher"])
def test_bad_cluster_input_gets_one_line_and_submits_nothing(root, case):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = ["--launcher", "slurm", "--poll", "1"]
    if case == "no sbatch":
        env["PATH"] = str(Path(sys.executable).parent)
        assert shutil.which("sbatch", path=env["PATH"]) is None
        expected = "sbatch, squeue, scontrol, scancel, sinfo not on the PATH"
    elif case == "unknown partition":
        args += ["--partition", "nosuch"]
        expected = "--partition nosuch (prep steps of slurm_resume): no such partition on this cluster (partitions: local, timed)"
    elif case == "refused request":
        args += ["--gpus", "train=1"]  # the node has no GPU
        expected = "Slurm refuses the request for train steps of slurm_resume"
    elif case == "option without the launcher":
        args = ["--partition", "local"]
        expected = "--partition is an option of the Slurm launcher: add --launcher slurm"
    else:
        args += ["--jobs", "2"]
        expected = "--jobs is the local runner's"
    before = queued()
    out = f"bad-{case.replace(' ', '-')}"
    result = tables(root, TABLE, out, *args, env=env)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("tables: error: ") and expected in errors[0], result.stderr
    assert queued() == before
    assert not (root / out / "slurm").exists()
