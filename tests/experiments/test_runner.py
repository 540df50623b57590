"""The table runner's --jobs: commands side by side, a timed decode alone, plan order kept."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import pytest

from fairseq_sparse import tables
from fairseq_sparse.experiments.outputs import trained_side_by_side
from fairseq_sparse.experiments.plan import Step
from fairseq_sparse.experiments.runner import execute, run_side_by_side, run_step

# a command that records when it ran, with how many threads and which GPUs: [start, end, OMP_NUM_THREADS, CUDA_VISIBLE_DEVICES]
RECORD = ("import json, os, sys, time; t = time.time(); time.sleep({sleep}); open(sys.argv[1], 'w').write(json.dumps("
          "[t, time.time(), os.environ.get('OMP_NUM_THREADS'), os.environ.get('CUDA_VISIBLE_DEVICES')]))")


def step(tmp: Path, name: str, kind: str, code: str, model=None, needs=(), runs_alone=False) -> Step:
    output = tmp / (f"{name}.done" if kind == "train" else f"{name}.out")
    return Step(kind, [sys.executable, "-c", code, str(tmp / f"{name}.json")], output, tmp / f"{name}.log", name,
                model=model, needs=needs, runs_alone=runs_alone)


def record(tmp: Path, name: str):
    return json.loads((tmp / f"{name}.json").read_text())


def model(name: str):
    return ("data", name, 1)


def test_two_trainings_share_the_cores_and_what_needs_a_model_waits_for_it(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")  # as on a 4-GPU machine: two GPUs a job
    recording = RECORD + "; open(sys.argv[1][:-5] + '.out', 'w').write('ok')"
    steps = [step(tmp_path, "a", "train", RECORD.format(sleep=1.0), model("a")),
             step(tmp_path, "b", "train", RECORD.format(sleep=1.0), model("b")),
             step(tmp_path, "avg_a", "average", recording.format(sleep=0), model("a"), needs=(model("a"),))]
    failed = set()
    run_side_by_side(steps, 2, failed)
    a, b, avg = (record(tmp_path, n) for n in ("a", "b", "avg_a"))
    assert failed == set()
    assert a[0] < b[1] and b[0] < a[1], "the two trainings did not overlap"
    assert avg[0] >= a[1], "the averaging started before its training ended"
    threads = str(max(1, len(os.sched_getaffinity(0)) // 2))
    assert a[2] == b[2] == avg[2] == threads
    assert {a[3], b[3]} == {"0,1", "2,3"} and avg[3] in ("0,1", "2,3")
    assert trained_side_by_side(tmp_path / "a.log") and not trained_side_by_side(tmp_path / "avg_a.log")


@pytest.mark.parametrize("timed", [True, False])
def test_a_timed_decode_runs_alone_while_the_others_are_stopped_and_an_untimed_one_beside_them(tmp_path, monkeypatch,
                                                                                                timed):
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # the user's settings: what a step that runs alone keeps
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    counter = tmp_path / "count"
    # a training that counts as it runs; the decode reads the count twice, half a second apart
    counting = (f"import os, time\nfor i in range(60):\n    open('{counter}.tmp', 'w').write(str(i))\n"
                f"    os.replace('{counter}.tmp', '{counter}')\n    time.sleep(0.05)\n")
    reading = (f"import json, os, sys, time; c = open('{counter}').read(); time.sleep(0.5); "
               f"c2 = open('{counter}').read(); out = json.dumps([c, c2, os.environ.get('OMP_NUM_THREADS'), "
               "os.environ.get('CUDA_VISIBLE_DEVICES')]); "
               "open(sys.argv[1], 'w').write(out); open(sys.argv[1][:-5] + '.out', 'w').write(out)")
    steps = [step(tmp_path, "counting", "train", counting, model("c")),
             step(tmp_path, "short", "train", RECORD.format(sleep=0.3), model("s")),
             step(tmp_path, "decode", "generate", reading, needs=(model("s"),), runs_alone=timed)]
    run_side_by_side(steps, 2, set())
    before, after, threads, gpus = record(tmp_path, "decode")
    assert int(counter.read_text()) == 59, "the stopped training was not resumed"
    if timed:
        assert before == after, "the training went on while the decode was being measured"
        assert (threads, gpus) == ("7", "0,1"), "the decode did not run with the user's threads and GPUs"
    else:
        assert int(after) > int(before), "the training was stopped for a decode whose time nothing reads"
        assert threads == str(max(1, len(os.sched_getaffinity(0)) // 2)) and gpus in ("0", "1"), "not a job's share"


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_failed_training_skips_what_needs_it_and_the_others_go_on(tmp_path, capsys, jobs):
    steps = [step(tmp_path, "bad", "train", "raise SystemExit(3)", model("bad")),
             step(tmp_path, "finetune", "train", RECORD.format(sleep=0), model("ft"), needs=(model("bad"),)),
             step(tmp_path, "avg_ft", "average", RECORD.format(sleep=0), model("ft"), needs=(model("ft"),)),
             step(tmp_path, "good", "train", RECORD.format(sleep=0.2), model("good"))]
    plan = SimpleNamespace(out=tmp_path / "table", table=SimpleNamespace(name="t", profile="smoke"))
    assert execute(plan, steps, jobs) == {model("bad"), model("ft")}
    assert (tmp_path / "good.done").is_file()
    assert not (tmp_path / "finetune.json").exists() and not (tmp_path / "avg_ft.json").exists()
    printed = capsys.readouterr().out
    assert "FAILED: bad failed (exit status 3)" in printed and "skip avg_ft: ft failed" in printed
    assert "good" in (plan.out / "commands.sh").read_text()
    assert trained_side_by_side(tmp_path / "good.log") == (jobs > 1)


def test_tables_run_as_one_queue_share_models_and_fill_the_cores_the_first_leaves_idle(tmp_path):
    """Two tables in one queue: the second's training starts beside the first's last one; a model both
    train (the same output) trains once and what reads it waits for it, whatever each table calls it;
    the same name in two tables is two models; each table hears of its own steps and failures only."""
    from fairseq_sparse.experiments.runner import TableRun, execute_tables

    appending = ("import sys, time; t = time.time(); time.sleep(0.4); "
                 "open(sys.argv[1][:-5] + '.runs', 'a').write(repr([t, time.time()]) + chr(10))")
    shared = step(tmp_path, "shared", "train", appending, model("s"))
    first = [step(tmp_path, "long", "train", RECORD.format(sleep=3), model("x")), shared]
    second = [step(tmp_path, "other_x", "train", RECORD.format(sleep=0.3), model("x")),  # another model named x
              step(tmp_path, "shared", "train", appending, model("also_s")),  # the first table's shared model
              step(tmp_path, "decode", "generate", RECORD.format(sleep=0) + "; open(sys.argv[1][:-5] + '.out', 'w')",
                   needs=(model("also_s"),)),
              step(tmp_path, "bad", "train", "raise SystemExit(2)", model("bad"))]
    heard = [[], []]
    plans = [SimpleNamespace(out=tmp_path / name, table=SimpleNamespace(name=name, profile="smoke")) for name in ("t1", "t2")]
    failed = execute_tables([TableRun(plans[0], first, finished=lambda: heard[0].append(1)),
                             TableRun(plans[1], second, finished=lambda: heard[1].append(1))], jobs=2)
    assert failed == [set(), {model("bad")}]
    runs = [eval(line) for line in (tmp_path / "shared.runs").read_text().splitlines()]
    assert len(runs) == 1, "the shared model trained twice"
    long, other, decode = (record(tmp_path, n) for n in ("long", "other_x", "decode"))
    assert other[0] < long[1], "the second table's training waited for the first table's last one"
    assert decode[0] >= runs[0][1], "the decode did not wait for the model it reads"
    assert len(heard[0]) == 2 and len(heard[1]) == 4  # the shared training is each table's
    assert (plans[0].out / "commands.sh").is_file() and "other_x" in (plans[1].out / "commands.sh").read_text()


def test_a_training_cut_short_goes_on_before_new_ones_start(tmp_path):
    from fairseq_sparse.experiments.runner import TableRun, execute_tables

    (tmp_path / "last.pt").write_text("epoch 3")  # what the second training left when its run was cut short
    steps = [step(tmp_path, "new", "train", RECORD.format(sleep=0), model("new")),
             step(tmp_path, "resumed", "train", RECORD.format(sleep=0), model("resumed"))]
    steps[1].resumes_from = tmp_path / "last.pt"
    plan = SimpleNamespace(out=tmp_path / "table", table=SimpleNamespace(name="t", profile="smoke"))
    execute_tables([TableRun(plan, steps)], jobs=1)
    assert record(tmp_path, "resumed")[1] <= record(tmp_path, "new")[0]


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_resumed_model_is_averaged_before_the_next_new_training_starts(tmp_path, jobs):
    """Its averaging (and decoding) would otherwise wait behind trainings of hours that come before it
    in the plan, and a sitting cut short would lose the result of a model it finished."""
    from fairseq_sparse.experiments.runner import TableRun, execute_tables

    (tmp_path / "last.pt").write_text("epoch 3")
    steps = [step(tmp_path, "new1", "train", RECORD.format(sleep=0.5), model("new1")),
             step(tmp_path, "new2", "train", RECORD.format(sleep=0), model("new2")),
             step(tmp_path, "resumed", "train", RECORD.format(sleep=0), model("resumed")),
             step(tmp_path, "avg_resumed", "average", RECORD.format(sleep=0) + "; open(sys.argv[1][:-5] + '.out', 'w')",
                  model("resumed"), needs=(model("resumed"),))]
    steps[2].resumes_from = tmp_path / "last.pt"
    plan = SimpleNamespace(out=tmp_path / "table", table=SimpleNamespace(name="t", profile="smoke"))
    execute_tables([TableRun(plan, steps)], jobs=jobs)
    averaged = record(tmp_path, "avg_resumed")
    assert record(tmp_path, "resumed")[1] <= averaged[0] <= record(tmp_path, "new2")[0]


def test_jobs_below_one_is_one_clear_error(capsys):
    with pytest.raises(SystemExit):
        tables.main(["demo", "--jobs", "0", "--dry-run"])
    assert "--jobs must be at least 1, got 0" in capsys.readouterr().err


def test_each_line_is_in_the_log_while_the_command_still_runs(tmp_path):
    # what a run killed mid-way (the study between sittings) keeps: every line it has printed
    log = tmp_path / "train.log"
    code = (f"import time; print('| valid | epoch 001 | loss 7.9', flush=True); time.sleep(1); "
            f"assert 'epoch 001' in open('{log}').read(), 'not yet in the log'")
    run_step(Step("train", [sys.executable, "-c", code], tmp_path / "train.done", log, "t", model=model("t")), 1, 1)
    assert (tmp_path / "train.done").is_file()


RUNNER = r"""
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Optional
from fairseq_sparse.experiments.outputs import trained_side_by_side
from fairseq_sparse.experiments.plan import Step
from fairseq_sparse.experiments.runner import execute

