"""The table runner: argument merging, configuration checks, every table's commands, records and reports
(its smoke runs, end to end: test_table_smoke_runs.py)."""

import csv
import shlex
import shutil
from pathlib import Path

import pytest
import yaml

from fairseq_sparse import tables
from fairseq_sparse.experiments.sources import GENERATE, SPEED
from fairseq_sparse.tables import ConfigError, load_table, merge_args

ROOT = Path(__file__).resolve().parents[2]
TABLES = sorted((ROOT / "configs" / "tables").glob("*.yaml"))


# ---------------------------------------------------------------- merging


def test_later_flags_replace_earlier_ones_and_quoted_values_stay_whole():
    merged = merge_args("--arch big --lr 0.1 --adam-betas '(0.9, 0.98)' --fp16", "--lr 0.5 --attn-k 4",
                        "--arch mini", drop=["--fp16"])
    assert merged == ["--arch", "mini", "--lr", "0.5", "--adam-betas", "(0.9, 0.98)", "--attn-k", "4"]


def test_model_overrides_survive_as_one_argument():
    merged = merge_args("--beam 4", "--model-overrides \"{'decoder_attn_fn': 'softmax'}\"")
    assert merged[-1] == "{'decoder_attn_fn': 'softmax'}"


# ---------------------------------------------------------------- configuration errors


@pytest.fixture
def configs(tmp_path):
    root = tmp_path / "configs"
    (root / "tables").mkdir(parents=True)
    (root / "papers").mkdir()
    shutil.copy(ROOT / "configs" / "datasets.yaml", root)
    shutil.copy(ROOT / "configs" / "smoke.yaml", root)
    (root / "papers" / "p.yaml").write_text("settings:\n  base:\n    train: '--arch transformer_sparse'\n")
    return root


def write_table(configs, body: str) -> Path:
    path = configs / "tables" / "t.yaml"
    path.write_text("name: t\ntitle: T\npaper: p\n" + body)
    return path


GOOD = """datasets: [{id: iwslt14_de_en, setting: base}]
columns: [{id: bleu, label: BLEU, dataset: iwslt14_de_en, measure: bleu}]
rows: [{id: a, label: A}, {id: b, label: B, reuse: a}]
"""


@pytest.mark.parametrize("change, message", [
    (("iwslt14_de_en, setting", "nowhere, setting"), "dataset 'nowhere' is not in"),
    (("setting: base", "setting: huge"), "setting 'huge' is not in papers/p.yaml"),
    (("measure: bleu", "measure: rouge"), "unknown measure 'rouge'"),
    (("reuse: a", "reuse: c"), "reuse 'c' must name an earlier row"),
    (("{id: a, label: A}", "{id: a, label: A, colour: red}"), "unknown key(s) ['colour']"),
    (("{id: a, label: A}", "{id: a, label: A, paper: {rouge: 1}}"), "paper numbers for unknown column(s) ['rouge']"),
    (("measure: bleu}", "measure: decode_speedup}"), "needs 'baseline:' naming a row"),
    (("measure: bleu}", "measure: bleu, metric: d_bleu}"), "d_bleu needs a document-level dataset"),
    (("iwslt14_de_en", "ted17_doc_en_de"), "ted17_doc_en_de is document-level: bleu needs metric: d_bleu, got sacrebleu"),
    (("setting: base}", "setting: base, length_groups: 0}"), "length_groups must be a positive integer, got 0"),
    (("setting: base}", "setting: base, gold_alignments: ibm}"), "gold_alignments must be rwth, got 'ibm'"),
    (("measure: bleu}", "measure: aer, split: align}"), "aer reads split align of a dataset with gold_alignments: rwth"),
    (("setting: base}", "setting: base, gold_alignments: rwth}"),
     None),  # the prep step is added; a BLEU column is still fine
    (("measure: bleu}", "measure: bleu, aer_over: best_head}"), "aer_attention (normal or shifted) and aer_over"),
    (("measure: bleu}", "measure: decode_speedup, baseline: a, rounds: 0}"), "rounds must be a whole number of at least 1, got 0"),
    (("measure: bleu}", "measure: bleu, first_seeds: 0}"), "first_seeds must be a whole number of at least 1, got 0"),
    (("columns: [{id: bleu, label: BLEU", "columns: [{id: null, label: BLEU"), "column None: id must be a non-empty string"),
    (("{id: a, label: A}", "{id: a, label: 12}"), "row 'a': label must be a non-empty string, got 12"),
    (("reuse: a}", "continue_from: a}"), "continue_from needs --continue-updates N in args"),
    (("reuse: a}", "continue_from: a, finetune_from: a, args: '--continue-updates 5'}"), "only one of them"),
])
def test_bad_configuration_is_one_clear_error(configs, change, message):
    load_table(write_table(configs, GOOD), "smoke", configs)  # the unchanged table is fine
    if message is None:
        load_table(write_table(configs, GOOD.replace(*change)), "smoke", configs)
        return
    with pytest.raises(ConfigError, match=None) as info:
        load_table(write_table(configs, GOOD.replace(*change)), "smoke", configs)
    assert message in str(info.value)


