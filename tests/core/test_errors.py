"""Errors in what the user asked for: found anywhere in an exception's chain, shown as one line by
fairseq's commands (the commands themselves are run in tests/test_end_to_end.py)."""

import subprocess
import sys

from fairseq_sparse.core.errors import UsageError, usage_error_in_chain


def test_a_usage_error_is_found_under_the_exception_fairseq_raises_instead():
    try:
        try:
            raise UsageError("--attn-k must be a positive integer, got 0")
        except Exception:
            raise Exception("Cannot load model parameters from checkpoint x.pt")  # fairseq's trainer does this
    except Exception as outer:
        assert str(usage_error_in_chain(outer)) == "--attn-k must be a positive integer, got 0"
    assert usage_error_in_chain(RuntimeError("a bug")) is None


HOOKED = """
import sys; sys.argv[0] = {program!r}
import fairseq_sparse
from fairseq_sparse.core.errors import UsageError
try:
    raise UsageError("--encoder-attn-fn: unknown attention function 'nope'")
except UsageError as err:
    raise Exception("wrapped") from err
"""


def run(program: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", HOOKED.format(program=program)], capture_output=True, text=True,
                          timeout=120, env={**__import__("os").environ, **env})


def test_fairseq_commands_print_one_line_and_fail():
    result = run("/usr/bin/fairseq-train")
    assert result.returncode == 1
    assert result.stderr.strip() == "fairseq-train: error: --encoder-attn-fn: unknown attention function 'nope'"


def test_the_traceback_on_request_and_in_other_programs():
    for result in (run("/usr/bin/fairseq-train", FAIRSEQ_SPARSE_TRACEBACK="1"), run("my_script.py")):
        assert result.returncode == 1 and "Traceback" in result.stderr and "Exception: wrapped" in result.stderr


def test_the_packages_own_commands_print_one_line(tmp_path):
    not_generate_output = tmp_path / "gen.out"
    not_generate_output.write_text("H-0\t-0.1\ta b\n")
    broken_table = tmp_path / "t.yaml"
    broken_table.write_text("name: t\n  title: [\n")
    for argv, line in (
        (["fairseq_sparse.evaluate", str(not_generate_output), str(not_generate_output)],
         f"evaluate: error: no D- lines in {not_generate_output}: is it fairseq-generate output?"),
        (["fairseq_sparse.tables", str(broken_table), "--dry-run"],
         f"tables: error: {broken_table}: not valid YAML at line 2, column 8: mapping values are not allowed here"),
    ):
        result = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=120)
        assert result.returncode == 1 and result.stderr.strip() == line, result.stderr[-2000:]
