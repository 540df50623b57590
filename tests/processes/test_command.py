"""The one command runner of the table runner and the GPU report: log, error output, time limit, exit status."""

import sys

import pytest

from fairseq_sparse.processes.command import run_command

PRINTS = "import sys; print('out 1'); print('err 1', file=sys.stderr); print('out 2'); sys.exit({status})"


def test_output_goes_to_the_log_line_by_line_and_the_exit_status_is_reported(tmp_path):
    log, seen = tmp_path / "logs" / "a.log", []
    finished = run_command([sys.executable, "-c", PRINTS.format(status=3)], log, header="$ a\n", on_line=seen.append)
    assert finished.returncode == 3 and not finished.timed_out and finished.seconds > 0
    assert log.read_text().startswith("$ a\n") and "err 1\n" in log.read_text()  # error output in the same log
    assert [line for line in seen if line.startswith("out")] == ["out 1\n", "out 2\n"]


def test_error_output_goes_to_its_own_log_and_append_keeps_the_earlier_log(tmp_path):
    log, errors = tmp_path / "a.log", tmp_path / "a.stderr.log"
    log.write_text("earlier\n")
    finished = run_command([sys.executable, "-c", PRINTS.format(status=0)], log, stderr_log=errors, append=True)
    assert finished.returncode == 0
    assert log.read_text() == "earlier\nout 1\nout 2\n" and errors.read_text() == "err 1\n"


def test_a_command_past_its_time_limit_is_killed(tmp_path):
    code = "import time; print('started', flush=True); time.sleep(60)"
    finished = run_command([sys.executable, "-c", code], tmp_path / "a.log", timeout=1)
    assert finished.timed_out and finished.returncode is None and finished.seconds < 30
    assert (tmp_path / "a.log").read_text() == "started\n"


def test_environment_is_the_commands(tmp_path):
    code = "import os; print(os.environ.get('CHOSEN'))"
    run_command([sys.executable, "-c", code], tmp_path / "a.log", env={"CHOSEN": "yes"})
    assert (tmp_path / "a.log").read_text() == "yes\n"


def test_a_command_that_cannot_start_raises(tmp_path):
    with pytest.raises(OSError):
        run_command([str(tmp_path / "no-such-program")], tmp_path / "a.log")
