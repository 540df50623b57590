"""The table runner's smoke runs, end to end: shipped tables trained, decoded, measured and reported
in their smoke profile (minutes on 2 cores; a file of its own so that pytest-xdist runs it beside
test_tables.py's quick checks). The tables share one data and model folder (``smoke_root``)."""

import csv
import re
import shlex
import sys
from pathlib import Path
from typing import Dict

import pytest
import torch

from fairseq_sparse import tables
from fairseq_sparse.tables import load_table

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def smoke_root(tmp_path_factory):
    return tmp_path_factory.mktemp("tables")


def run_table(name: str, root: Path, capsys) -> str:
    out = root / name
    status = tables.main([str(ROOT / "configs" / "tables" / f"{name}.yaml"), "--profile", "smoke", "--out", str(out),
                          "--models-root", str(root / "models"), "--data-root", str(root / "data")])
    printed = capsys.readouterr().out
    assert status == 0, printed[-3000:]
    return printed


def cells(md: str) -> Dict[str, Dict[str, str]]:
    """A Markdown table as {row label: {column header: cell}}."""
    lines = [line for line in md.splitlines() if line.startswith("| ") and "---" not in line]
    header = [c.strip() for c in lines[0].split("|")[2:-1]]
    return {line.split("|")[1].strip(): dict(zip(header, (c.strip() for c in line.split("|")[2:-1]))) for line in lines[1:]}


def test_demo_table_in_smoke_profile(smoke_root, capsys):
    """One softmax model, two fine-tunes of it (hard retrieval, L0Drop) and three decodings of it with
    other functions: BLEU, sparsities, speed ratio, heatmap, all real numbers."""
    printed = run_table("demo", smoke_root, capsys)
    out = smoke_root / "demo"
    md = (out / "demo.md").read_text()
    assert "nrefs:1|case:mixed|eff:no|tok:13a" in md
    rows = cells(md)
    assert not any(h.endswith("(paper)") for h in rows["softmax"])  # no paper quotes the demo: no empty columns
    topk, hard = "top-k (k=8), decoding the softmax model", "hard retrieval (dec self + cross), decoding the softmax model"
    bleu, zero, pruned, speed = "BLEU", "attention weights = 0 (%)", "encoder outputs pruned (%)", "decode tokens/s vs softmax"
    for label in ("softmax", topk, hard, "hard retrieval (dec self + cross), softmax model fine-tuned 200 updates",
                  "1.5-entmax, decoding the softmax model"):
        assert all(rows[label][c] not in ("—", "failed") for c in (bleu, zero, speed)), (label, rows[label])
    assert float(rows["softmax"][zero]) == 0.0  # softmax: no weight is exactly 0
    # the reused softmax model is analysed with the row's --model-overrides: top-k's zeros show
    assert float(rows[topk][zero]) > 0.0 and float(rows[hard][zero]) > 0.0
    assert float(rows["softmax"][speed]) == 1.0  # speed ratio of the baseline to itself
    # every other row's ratio is read from one run that decoded it and softmax in turn
    for timed in (out / "speed" / "bible_de_en").glob("*/seed1/test.*.csv"):
        with open(timed) as f:
            assert [line["label"] for line in csv.DictReader(f)] == [timed.parts[-3], "softmax"]
    assert len(list((out / "speed" / "bible_de_en").glob("*/seed1/test.*.csv"))) == 5
    assert float(rows["softmax"][pruned]) == 0.0  # no gates, nothing pruned
    assert rows["L0Drop (softmax fine-tuned with gates)"][pruned] not in ("—", "failed")
    assert list((out / "heatmap" / "demo").glob("*.png"))
    assert (out / "demo.csv").read_text().count("\n") == 1 + 6 * 4
    # commands.sh names paths under the directory the table ran in relative to it (no machine's directories)
    commands = (out / "commands.sh").read_text()
    assert str(Path.cwd().resolve()) + "/" not in commands and "fairseq-train " in commands
    tools = Path(sys.executable).parent.resolve()  # where the runner finds fairseq-train (a venv's bin/)
    if tools.is_relative_to(Path.cwd().resolve()):
        assert f"\n{tools.relative_to(Path.cwd().resolve())}/fairseq-train " in commands
    # a second run finds everything done and only re-reads the results
    again = run_table("demo", smoke_root, capsys)
    assert " 0 to run" in again and "[1/" not in again
    assert "train softmax" in printed
    assert "FAILED" not in printed and "encoder outputs L0Drop prunes in softmax" not in printed  # no gates: nothing to run