tmp, jobs = Path(sys.argv[1]), int(sys.argv[2])


def sleeper(name, seconds, after=None):
    wait = f"while not os.path.exists('{tmp}/{after}.pid'): time.sleep(0.05)\n" if after else ""
    code = f"import os, time\n{wait}open('{tmp}/{name}.pid', 'w').write(str(os.getpid()))\ntime.sleep({seconds})"
    return [sys.executable, "-c", code]


# the short training ends once the long one has started, then the decode stops the long one
steps = [Step("train", sleeper("long", 120), tmp / "long.done", tmp / "long.log", "long", model=("d", "long", 1)),
         Step("train", sleeper("short", 0, after="long"), tmp / "short.done", tmp / "short.log", "short", model=("d", "short", 1)),
         Step("generate", sleeper("decode", 120), tmp / "decode.out", tmp / "decode.log", "decode", needs=(("d", "short", 1),),
              runs_alone=True)]
execute(SimpleNamespace(out=tmp / "table", table=SimpleNamespace(name="t", profile="smoke")), steps, jobs)
"""


def alive(pid: int) -> bool:
    try:  # a zombie (ended, not yet reaped by whoever adopted it) counts as ended
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except FileNotFoundError:
        return False


def wait_for(condition, seconds: float) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("jobs, waits_for", [(1, ["long"]), (2, ["long", "decode"])])
def test_killing_the_runner_ends_every_command_it_started(tmp_path, jobs, waits_for):
    # with --jobs 2 it is killed while a timed decode runs alone and the long training is stopped (SIGSTOP)
    runner = subprocess.Popen([sys.executable, "-c", RUNNER, str(tmp_path), str(jobs)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: all((tmp_path / f"{n}.pid").exists() for n in waits_for), 120), "commands did not start"
        time.sleep(0.3)
        pids = [int((tmp_path / f"{n}.pid").read_text()) for n in waits_for]
        assert all(alive(pid) for pid in pids)
        runner.terminate()
        assert runner.wait(timeout=30) != 0
        assert wait_for(lambda: not any(alive(pid) for pid in pids), 10), "a command outlived the runner"
    finally:  # on a failure above: still leave nothing behind
        if runner.poll() is None:
            runner.terminate()
            runner.wait(timeout=30)


def test_more_jobs_than_gpus_share_them_and_no_gpu_means_none_set(monkeypatch):
    from fairseq_sparse.processes.machine import SharedMachine

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    assert [env["CUDA_VISIBLE_DEVICES"] for env in SharedMachine(3)._free] == ["4", "4", "5"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert all("CUDA_VISIBLE_DEVICES" not in env or env["CUDA_VISIBLE_DEVICES"] == "" for env in SharedMachine(2)._free)


# A pipeline of four steps whose commands write their outputs in two halves. A command stops
# between its halves (for the test to kill the runner there) while a file kill_at_NAME exists.
PIPELINE = """
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Optional
from fairseq_sparse.experiments.plan import Step
from fairseq_sparse.experiments.runner import execute