def test_an_aer_column_with_gold_alignments_loads_and_each_added_prep_step_has_its_own_marker(configs, tmp_path):
    """Tables that add different steps to one dataset's folder (length groups, gold alignments) share its
    own preparation but never take one another's added step for done."""
    ends = {}
    for name, extra in (("groups", "length_groups: 3"), ("gold", "gold_alignments: rwth")):
        body = GOOD.replace("setting: base}", f"setting: base, {extra}}}").replace(
            "measure: bleu}", "measure: aer, split: align, aer_attention: shifted, aer_over: best_head}" if name == "gold"
            else "measure: bleu}")
        path = configs / "tables" / f"{name}.yaml"
        path.write_text(f"name: {name}\ntitle: T\npaper: p\n" + body)
        table = load_table(path, "paper", configs)
        plan = tables.Plan(table, tmp_path / name, tmp_path / "data", None)
        steps = plan.prep_steps(table.datasets["iwslt14_de_en"])
        ends[name] = [step.output for step in steps]
        if name == "gold":
            assert "fairseq_sparse.data.gold_alignments" in steps[1].argv and "--download" in steps[1].argv
            column = table.columns[0]
            assert (column.aer_attention, column.aer_over) == ("shifted", "best_head")
    assert ends["groups"][0] == ends["gold"][0] and ends["groups"][1] != ends["gold"][1]


def test_aer_columns_average_layers_of_the_mean_attention_or_of_the_best_head(tmp_path):
    from fairseq_sparse.experiments.outputs import alignment_error_rate

    path = tmp_path / "aer.csv"
    rows = ["mode,layer,head,aer,links,sure"]
    values = {("normal", 0): (0.5, 0.3, 0.4), ("normal", 1): (0.2, 0.6, 0.5), ("shifted", 0): (0.1, 0.9, 0.7),
              ("shifted", 1): (0.4, 0.2, 0.3)}  # heads 0 and 1, then the layer's mean attention
    for (mode, layer), (h0, h1, mean) in values.items():
        rows += [f"{mode},{layer},0,{h0},1,1", f"{mode},{layer},1,{h1},1,1", f"{mode},{layer},layer,{mean},1,1"]
    path.write_text("\n".join(rows) + "\n")
    assert alignment_error_rate(path, "normal", "layer") == pytest.approx(45.0)
    assert alignment_error_rate(path, "normal", "best_head") == pytest.approx(25.0)
    assert alignment_error_rate(path, "shifted", "layer") == pytest.approx(50.0)
    assert alignment_error_rate(path, "shifted", "best_head") == pytest.approx(15.0)