def test_a_recorded_table_keeps_its_heatmaps_and_needs_no_model_again(smoke_root, tmp_path, capsys):
    """--record copies the whole report (heatmaps and commands too) and records every cell; from the
    record alone no step of the table is needed, the heatmap (which reads every row's model) included."""
    from fairseq_sparse.experiments.record import Record, steps_to_run

    results = tmp_path / "results"
    status = tables.main([str(ROOT / "configs" / "tables" / "demo.yaml"), "--profile", "smoke", "--out", str(smoke_root / "demo"),
                          "--models-root", str(smoke_root / "models"), "--data-root", str(smoke_root / "data"),
                          "--record", str(results)])
    assert status == 0 and "[1/" not in capsys.readouterr().out
    assert (results / "demo.seeds.csv").read_text().count("\n") == 1 + 6 * 4
    assert list((results / "heatmap" / "demo").glob("*.png")) and (results / "demo.commands.sh").is_file()
    md = (results / "demo.md").read_text()
    assert "Attention heatmaps (seed 1's models): ![" in md and md == (smoke_root / "demo" / "demo.md").read_text()
    plan = tables.Plan(load_table(ROOT / "configs" / "tables" / "demo.yaml", "smoke"), tmp_path / "fresh",
                       tmp_path / "data", None, models_root=tmp_path / "models")
    assert steps_to_run(plan, plan.steps(), Record(results, "demo")) == []
    (results / "demo.seeds.csv").unlink()  # without the cells: every step again, the heatmap still kept
    assert {s.kind for s in steps_to_run(plan, plan.steps(), Record(results, "demo"))} == {
        "prep", "train", "average", "generate", "speed", "attention", "pruned"}


def test_a_fine_tune_cut_short_resumes_from_its_own_checkpoint(smoke_root):
    """The demo's L0Drop fine-tune started from the softmax model; launched again with a later
    --max-update, it goes on from its checkpoint_last.pt instead of fine-tuning from update 0."""
    import subprocess

    commands = (smoke_root / "demo" / "commands.sh").read_text().splitlines()
    line = commands[commands.index(next(c for c in commands if c.startswith("# train l0drop"))) + 1]
    argv, log = shlex.split(line.split(" > ")[0]), Path(shlex.split(line.split(" > ")[1])[0])
    base = argv[argv.index("--finetune-from-model") + 1]
    assert f"loading pretrained model from {base}" in log.read_text()
    argv[argv.index("--max-update") + 1] = "14"
    again = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "loading pretrained model" not in again.stdout
    assert "checkpoint_last.pt (epoch 1 @ 12 updates)" in again.stdout
    assert int(re.findall(r"\| num_updates (\d+) \|", again.stdout)[-1]) > 12


def test_averaged_checkpoint_is_the_mean_of_the_last_two(smoke_root):
    from fairseq import checkpoint_utils

    run = next((smoke_root / "models" / "smoke" / "bible_de_en").glob("softmax-*"))
    parts = [checkpoint_utils.load_checkpoint_to_cpu(str(p))["model"] for p in sorted((run / "checkpoints").glob("checkpoint_1_*.pt"))]
    averaged = checkpoint_utils.load_checkpoint_to_cpu(str(run / "checkpoint_avg.pt"))["model"]
    assert len(parts) == 2
    name = "encoder.layers.0.fc1.weight"
    assert not torch.equal(parts[0][name], parts[1][name])
    torch.testing.assert_close(averaged[name], (parts[0][name] + parts[1][name]) / 2)


STUDY_LIKE = """name: seeds
title: Two seeds
paper: study
source: test
datasets: [{id: bible_de_en_full, setting: cpu_converge}]
columns:
  - {id: bleu, label: BLEU, dataset: bible_de_en_full, measure: bleu}
  - {id: delta, label: delta, dataset: bible_de_en_full, measure: bleu_delta, baseline: softmax}
  - {id: zero, label: zero, dataset: bible_de_en_full, measure: attn_sparsity}
  - {id: nulls, label: nulls, dataset: bible_de_en_full, measure: null_rate}
  - {id: epochs, label: epochs, dataset: bible_de_en_full, measure: epochs}
  - {id: loss, label: loss, dataset: bible_de_en_full, measure: best_valid_loss}
  - {id: minutes, label: minutes, dataset: bible_de_en_full, measure: train_minutes}
rows:
  - {id: softmax, label: softmax, args: "--encoder-attn-fn softmax"}
  - {id: topk, label: topk, args: "--encoder-attn-fn topk --decoder-attn-fn topk --cross-attn-fn topk --attn-k 2",
     paper: {delta: +0.3}}
"""