tmp = Path(sys.argv[1])


def command(name, first, second, reads=None):
    code = (
        "import sys, time; from pathlib import Path; tmp = Path(sys.argv[1]); "
        f"extra = (tmp / {reads!r}).read_text() if {reads!r} else ''; "
        f"out = tmp / {first[0]!r}; out.write_text({first[1]!r} + extra); "
        f"(tmp / '{name}.half').write_text('1'); "
        f"time.sleep(120 if (tmp / 'kill_at_{name}').exists() else 0); "
        f"(tmp / {second[0]!r}).write_text((tmp / {second[0]!r}).read_text() + {second[1]!r} "
        f"if (tmp / {second[0]!r}).exists() and {second[0]!r} == {first[0]!r} else {second[1]!r})"
    )
    return [sys.executable, "-c", code, str(tmp)]


steps = [
    # fairseq-preprocess writes the dictionary first, then the binarised data
    Step("prep", command("prep", ("dict.txt", "a 1\\n"), ("bin.txt", "0 1 0\\n")), tmp / ".prep0.done", tmp / "prep.log", "prep"),
    Step("train", command("train", ("checkpoint.pt", "epoch 1\\n"), ("checkpoint.pt", "epoch 2\\n"), reads="bin.txt"),
         tmp / "train.done", tmp / "train.log", "train", model=("d", "m", 1)),
    Step("average", command("average", ("avg.pt", ""), ("avg.pt", "averaged\\n"), reads="checkpoint.pt"),
         tmp / "avg.pt", tmp / "average.log", "average", needs=(("d", "m", 1),)),
    Step("generate", command("generate", ("gen.out", "H-0 x\\n"), ("gen.out", "Translated 1 sentences\\n"), reads="avg.pt"),
         tmp / "gen.out", tmp / "generate.log", "generate", needs=(("d", "m", 1),)),
]
execute(SimpleNamespace(out=tmp / "table", table=SimpleNamespace(name="t", profile="smoke")), steps, 1)
"""
OUTPUTS = ("dict.txt", "bin.txt", "checkpoint.pt", "avg.pt", "gen.out")


def run_pipeline(tmp: Path, kill_at: Optional[str] = None) -> None:
    """Run the pipeline to its end, or kill its runner when the command ``kill_at`` is between its halves."""
    if kill_at:
        (tmp / f"kill_at_{kill_at}").write_text("1")
        (tmp / f"{kill_at}.half").unlink(missing_ok=True)
    runner = subprocess.Popen([sys.executable, "-c", PIPELINE, str(tmp)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if kill_at:
            assert wait_for(lambda: (tmp / f"{kill_at}.half").exists(), 120), f"{kill_at} did not start"
            runner.terminate()
        assert (runner.wait(timeout=120) == 0) == (kill_at is None)
    finally:
        if runner.poll() is None:
            runner.kill()
        (tmp / f"kill_at_{kill_at}").unlink(missing_ok=True)


def test_a_runner_killed_at_any_step_resumes_to_a_clean_runs_result(tmp_path):
    """Killed while each step has written half its output (the dictionary before the binarised data,
    an epoch before the next, a decode without its summary), the re-runs end where a clean run does."""
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    clean.mkdir(), killed.mkdir()
    run_pipeline(clean)
    for name in ("prep", "train", "average", "generate"):
        run_pipeline(killed, kill_at=name)
        assert (killed / name.replace("prep", "dict.txt").replace("train", "checkpoint.pt")
                .replace("average", "avg.pt").replace("generate", "gen.out")).exists()
    run_pipeline(killed)
    for name in OUTPUTS:
        assert (killed / name).read_text() == (clean / name).read_text(), name
    assert (killed / "gen.out").read_text() == "H-0 x\nepoch 1\n0 1 0\nepoch 2\naveraged\nTranslated 1 sentences\n"


def test_two_runners_never_run_one_step_at_once(tmp_path):
    """The second runner waits on the step's lock, then finds it finished and does not run it again."""
    log = tmp_path / "runs.txt"
    code = f"import time; open({str(log)!r}, 'a').write('start\\n'); time.sleep(1.5); open({str(log)!r}, 'a').write('end\\n')"
    step_ = Step("generate", [sys.executable, "-c", code + f"; open({str(tmp_path / 'out')!r}, 'w').write('x')"],
                 tmp_path / "out", tmp_path / "step.log", "step")
    script = ("import sys; from pathlib import Path; from fairseq_sparse.experiments.plan import Step; "
              "from fairseq_sparse.experiments.runner import run_step; "
              f"run_step(Step('generate', {step_.argv!r}, Path({str(step_.output)!r}), Path(sys.argv[1]), 'step'), 1, 1)")
    runners = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path / f"log{i}")], stdout=subprocess.PIPE, text=True)
               for i in range(2)]
    outputs = [r.communicate(timeout=120)[0] for r in runners]
    assert all(r.returncode == 0 for r in runners)
    assert log.read_text() == "start\nend\n"
    assert any("finished meanwhile by another runner" in out for out in outputs)


def test_steps_run_before_completion_markers_count_as_finished_only_by_their_last_words(tmp_path):
    from fairseq_sparse.experiments.completion import done

    decode = Step("generate", ["x"], tmp_path / "gen.out", tmp_path / "gen.log", "decode")
    decode.output.write_text("H-0 x\n")
    assert not done(decode)  # cut short: no summary line
    decode.output.write_text("H-0 x\nTranslated 1 sentences (2 tokens)\n")
    assert done(decode)
    average = Step("average", ["x"], tmp_path / "avg.pt", tmp_path / "average.log", "average")
    average.output.write_text("half")
    assert not done(average)
    average.log.write_text("averaged 5 checkpoints (...) into avg.pt\n")
    assert done(average)
    train = Step("train", ["x"], tmp_path / "train.done", tmp_path / "train.log", "train")
    assert not done(train)