def test_a_record_that_is_a_file_is_one_clear_error(tmp_path, capsys):
    not_a_folder = tmp_path / "results.csv"
    not_a_folder.write_text("")
    assert tables.main(["demo", "--record", str(not_a_folder), "--report-only", "--out", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err.strip() == f"tables: error: --record {not_a_folder}: a file, not a folder (the folder the finished cells are kept in)"


def test_unknown_profile_and_missing_file(configs):
    with pytest.raises(ConfigError, match="unknown profile"):
        load_table(write_table(configs, GOOD), "fast", configs)
    with pytest.raises(ConfigError, match="no such configuration file"):
        load_table(configs / "tables" / "missing.yaml", "smoke", configs)


def test_identical_models_of_two_tables_share_one_run_directory(configs, tmp_path):
    plans = []
    for name in ("t1", "t2"):
        path = configs / "tables" / f"{name}.yaml"
        path.write_text(f"name: {name}\ntitle: T\npaper: p\n" + GOOD)
        plans.append(tables.Plan(load_table(path, "smoke", configs), tmp_path / name, tmp_path / "data", None,
                                 models_root=tmp_path / "models"))
    a = [t.row("a") for t in (plans[0].table, plans[1].table)]
    ds = plans[0].table.datasets["iwslt14_de_en"]
    assert plans[0].run_dir(ds, a[0], 1) == plans[1].run_dir(ds, a[1], 1)
    assert plans[0].run_dir(ds, a[0], 1) != plans[0].run_dir(ds, a[0], 2)


def test_model_directories_do_not_depend_on_where_this_checkout_keeps_data_and_models(configs, tmp_path):
    """A model is named by its data and arguments, a fine-tune's base model included, so a checkout
    elsewhere (a later sitting of a study, its record of finished cells) finds it by the same name."""
    path = write_table(configs, GOOD.replace("{id: b, label: B, reuse: a}", "{id: c, label: C, finetune_from: a}"))
    table = load_table(path, "paper", configs)
    ds = table.datasets["iwslt14_de_en"]
    here, there = (tables.Plan(table, root / "out", root / "data", None, models_root=root / "models")
                   for root in (tmp_path / "here", tmp_path / "elsewhere"))
    for row in table.rows:
        assert here.run_dir(ds, row, 1).name == there.run_dir(ds, row, 1).name
        assert here.run_dir(ds, row, 1).parent != there.run_dir(ds, row, 1).parent
    assert "--finetune-from-model" in here.train_argv(ds, table.row("c"), 1)


def test_a_continuation_carries_on_its_base_runs_last_checkpoint(configs, tmp_path):
    """continue_from: the base's own checkpoint_last.pt (its optimizer state), through fairseq_sparse.train,
    after the base's training."""
    body = GOOD.replace("reuse: a}", "continue_from: a, args: '--continue-updates 5'}")
    plan = tables.Plan(load_table(write_table(configs, body), "paper", configs), tmp_path, tmp_path / "data", None)
    ds, row = plan.table.datasets["iwslt14_de_en"], plan.table.row("b")
    argv = plan.train_argv(ds, row, 1)
    assert argv[1:3] == ["-m", "fairseq_sparse.train"] and argv[argv.index("--continue-updates") + 1] == "5"
    assert argv[argv.index("--continue-from") + 1] == str(plan.run_dir(ds, plan.table.row("a"), 1) / "checkpoints" / "checkpoint_last.pt")
    [train] = plan.train_steps(ds, row, 1)
    assert train.needs == (plan.model_key(ds, plan.table.row("a"), 1),)


def test_a_bfloat16_row_trains_with_the_trainer_that_reads_bf16_as_bfloat16(configs, tmp_path):
    body = GOOD.replace("{id: b, label: B, reuse: a}", "{id: b, label: B, args: '--bf16'}")
    plan = tables.Plan(load_table(write_table(configs, body), "paper", configs), tmp_path, tmp_path / "data", None)
    ds = plan.table.datasets["iwslt14_de_en"]
    assert plan.train_argv(ds, plan.table.row("b"), 1)[1:3] == ["-m", "fairseq_sparse.train"]
    assert Path(plan.train_argv(ds, plan.table.row("a"), 1)[0]).name == "fairseq-train"


def test_a_speed_column_times_the_row_and_its_baseline_in_one_run(configs, tmp_path):
    """Speed ratios come from one command decoding both models in turn (not from two decodes run at
    different times); the baseline against itself needs no command."""
    path = write_table(configs, GOOD.replace("measure: bleu}", "measure: decode_token_speedup, baseline: a, rounds: 5}"))
    for profile, rounds in (("paper", "5"), ("smoke", "1")):
        plan = tables.Plan(load_table(path, profile, configs), tmp_path, tmp_path / "data", None)
        table = plan.table
        ds, col = table.datasets["iwslt14_de_en"], table.columns[0]
        assert plan.measure_steps(ds, table.row("a"), col, 1) == []
        [step] = plan.measure_steps(ds, table.row("b"), col, 1)
        assert step.kind == "speed" and step.argv[2] == "fairseq_sparse.bench.decode_speed"
        assert step.argv[step.argv.index("--rounds") + 1] == rounds
        runs = [step.argv[i + 1:i + 3] for i, word in enumerate(step.argv) if word == "--run"]
        assert [label for label, _ in runs] == ["b", "a"]
        # each run is exactly the row's own decoding command (fairseq-generate's arguments)
        assert runs[0][1] == shlex.join(GENERATE.step(plan, ds, table.row("b"), col, 1).argv[1:])
        assert step.needs == (plan.model_key(ds, table.row("b"), 1), plan.model_key(ds, table.row("a"), 1))
        # found again from a checkout whose data (and fairseq-generate, user dir) lie elsewhere: keyed by what it decodes
        elsewhere = tables.Plan(table, tmp_path, tmp_path / "other-data", None)
        assert SPEED.step(elsewhere, ds, table.row("b"), col, 1).output == step.output
        assert SPEED.step(elsewhere, ds, table.row("b"), col, 1).argv != step.argv


def test_only_a_command_whose_running_time_a_column_reads_runs_alone(configs, tmp_path):
    """--jobs stops the others for a timed decode only: a decode for BLEU, an analysis and the data
    preparation share the machine, and a decode read for BLEU and for its time is timed."""
    def plan_of(columns: str):
        body = GOOD.replace("columns: [{id: bleu, label: BLEU, dataset: iwslt14_de_en, measure: bleu}]", columns)
        return tables.Plan(load_table(write_table(configs, body), "paper", configs), tmp_path, tmp_path / "data", None)

    def alone(plan):
        return {step.kind for step in plan.steps() if step.runs_alone}

    bleu = "{id: bleu, label: BLEU, dataset: iwslt14_de_en, measure: bleu}"
    zeros = "{id: z, label: Z, dataset: iwslt14_de_en, measure: zero_weights}"
    clock = "{id: s, label: S, dataset: iwslt14_de_en, measure: decode_time}"
    speed = "{id: r, label: R, dataset: iwslt14_de_en, measure: decode_speedup, baseline: a}"
    assert alone(plan_of(f"columns: [{bleu}, {zeros}]")) == set()
    for columns in (f"[{bleu}, {clock}]", f"[{clock}, {bleu}]"):  # one decode, whichever column comes first
        plan = plan_of(f"columns: {columns}")
        decodes = [step for step in plan.steps() if step.kind == "generate"]
        assert len(decodes) == 2 and all(step.runs_alone for step in decodes)
    assert alone(plan_of(f"columns: [{bleu}, {speed}]")) == {"speed"}


def test_a_first_seeds_column_runs_and_waits_for_the_first_seeds_only(configs, tmp_path):
    """Decode speed on the first seed's models only: a later seed's row then needs no baseline model."""
    from fairseq_sparse.experiments.record import steps_to_run

    speed = "{id: speed, label: S, dataset: iwslt14_de_en, measure: decode_token_speedup, baseline: a, first_seeds: 1}"
    path = write_table(configs, GOOD.replace("measure: bleu}]", "measure: bleu}, " + speed + "]")
                       .replace("{id: b, label: B, reuse: a}", "{id: b, label: B}"))
    plan = tables.Plan(load_table(path, "paper", configs), tmp_path, tmp_path / "data", None, seeds=[1, 2])
    labels = [s.label for s in plan.steps()]
    assert "decode speed of b and a in turn on iwslt14_de_en test (seed 1)" in labels
    assert not any("decode speed" in label and "(seed 2)" in label for label in labels)
    assert "train b on iwslt14_de_en (seed 2)" in labels
    seed_2_of_b = [s.label for s in steps_to_run(plan, plan.steps(), None, rows=["b"]) if "(seed 2)" in s.label]
    assert seed_2_of_b == ["train b on iwslt14_de_en (seed 2)", "decode b on iwslt14_de_en test (seed 2)"]


def test_seeds_chooses_what_a_sitting_runs_not_what_the_table_reports(configs, tmp_path):
    """--seeds 2 on a table of seeds [1, 2] runs seed 2's commands only, while the report, the curves
    and the recorded cells keep seed 1 (a model whose log is gone lives on only in the record)."""
    from fairseq_sparse.experiments.record import steps_to_run

    (configs / "papers" / "p.yaml").write_text("settings:\n  base:\n    train: '--arch transformer_sparse'\n    seeds: [1, 2]\n")
    table = load_table(write_table(configs, GOOD), "paper", configs)
    ds = table.datasets["iwslt14_de_en"]
    second = tables.Plan(table, tmp_path, tmp_path / "data", None, seeds=[2])
    assert second.seeds(ds) == [1, 2] and second.seeds_to_run(ds) == [2]
    assert second.column_seeds(ds, table.columns[0]) == [1, 2]
    labels = [s.label for s in second.steps()]
    assert "train a on iwslt14_de_en (seed 2)" in labels and not any("(seed 1)" in label for label in labels)
    assert not any("(seed 1)" in s.label for s in steps_to_run(second, second.steps(), None, rows=["a"]))
    third = tables.Plan(table, tmp_path, tmp_path / "data", None, seeds=[3])
    assert third.seeds(ds) == [1, 2, 3] and third.seeds_to_run(ds) == [3]  # a seed beyond the table's is added
    every = tables.Plan(table, tmp_path, tmp_path / "data", None)
    assert every.seeds_to_run(ds) == every.seeds(ds) == [1, 2]
    # a seed an earlier sitting ran with --seeds, kept in the record: reported and listed in commands.sh,
    # but a sitting without --seeds runs the configured seeds only
    every.recorded_seeds = {"iwslt14_de_en": [3, 1]}
    assert every.seeds(ds) == [1, 2, 3] and every.seeds_to_run(ds) == [1, 2]
    assert not any("(seed 3)" in s.label for s in every.steps())
    assert "train a on iwslt14_de_en (seed 3)" in [s.label for s in every.steps(every_seed=True)]


def test_a_heatmap_draws_the_tables_first_seed_and_each_table_keeps_its_own(configs, tmp_path):
    """The heatmap reads the first seed's models whatever --seeds a sitting runs, only a sitting that
    runs that seed draws it, and two tables recorded in one folder each find their own heatmaps."""
    from fairseq_sparse.experiments.record import Record, publish, steps_to_run

    (configs / "papers" / "p.yaml").write_text("settings:\n  base:\n    train: '--arch transformer_sparse'\n    seeds: [1, 2]\n")
    body = GOOD + "heatmap: {dataset: iwslt14_de_en, rows: [a, b]}\n"
    first = load_table(write_table(configs, body), "paper", configs)
    (configs / "tables" / "u.yaml").write_text("name: u\ntitle: U\npaper: p\n" + body)
    second = load_table(configs / "tables" / "u.yaml", "paper", configs)
    seed_2 = tables.Plan(first, tmp_path / "t", tmp_path / "data", None, seeds=[2])
    assert not any(s.kind == "heatmap" for s in seed_2.steps() + steps_to_run(seed_2, seed_2.steps(), None))
    heatmaps = [s for s in seed_2.steps(every_seed=True) if s.kind == "heatmap"]
    assert len(heatmaps) == 1 and {seed for _, _, seed in heatmaps[0].needs} == {1}
    every = tables.Plan(first, tmp_path / "t", tmp_path / "data", None)
    assert [s.kind for s in steps_to_run(every, every.steps(), None)].count("heatmap") == 1

    drawn = tmp_path / "t" / "heatmap" / "t"
    drawn.mkdir(parents=True)
    (drawn / "heatmap.md").write_text("drawn\n")
    (drawn / "heatmap_cross_l0_hmean_s0.png").write_bytes(b"png")
    results = tmp_path / "results"
    publish(every, Record(results, "t"))
    assert (results / "heatmap" / "t" / "heatmap_cross_l0_hmean_s0.png").is_file()
    assert Record(results, "t").has_heatmap() and not Record(results, "u").has_heatmap()
    other = tables.Plan(second, tmp_path / "u", tmp_path / "data", None)
    assert [s.kind for s in steps_to_run(other, other.steps(), Record(results, "u"))].count("heatmap") == 1
    assert "heatmap" not in [s.kind for s in steps_to_run(every, every.steps(), Record(results, "t"))]


# ---------------------------------------------------------------- every table: commands parse


@pytest.mark.parametrize("profile", ["smoke", "paper"])
@pytest.mark.parametrize("config", TABLES, ids=[p.stem for p in TABLES])
def test_every_command_of_every_table_parses(config, profile, tmp_path, capsys):
    assert tables.main([str(config), "--profile", profile, "--dry-run", "--out", str(tmp_path),
                        "--raw-data", str(tmp_path / "raw")]) == 0
    assert "commands parse" in capsys.readouterr().out


def test_a_dry_run_parses_a_number_of_another_type_again(tmp_path, capsys):
    """Commands that differ only in a number's value are parsed once (a second each for fairseq's
    parsers); a number of another type is parsed again and caught."""
    config = tmp_path / "k.yaml"
    config.write_text("""name: k
title: k
paper: study
source: test
datasets: [{id: bible_de_en_full, setting: cpu_converge}]
columns: [{id: bleu, label: BLEU, dataset: bible_de_en_full, measure: bleu}]
rows:
  - {id: k2, label: k2, args: "--encoder-attn-fn topk --attn-k 2"}
  - {id: k3, label: k3, args: "--encoder-attn-fn topk --attn-k 3"}
  - {id: half, label: half, args: "--encoder-attn-fn topk --attn-k 2.5"}
""")
    argv = [str(config), "--profile", "smoke", "--dry-run", "--out", str(tmp_path / "out"), "--raw-data", str(tmp_path / "raw")]
    assert tables.main(argv) == 1
    printed = capsys.readouterr()
    assert "ok  train k3 on" in printed.out and "train half on bible_de_en_full (seed 1): the command does not parse" in printed.err
    config.write_text(config.read_text().replace("--attn-k 2.5", "--attn-k 4"))
    assert tables.main(argv) == 0


def test_every_table_runs_by_name(capsys):
    """python -m fairseq_sparse.tables NAME (and scripts/table.sh NAME) finds every shipped table."""
    for config in TABLES:
        assert tables.resolve_config(config.stem) == tables.CONFIGS / "tables" / config.name
    with pytest.raises(tables.ConfigError, match="no table named 'nope'; known: .*rela_table1"):
        tables.resolve_config("nope")
    assert tables.main(["nope"]) == 1
    assert "no table named 'nope'" in capsys.readouterr().err
    script = (ROOT / "scripts" / "table.sh").read_text()
    assert "python -m fairseq_sparse.tables" in script


def test_a_cell_with_one_failed_seed_beside_a_finished_one_reads_failed(configs, tmp_path):
    from fairseq_sparse.experiments.cells import collect, summarise
    from fairseq_sparse.experiments.record import Record, Recorded, cell_steps, commands_key

    assert summarise([]) is None and summarise([2.0]) == (2.0, (0.0, 1))
    assert summarise([1.0, 3.0]) == (2.0, (pytest.approx(2 ** 0.5), 2))
    plan = tables.Plan(load_table(write_table(configs, GOOD), "smoke", configs), tmp_path / "t", tmp_path / "data", None,
                       seeds=[1, 2], models_root=tmp_path / "models")
    ds, a, bleu = plan.table.datasets["iwslt14_de_en"], plan.table.row("a"), plan.table.columns[0]
    record = Record(tmp_path / "results", "t")
    record.put((ds.id, "a", "bleu", 1), Recorded(commands_key(plan, cell_steps(plan, ds, a, bleu, 1)), 30.0, "sig", False))
    second = cell_steps(plan, ds, a, bleu, 2)  # seed 2's training fails in this run
    results = collect(plan, failed={s.model for s in second if s.model}, record=record, ran={s.output for s in second})
    record.save()
    assert results.get(("a", "bleu")) is None and ("a", "bleu") not in results.spreads  # no mean ± std of seed 1 alone
    assert results.failures[("a", "bleu")].startswith("its model did not train: a") and results.failed_rows() == ["a"]
    assert results.signatures["bleu"] == "sig"
    with open(tmp_path / "results" / "t.seeds.csv", encoding="utf-8") as f:  # seed 1 kept, the failure not recorded
        assert [(r["row"], r["seed"], float(r["value"])) for r in csv.DictReader(f) if r["row"] == "a"] == [("a", "1", 30.0)]


def test_training_time_adds_the_legs_of_a_resumed_run(tmp_path):
    from fairseq_sparse.experiments.outputs import best_valid_loss, trained_epochs, training_seconds

    log = tmp_path / "train.log"
    log.write_text("epoch 001: loss=9, train_wall=3, wall=50\n| valid | epoch 001 | valid on 'valid' subset | loss 7.5 | x\n"
                   "end of epoch 1\n| train | epoch 001 | train_wall 40 | wall 100\n"
                   "epoch 002: loss=8, train_wall=2, wall=20\n| valid | epoch 002 | valid on 'valid' subset | loss 6.25 | x\n"
                   "end of epoch 2\n| train | epoch 002 | wall 90\n")
    assert training_seconds(log) == 190 and trained_epochs(log) == 2 and best_valid_loss(log) == 6.25


def test_report_names_the_models_whose_training_time_is_a_shared_machines(configs, tmp_path):
    from fairseq_sparse.experiments.outputs import SIDE_BY_SIDE_MARK, training_seconds
    from fairseq_sparse.experiments.report import side_by_side_trainings

    timed = GOOD.replace("measure: bleu}]", "measure: bleu}, {id: min, label: m, dataset: iwslt14_de_en, measure: train_minutes}]")
    plan = tables.Plan(load_table(write_table(configs, timed), "smoke", configs), tmp_path / "t", tmp_path / "data", None,
                       models_root=tmp_path / "models")
    ds, a = plan.table.datasets["iwslt14_de_en"], plan.table.row("a")
    assert side_by_side_trainings(plan) == []
    log = plan.run_dir(ds, a, 1) / "train.log"
    log.parent.mkdir(parents=True)
    log.write_text(f"epoch 001: wall=50\n{SIDE_BY_SIDE_MARK} (OMP_NUM_THREADS=1)\nepoch 002: wall=20\n")
    assert side_by_side_trainings(plan) == ["a seed 1"]  # row b reuses a's model: named once
    assert training_seconds(log) == 70  # the mark is not read as a time
    untimed = tables.Plan(load_table(write_table(configs, GOOD), "smoke", configs), tmp_path / "t", tmp_path / "data", None,
                          models_root=tmp_path / "models")
    assert side_by_side_trainings(untimed) == []  # no column reads the clock: nothing to say
    # a machine that no longer has the log reads it from the record of the training-time cell
    from fairseq_sparse.experiments.record import Record, Recorded

    log.unlink()
    record = Record(tmp_path / "results", "t")
    record.put(("iwslt14_de_en", "a", "min", 1), Recorded("key", 1.5, "", True))
    record.save()
    assert side_by_side_trainings(plan) == [] and side_by_side_trainings(plan, Record(tmp_path / "results", "t")) == ["a seed 1"]


def test_curves_plot_every_models_validation_loss_per_epoch(configs, tmp_path):
    from fairseq_sparse.experiments.report import write_curves

    plan = tables.Plan(load_table(write_table(configs, GOOD + "curves: true\n"), "smoke", configs), tmp_path / "t",
                       tmp_path / "data", None, seeds=[1, 2], models_root=tmp_path / "models")
    plan.out.mkdir()
    assert plan.table.curves and write_curves(plan) is None  # nothing has validated yet
    ds, a = plan.table.datasets["iwslt14_de_en"], plan.table.row("a")
    log = plan.run_dir(ds, a, 1) / "train.log"
    log.parent.mkdir(parents=True)
    # a resumed run logs epoch 2 twice (killed after validating, before saving): the last one counts
    # fairseq's lines: the epoch's training mean (not train_inner's running ones), then its validation;
    # epoch 3's training line is missing (a log cut between the two kinds of line keeps the other)
    log.write_text("".join(
        f"train_inner | epoch {e:03d}:     10 / 20 loss=9.9, nll_loss=9\n| train | epoch {e:03d} | loss {t} | nll_loss 1\n"
        * (e < 3) + f"epoch {e:03d} | valid on 'valid' subset | loss {v} | nll_loss 1\n"
        for e, t, v in [(1, 8.25, 7.5), (2, 7.0, 6.25), (2, 6.5, 6.0), (3, 0, 5.5)]))
    assert write_curves(plan) == plan.out / "t.curves.png" and (plan.out / "t.curves.png").stat().st_size > 0
    with open(plan.out / "t.curves.csv", encoding="utf-8") as f:  # row b reuses a's model: once
        assert [(r["row"], r["seed"], r["epoch"], r["valid_loss"], r["train_loss"]) for r in csv.DictReader(f)] == [
            ("a", "1", "1", "7.5", "8.25"), ("a", "1", "2", "6.0", "6.5"), ("a", "1", "3", "5.5", "")]
    # the curve of a model whose log this machine no longer has is kept from the record (by model name)
    from fairseq_sparse.experiments.record import Record

    results = tmp_path / "results"
    results.mkdir()
    # (a curve kept from before train_loss has none)
    kept = f"dataset,row,seed,model,epoch,valid_loss\niwslt14_de_en,a,2,{plan.run_dir(ds, a, 2).name},1,8.5\n" \
           "iwslt14_de_en,a,2,a-000000000000,2,1.0\n"  # another model's (other arguments): not this one's
    (results / "t.curves.csv").write_text(kept)
    write_curves(plan, Record(results, "t"))
    with open(plan.out / "t.curves.csv", encoding="utf-8") as f:
        assert [(r["seed"], r["epoch"], r["valid_loss"], r["train_loss"]) for r in csv.DictReader(f)] == [
            ("1", "1", "7.5", "8.25"), ("1", "2", "6.0", "6.5"), ("1", "3", "5.5", ""), ("2", "1", "8.5", "")]
    # a recorded curve of a seed this run does not plan (seed 2 of a few rows, run with --seeds 2) stays
    only_seed_1 = tables.Plan(plan.table, tmp_path / "t", tmp_path / "data", None, seeds=[1], models_root=tmp_path / "models")
    write_curves(only_seed_1, Record(results, "t"))
    with open(plan.out / "t.curves.csv", encoding="utf-8") as f:
        assert [(r["seed"], r["epoch"]) for r in csv.DictReader(f)] == [("1", "1"), ("1", "2"), ("1", "3"), ("2", "1")]
    # a model trained again after its log was lost (a continuation needs it) is another run of the same
    # command: the recorded run stays whole as run 1, beside the cells measured from it, and the log is
    # run 2, never the two spliced; the next sitting's log extends run 2 only
    name = plan.run_dir(ds, a, 1).name
    first = [(1, 7.25), (2, 6.5), (3, 5.75), (4, 5.25)]
    (results / "t.curves.csv").write_text("dataset,row,seed,model,epoch,valid_loss\n" + "".join(
        f"iwslt14_de_en,a,1,{name},{e},{v}\n" for e, v in first))

    def runs_written():
        with open(plan.out / "t.curves.csv", encoding="utf-8") as f:
            return [(r["run"], r["epoch"], r["valid_loss"]) for r in csv.DictReader(f) if r["seed"] == "1"]

    write_curves(plan, Record(results, "t"))
    rerun = [("2", "1", "7.5"), ("2", "2", "6.0"), ("2", "3", "5.5")]
    assert runs_written() == [("1", str(e), str(v)) for e, v in first] + rerun
    shutil.copy(plan.out / "t.curves.csv", results / "t.curves.csv")  # the record of the next sitting
    with open(log, "a", encoding="utf-8") as f:
        f.write("epoch 004 | valid on 'valid' subset | loss 5.0 | nll_loss 1\n")
    write_curves(plan, Record(results, "t"))
    assert runs_written() == [("1", str(e), str(v)) for e, v in first] + rerun + [("2", "4", "5.0")]
    # the recorded run resumed: its log agrees with the curve (its last epoch, validated again after a kill
    # before the checkpoint was saved, may differ) and extends it in place
    log.write_text("".join(f"epoch {e:03d} | valid on 'valid' subset | loss {v} | nll_loss 1\n"
                           for e, v in [(1, 7.25), (2, 6.5), (3, 5.75), (4, 5.0), (5, 4.75)]))
    (results / "t.curves.csv").write_text("dataset,row,seed,model,epoch,valid_loss\n" + "".join(
        f"iwslt14_de_en,a,1,{name},{e},{v}\n" for e, v in first))
    write_curves(plan, Record(results, "t"))
    assert runs_written() == [("1", "1", "7.25"), ("1", "2", "6.5"), ("1", "3", "5.75"), ("1", "4", "5.0"), ("1", "5", "4.75")]
    with pytest.raises(ConfigError, match="curves must be true or false"):
        load_table(write_table(configs, GOOD + "curves: sometimes\n"), "smoke", configs)


def test_an_epoch_column_added_after_the_models_were_lost_is_read_from_the_recorded_curves(configs, tmp_path):
    """A table that gains a valid_loss_at / valid_gap_at column on a machine without the models' logs
    reads it from the curves its record keeps (the same model by name), and trains nothing again; an
    epoch the curve lacks, or another model's curve, answers nothing."""
    from fairseq_sparse.experiments.cells import collect
    from fairseq_sparse.experiments.record import Record, fill_from_curves, steps_to_run

    text = GOOD.replace("{id: bleu, label: BLEU, dataset: iwslt14_de_en, measure: bleu}",
                        "{id: at2, label: L, dataset: iwslt14_de_en, measure: valid_loss_at, epoch: 2}, "
                        "{id: gap2, label: G, dataset: iwslt14_de_en, measure: valid_gap_at, baseline: a, epoch: 2}, "
                        "{id: gap3, label: G3, dataset: iwslt14_de_en, measure: valid_gap_at, baseline: a, epoch: 3}")
    text = text.replace("{id: b, label: B, reuse: a}", "{id: b, label: B, args: '--dropout 0.3'}")
    # the paper profile: the smoke profile trains without validation, so no epoch column applies there
    plan = tables.Plan(load_table(write_table(configs, text), "paper", configs), tmp_path / "t", tmp_path / "data", None,
                       seeds=[1], models_root=tmp_path / "models")
    ds = plan.table.datasets["iwslt14_de_en"]
    a, b = (plan.run_dir(ds, plan.table.row(r), 1).name for r in "ab")
    results = tmp_path / "results"
    results.mkdir()
    (results / "t.curves.csv").write_text(
        "dataset,row,seed,model,epoch,valid_loss\n"
        f"iwslt14_de_en,a,1,{a},1,7.5\niwslt14_de_en,a,1,{a},2,6.0\niwslt14_de_en,a,1,{a},3,5.5\n"
        f"iwslt14_de_en,b,1,{b},1,8.0\niwslt14_de_en,b,1,{b},2,6.5\n"  # b's curve ends at epoch 2
        "iwslt14_de_en,b,1,b-000000000000,3,1.0\n")  # another model's (other arguments)
    record = Record(results, "t")
    assert fill_from_curves(plan, record) == 5  # a: at2, gap2, gap3; b: at2, gap2
    trains = {s.label for s in steps_to_run(plan, plan.steps(), record) if s.kind == "train"}
    assert trains == {"train b on iwslt14_de_en (seed 1)"}  # only for b's epoch-3 cell
    report = collect(plan, finished_only=True, record=record)
    assert report.get(("a", "at2")) == 6.0 and report.get(("b", "at2")) == 6.5
    assert report.get(("b", "gap2")) == pytest.approx(0.5) and report.get(("a", "gap3")) == 0.0
    assert report.get(("b", "gap3")) is None
    record.save()
    assert fill_from_curves(plan, Record(results, "t")) == 0  # recorded once
    # a row that never validates after the epoch (here: --disable-validation) has no number there, and
    # nothing trains to find that out
    smoke = tables.Plan(load_table(write_table(configs, text), "smoke", configs), tmp_path / "s", tmp_path / "data", None,
                        seeds=[1], models_root=tmp_path / "models")
    (results / "t.seeds.csv").unlink()
    record = Record(results, "t")
    assert fill_from_curves(smoke, record) == 6
    assert not [s for s in steps_to_run(smoke, smoke.steps(), record) if s.kind == "train"]
    assert collect(smoke, finished_only=True, record=record).seeds_done == {"a": [1], "b": [1]}


def test_a_cell_recorded_before_an_output_was_renamed_still_answers(configs, tmp_path):
    """The attention analysis once wrote sparsity.csv (now zero_weights.csv): a cell recorded then is the
    same commands' number, so it answers under the current name; reading leaves the record as it is."""
    from dataclasses import replace

    from fairseq_sparse.experiments.record import Record, Recorded, cell_keys, cell_steps, commands_key

    text = GOOD.replace("{id: bleu, label: BLEU, dataset: iwslt14_de_en, measure: bleu}",
                        "{id: zero, label: Z, dataset: iwslt14_de_en, measure: zero_weights}")
    plan = tables.Plan(load_table(write_table(configs, text), "smoke", configs), tmp_path / "t", tmp_path / "data", None,
                       seeds=[1], models_root=tmp_path / "models")
    ds, a, col = plan.table.datasets["iwslt14_de_en"], plan.table.row("a"), plan.table.columns[0]
    steps = cell_steps(plan, ds, a, col, 1)
    then = [replace(s, output=s.output.with_name("sparsity.csv")) if s.output.name == "zero_weights.csv" else s for s in steps]
    assert then != steps
    key, earlier = cell_keys(plan, steps)
    assert key == commands_key(plan, steps) and earlier == commands_key(plan, then) != key
    record, cell = Record(tmp_path / "results", "t"), ("iwslt14_de_en", "a", "zero", 1)
    record.put(cell, Recorded(earlier, 12.5, "", False))
    assert record.get(cell, key) is None  # other commands, as far as the current key knows
    assert record.get(cell, key, earlier).value == 12.5 and record.get(cell, key, earlier).commands == key
    assert record.get(cell, key) is None and record.cells[cell].commands == earlier  # reading changed nothing
    record.put(cell, Recorded(commands_key(plan, steps[:-1]), 3.0, "", False))  # commands that differ: no answer
    assert record.get(cell, key, earlier) is None


def test_data_preparation_is_finished_by_its_marker_not_by_the_dictionary(configs, tmp_path):
    """fairseq-preprocess writes its dictionary before the binarised data: a killed preparation leaves
    one, so every preparation step is proved finished by a marker the runner writes after it."""
    plan = tables.Plan(load_table(write_table(configs, GOOD), "smoke", configs), tmp_path, tmp_path / "data", None)
    for ds in plan.table.datasets.values():
        assert all(step.output.suffix == ".done" for step in plan.prep_steps(ds))


def test_valid_loss_at_an_epoch_reads_that_epochs_validation(tmp_path, monkeypatch, configs):
    """valid_loss_at compares curves at fixed epochs (the study's diagnosis); its column names the epoch."""
    from types import SimpleNamespace

    from fairseq_sparse.experiments import measures

    log = tmp_path / "train.log"
    log.write_text("| valid | epoch 001 | valid on 'valid' subset | loss 7.5 | x\n"
                   "| valid | epoch 002 | valid on 'valid' subset | loss 6.25 | x\n")
    monkeypatch.setattr(measures.TRAIN_LOG, "output", lambda plan, ds, row, col, seed: log)
    plan = SimpleNamespace(train_argv=lambda ds, row, seed: ["fairseq-train"])
    at = measures.valid_loss_at_epoch
    assert "valid_loss_at" in measures.MEASURES
    assert at(plan, None, None, SimpleNamespace(epoch=1), 1, {}) == 7.5
    assert at(plan, None, None, SimpleNamespace(epoch=2), 1, {}) == 6.25
    with pytest.raises(ValueError, match="no validation loss after epoch 3"):
        at(plan, None, None, SimpleNamespace(epoch=3), 1, {})
    # a row that trains to fewer epochs has no such cell (a 10-epoch row beside 40-epoch rows); the last
    # --max-epoch counts, as in fairseq's parser (a row's args come after its setting's)
    short = SimpleNamespace(train_argv=lambda ds, row, seed: ["fairseq-train", "--max-epoch", "40", "--max-epoch", "2"])
    assert at(short, None, None, SimpleNamespace(epoch=3), 1, {}) is None
    assert at(short, None, None, SimpleNamespace(epoch=2), 1, {}) == 6.25
    longer = SimpleNamespace(train_argv=lambda ds, row, seed: ["fairseq-train", "--max-epoch", "2", "--max-epoch", "40"])
    with pytest.raises(ValueError, match="no validation loss after epoch 3"):
        at(longer, None, None, SimpleNamespace(epoch=3), 1, {})
    # early stopping that ended the run before the epoch: no cell, not an error
    stopped = SimpleNamespace(train_argv=lambda ds, row, seed: ["fairseq-train", "--max-epoch", "40", "--patience", "2"])
    assert at(stopped, None, None, SimpleNamespace(epoch=3), 1, {}) is None
    assert at(stopped, None, None, SimpleNamespace(epoch=2), 1, {}) == 6.25
    # valid_gap_at: the same number per row, minus the baseline row's of the same seed
    gap = measures.MEASURES["valid_gap_at"]
    assert gap.value is at and gap.relative and gap.signed and gap.combine(6.25, 6.0) == 0.25
    for column in ("{id: loss, label: loss, dataset: iwslt14_de_en, measure: valid_loss_at}",
                   "{id: loss, label: loss, dataset: iwslt14_de_en, measure: bleu, epoch: 2}",
                   "{id: loss, label: loss, dataset: iwslt14_de_en, measure: valid_loss_at, epoch: 0}",
                   "{id: loss, label: loss, dataset: iwslt14_de_en, measure: valid_gap_at, baseline: a}"):
        text = GOOD.replace("columns: [{id: bleu, label: BLEU, dataset: iwslt14_de_en, measure: bleu}]", f"columns: [{column}]")
        with pytest.raises(ConfigError, match="valid_loss_at and valid_gap_at need epoch"):
            load_table(write_table(configs, text), "smoke", configs)


def test_an_output_folder_below_a_file_is_one_line_naming_it(tmp_path, capsys):
    a_file = tmp_path / "results.md"
    a_file.write_text("")
    assert tables.main(["demo", "--report-only", "--out", str(a_file / "out")]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"tables: error: {a_file / 'out'}: Not a directory"


def test_a_damaged_record_stops_the_table_with_its_file_and_line(tmp_path, capsys):
    from fairseq_sparse.experiments.record import FIELDS

    record = tmp_path / "results"
    record.mkdir()
    (record / "demo.seeds.csv").write_text(",".join(FIELDS) + "\n<<<<<<< HEAD\n", encoding="utf-8")
    assert tables.main(["demo", "--record", str(record), "--report-only", "--out", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        f"tables: error: {record / 'demo.seeds.csv'}:2: a merge conflict marker")


def paper_bleu_columns():
    """(paper, dataset, column) of every BLEU column of every paper table (not the study's or the demo's)."""
    from fairseq_sparse.experiments.schema import load_table as load

    folder = Path(tables.__file__).parent / "configs" / "tables"
    out = []
    for config in sorted(folder.glob("*.yaml")):
        paper = yaml.safe_load(config.read_text(encoding="utf-8")).get("paper")
        if paper in ("study", "demo"):
            continue
        out += [(paper, c.dataset, c, config.name) for c in load(config, "paper").columns if c.measure == "bleu"]
    return out


def test_every_paper_bleu_column_names_the_papers_scoring_and_one_rule_holds_per_paper_and_dataset():
    """One scoring rule per paper and dataset, with the paper's own named beside our signature. L0Drop and
    ReLA report the same 27.59 WMT14 En-De baseline from one official pipeline (bzhangGo/zero:
    multi-bleu.perl on Stanford's tokenised, compound-split newstest2014): their tokenised rules agree."""
    columns = paper_bleu_columns()
    assert len(columns) > 20
    rules = {}
    for paper, dataset, col, config in columns:
        assert col.paper_scoring, f"{config}: column {col.id} does not name the paper's scoring"
        rule = (col.metric, col.compound_split, col.lowercase, col.sacrebleu_tokenize if col.metric != "tokenized" else "")
        rules.setdefault((paper, dataset, col.metric), set()).add(rule)
    assert all(len(found) == 1 for found in rules.values()), {k: v for k, v in rules.items() if len(v) > 1}
    assert rules["l0drop", "wmt14_en_de", "tokenized"] == rules["rela", "wmt14_en_de", "tokenized"]
    assert rules["l0drop", "wmt14_en_de", "tokenized"] == {("tokenized", True, False, "")}
