"""fairseq_sparse.bench.decode_speed: decodes timed in turn, medians and ratios (a stand-in for
fairseq-generate reports fixed speeds, so every number checked here is known)."""

import csv
import stat
import sys
from pathlib import Path

import pytest

from fairseq_sparse.bench import decode_speed
from fairseq_sparse.bench.decode_speed import decode_speeds

# prints fairseq-generate's summary line: tokens/s given by --speed, and appends its --path to the order file
FAKE_GENERATE = """#!{python}
import sys
args = sys.argv[1:]
value = lambda flag: args[args.index(flag) + 1]
if "--fail" in args:
    print("Traceback: the model would not load")
    sys.exit(3)
with open({order!r}, "a") as f:
    f.write(value("--path") + "\\n")
speed = float(value("--speed").split(",")[int(open({order!r}).read().count(value("--path"))) - 1])
tokens = 1000
print(f"INFO:fairseq_cli.generate:Translated 10 sentences ({{tokens:,}} tokens) in {{tokens / speed:.1f}}s "
      f"(1.00 sentences/s, {{speed:.2f}} tokens/s)")
"""


@pytest.fixture
def fake_generate(tmp_path):
    script = tmp_path / "fairseq-generate"
    order = tmp_path / "order.txt"
    script.write_text(FAKE_GENERATE.format(python=sys.executable, order=str(order)))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script, order


def run(script: Path, out: Path, *args: str) -> int:
    """decode_speed's main, in-process (the fairseq-generate runs are processes of their own)."""
    return decode_speed.main(["--generate", str(script), "--out", str(out), *args])


def test_commands_run_in_turn_with_a_rotating_order_and_medians_give_the_ratio(fake_generate, tmp_path, capsys):
    script, order = fake_generate
    out = tmp_path / "speed.csv"
    # per round: softmax 1000, 1000, 400 (a slow round) tokens/s; topk 500, 800, 200
    assert run(script, out, "--rounds", "3", "--run", "softmax", "data --path soft.pt --speed 1000,1000,400",
               "--run", "topk", "data --path topk.pt --speed 500,800,200") == 0
    assert order.read_text().split() == ["soft.pt", "topk.pt", "topk.pt", "soft.pt", "soft.pt", "topk.pt"]
    with open(out) as f:
        lines = list(csv.DictReader(f))
    assert [(x["label"], x["round"], x["order"]) for x in lines] == [
        ("softmax", "1", "1"), ("topk", "1", "2"), ("topk", "2", "1"), ("softmax", "2", "2"),
        ("softmax", "3", "1"), ("topk", "3", "2")]
    assert decode_speeds(out, "tokens_per_second") == {"softmax": 1000.0, "topk": 500.0}  # medians over the rounds
    assert decode_speeds(out, "seconds") == {"softmax": 1.0, "topk": 2.0}
    assert "topk: median 500.0 tokens/s, 2.00s; vs softmax: 0.500x tokens/s, 0.500x time" in capsys.readouterr().out
    assert not out.with_name("speed.csv.partial").exists()


def test_a_failed_decode_is_one_clear_error_and_leaves_no_result(fake_generate, tmp_path):
    script, _ = fake_generate
    out = tmp_path / "speed.csv"
    with pytest.raises(SystemExit, match=r"fairseq-generate failed \(exit status 3\)(.|\n)*the model would not load"):
        run(script, out, "--rounds", "1", "--run", "softmax", "data --path soft.pt --speed 1000",
            "--run", "broken", "data --path b.pt --fail")
    assert not out.exists()  # the table runner sees the step as not done and runs it again


@pytest.mark.parametrize("args, message", [
    (["--run", "a", "x --speed 1"], "two or more commands with distinct labels"),
    (["--run", "a", "x --speed 1", "--run", "a", "y --speed 1"], "two or more commands with distinct labels"),
    (["--rounds", "0", "--run", "a", "x --speed 1", "--run", "b", "y --speed 1"], "--rounds must be at least 1, got 0"),
])
def test_bad_arguments_are_one_clear_error(fake_generate, tmp_path, args, message):
    with pytest.raises(SystemExit, match=message):
        run(fake_generate[0], tmp_path / "speed.csv", *args)