def test_several_tables_in_one_command_are_one_queue_and_each_writes_its_report(smoke_root, tmp_path, capsys, monkeypatch):
    """Two tables sharing a model (the same row, the same training command): trained once in one queue,
    each table's report and record written, --rows picking each table's rows; --out (one table's
    folder) with two tables is an error. Its seed-1 models are the two-seed test's (below)."""
    monkeypatch.chdir(tmp_path)  # the reports go to runs/tables/NAME/smoke here
    first, second = tmp_path / "seeds.yaml", tmp_path / "renamed.yaml"
    first.write_text(STUDY_LIKE)
    second.write_text(STUDY_LIKE.replace("name: seeds", "name: renamed").replace("id: topk", "id: sparse"))
    common = ["--profile", "smoke", "--models-root", str(smoke_root / "models"), "--data-root", str(smoke_root / "data"),
              "--seeds", "1", "--record", str(tmp_path / "results")]
    assert tables.main([str(first), str(second), *common, "--rows", "topk", "sparse", "softmax"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("train softmax on bible_de_en_full (seed 1)") == 1, "the shared model trained twice"
    assert "train topk on" in printed and "train sparse on" in printed  # another id: another model
    reports = [cells((tmp_path / "results" / f"{name}.md").read_text()) for name in ("seeds", "renamed")]
    assert reports[0]["topk"]["BLEU"] == reports[1]["topk"]["BLEU"] not in ("—", "failed")  # labels kept, ids renamed
    assert (tmp_path / "runs" / "tables" / "renamed" / "smoke" / "commands.sh").is_file()
    assert tables.main([str(first), str(second), *common, "--out", str(tmp_path / "x")]) == 1
    assert "--out is one table's folder; 2 tables were given" in capsys.readouterr().err
    assert tables.main([str(first), str(second), *common, "--rows", "nope"]) == 1
    assert "(rows: seeds: softmax, topk; renamed: softmax, sparse)" in capsys.readouterr().err


def test_two_seeds_give_mean_and_std_and_report_only_counts_finished_seeds(smoke_root, tmp_path, capsys):
    config = tmp_path / "seeds.yaml"
    config.write_text(STUDY_LIKE)
    common = ["--profile", "smoke", "--models-root", str(smoke_root / "models"), "--data-root", str(smoke_root / "data")]
    assert tables.main([str(config), *common, "--out", str(tmp_path / "run"), "--seeds", "1", "2"]) == 0
    capsys.readouterr()
    md = (tmp_path / "run" / "seeds.md").read_text()
    bleu, delta, zero, null, epochs, loss, minutes = (cells(md)["topk"][c] for c in
                                                       ("BLEU", "delta", "zero", "nulls", "epochs", "loss", "minutes"))
    assert list(cells(md)["topk"]).count("delta (paper)") == 1 and "BLEU (paper)" not in cells(md)["topk"]
    assert " ± " in bleu and " ± " in delta and delta[0] in "+-"  # two seeds: mean ± std; a difference has its sign
    assert cells(md)["softmax"]["delta"].startswith("+0.00")  # the baseline against itself, seed by seed
    assert float(zero.split(" ")[0]) > 0 and float(null.split(" ")[0]) >= 0
    assert float(epochs.split(" ")[0]) >= 1 and float(minutes.split(" ")[0]) >= 0
    assert loss == "—"  # smoke trains with --disable-validation: not measured, not failed
    assert cells(md)["topk"]["delta (paper)"] == "+0.30"  # the paper's delta beside ours
    # a third seed that never ran: --report-only writes the table from what finished, and says so
    assert tables.main([str(config), *common, "--out", str(tmp_path / "run"), "--seeds", "1", "2", "3", "--report-only"]) == 0
    assert "[1/" not in capsys.readouterr().out  # nothing ran
    again = (tmp_path / "run" / "seeds.md").read_text()
    assert cells(again)["topk"]["BLEU"] == bleu and "planned: [1, 2, 3]" in again and "topk 1,2" in again
    with open(tmp_path / "run" / "seeds.csv", encoding="utf-8") as f:
        record = next(r for r in csv.DictReader(f) if r["row"] == "topk" and r["column"] == "bleu")
    assert record["seeds"] == "2" and float(record["std"]) >= 0
    assert abs(float(record["ours"]) - float(bleu.split(" ")[0])) < 0.006

    # --record: every finished cell is kept with the identity of its commands, and a report beside it
    results = tmp_path / "results"
    assert tables.main([str(config), *common, "--out", str(tmp_path / "run"), "--seeds", "1", "2", "--record", str(results)]) == 0
    assert "[1/" not in capsys.readouterr().out
    with open(results / "seeds.seeds.csv", encoding="utf-8") as f:
        recorded = list(csv.DictReader(f))
    assert len(recorded) == 2 * 7 * 2 and {r["seed"] for r in recorded} == {"1", "2"}
    assert (results / "seeds.md").read_text() == (tmp_path / "run" / "seeds.md").read_text()
    # a later sitting on a machine with no runs/ (no data, models, decodes): the same table, nothing run
    fresh = ["--profile", "smoke", "--out", str(tmp_path / "new" / "run"), "--record", str(results),
             "--models-root", str(tmp_path / "new" / "models"), "--data-root", str(tmp_path / "new" / "data")]
    assert tables.main([str(config), *fresh, "--seeds", "1", "2"]) == 0
    printed = capsys.readouterr().out
    assert ", 0 to run, " in printed and "[1/" not in printed and not (tmp_path / "new" / "models").exists()
    assert cells((tmp_path / "new" / "run" / "seeds.md").read_text()) == cells(md)
    # a sitting of seed 2 alone reports seed 1's recorded cells beside it, not seed 2 alone
    assert tables.main([str(config), *fresh, "--seeds", "2"]) == 0
    assert cells((tmp_path / "new" / "run" / "seeds.md").read_text()) == cells(md)
    # ... and its commands.sh (what the record keeps) still lists seed 1's commands beside seed 2's
    listed = (tmp_path / "new" / "run" / "commands.sh").read_text()
    assert "(seed 1)" in listed and "(seed 2)" in listed
    # ... and a third seed runs only its own commands (and prepares the data)
    from fairseq_sparse.experiments.record import Record, steps_to_run

    def to_run(path: Path, seeds, rows=None):
        plan = tables.Plan(load_table(path, "smoke"), tmp_path / "new" / "run", tmp_path / "new" / "data", None,
                           seeds=seeds, models_root=tmp_path / "new" / "models")
        return [s.label for s in steps_to_run(plan, plan.steps(), Record(results, "seeds"), rows)]

    third = to_run(config, [1, 2, 3])
    assert "train topk on bible_de_en_full (seed 3)" in third and "decode softmax on bible_de_en_full test (seed 3)" in third
    assert all("(seed 3)" in label or label.startswith("prepare ") for label in third)
    # --rows: one row's cells, with the baseline model its delta needs, and nothing of the baseline's own cells
    topk_only = to_run(config, [1, 2, 3], rows=["topk"])
    assert "train softmax on bible_de_en_full (seed 3)" in topk_only and "zero attention weights of topk on bible_de_en_full (seed 3)" in topk_only
    assert "zero attention weights of softmax on bible_de_en_full (seed 3)" not in topk_only and set(topk_only) < set(third)
    assert tables.main([str(config), *fresh, "--rows", "topk", "nope"]) == 1
    assert "--rows: no row 'nope' in seeds (rows: softmax, topk)" in capsys.readouterr().err
    # changed arguments are other commands: the record does not answer for them, and they run again
    changed = tmp_path / "changed.yaml"
    changed.write_text(STUDY_LIKE.replace("--attn-k 2", "--attn-k 3"))
    again = to_run(changed, [1])
    assert "train topk on bible_de_en_full (seed 1)" in again and "zero attention weights of topk on bible_de_en_full (seed 1)" in again
    assert "zero attention weights of softmax on bible_de_en_full (seed 1)" not in again  # softmax's cells are the same commands
    # a difference records each row's own BLEU: a sitting that lost one row's cells of a seed runs that
    # row's steps alone (none of the baseline's) and takes the baseline's BLEU from the record; --rows
    # leaves the cells of rows not chosen that are neither recorded nor run out of the report, not failed
    partial = tmp_path / "partial"
    partial.mkdir()
    with open(results / "seeds.seeds.csv", encoding="utf-8") as f:
        lines = list(csv.DictReader(f))
    with open(partial / "seeds.seeds.csv", "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(lines[0]))
        writer.writeheader()
        writer.writerows(line for line in lines if (line["row"], line["seed"]) != ("topk", "2")
                         and (line["row"], line["column"], line["seed"]) != ("softmax", "zero", "2"))
    assert tables.main([str(config), "--profile", "smoke", "--out", str(tmp_path / "partial-run"), "--record", str(partial),
                        "--models-root", str(smoke_root / "models"), "--data-root", str(smoke_root / "data"),
                        "--seeds", "1", "2", "--rows", "topk"]) == 0
    printed = capsys.readouterr().out
    assert "decode topk on bible_de_en_full test (seed 2)" in printed and " softmax on " not in printed
    text = (tmp_path / "partial-run" / "seeds.md").read_text()
    report = cells(text)
    assert "seeds finished per row: softmax 1; topk 1,2." in text  # softmax's seed 2 lacks a cell
    assert " ± " in report["softmax"]["nulls"] and " ± " not in report["softmax"]["zero"] and "failed" not in str(report)
    with open(partial / "seeds.seeds.csv", encoding="utf-8") as f:
        after = {(line["row"], line["column"], line["seed"]): line for line in csv.DictReader(f)}
    topk, softmax = after["topk", "delta", "2"], after["softmax", "delta", "2"]
    assert float(topk["own"]) == pytest.approx(float(after["topk", "bleu", "2"]["value"]), abs=1e-6)
    assert float(topk["value"]) == pytest.approx(float(topk["own"]) - float(softmax["own"]), abs=1e-5)
    assert len(after) == len(lines) - 1
