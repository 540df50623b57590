"""What the Slurm launcher asks for (experiments/resources.py) and how a training's command changes on
several GPUs (cluster.distributed_argv): no cluster needed."""

import pytest

from fairseq_sparse.experiments.cluster import distributed_argv, kind_of
from fairseq_sparse.experiments.errors import ConfigError
from fairseq_sparse.experiments.resources import DEFAULTS, KINDS, minutes, resources_for
from fairseq_sparse.experiments.step import Step


@pytest.mark.parametrize("text, expected", [("30", 30), ("90:30", 91), ("4:00:00", 240), ("2-00:00:00", 2880),
                                            ("1-12", 2160), ("0-0:1", 1)])
def test_slurm_time_limits_in_minutes(text, expected):
    assert minutes(text) == expected


@pytest.mark.parametrize("text", ["", "2 days", "1:2:3:4", "0", "-5"])
def test_what_is_no_time_limit_is_refused(text):
    with pytest.raises(ConfigError):
        minutes(text)


def test_a_kinds_own_value_wins_over_one_for_every_kind_whatever_their_order():
    per_kind = resources_for("paper", None, "t.yaml", {"time": ["train=3-00:00:00", "1:00:00"], "gpus": ["train=4"],
                                                       "partition": ["gpu"], "sbatch": ["--mail-type=END", "train=--comment=x"]})
    assert per_kind["train"].time == "3-00:00:00" and per_kind["prep"].time == "1:00:00"
    assert per_kind["train"].gpus == 4 and per_kind["finish"].gpus == DEFAULTS["paper"]["finish"].gpus
    assert all(per_kind[kind].partition == "gpu" for kind in KINDS)
    assert per_kind["train"].sbatch == ("--mail-type=END", "--comment=x") and per_kind["prep"].sbatch == ("--mail-type=END",)
    flags = per_kind["train"].flags()
    assert "--gpus-per-node=4" in flags and "--partition=gpu" in flags and "--comment=x" in flags
    params = per_kind["train"].executor_parameters()
    assert params["time"] == 3 * 24 * 60 and params["gpus_per_node"] == 4
    assert params["additional_parameters"] == {"mail-type": "END", "comment": "x", "partition": "gpu"}


def test_the_tables_yaml_section_sits_between_the_defaults_and_the_command_line():
    section = {"all": {"partition": "cpu"}, "train": {"partition": "gpu", "gpus": 2, "mem": "64G"}}
    per_kind = resources_for("paper", section, "t.yaml", {"mem": ["train=32G"]})
    assert per_kind["prep"].partition == "cpu" and per_kind["train"].partition == "gpu"
    assert per_kind["train"].gpus == 2 and per_kind["train"].mem == "32G"


@pytest.mark.parametrize("section, options, message", [
    ({"train": {"gpus": True}}, {}, "gpus must be a whole number, got True"),
    ({"train": {"gpu": 1}}, {}, "unknown key(s) ['gpu']"),
    ({"training": {"gpus": 1}}, {}, "unknown kind(s) of step ['training']"),
    ("gpu", {}, "slurm must map kinds of step"),
    (None, {"cpus": ["train=0"]}, "cpus must be at least 1, got 0"),
    (None, {"cpus": ["train=1.5"]}, "cpus must be a whole number, got '1.5'"),
    (None, {"time": ["train=forever"]}, "is not a Slurm time limit"),
    (None, {"nodes": ["finish=2"]}, "only trainings run on several nodes"),
    (None, {"nodes": ["train=2"], "gpus": ["train=0"]}, "needs GPUs"),
    (None, {"sbatch": ["mail-type=END"]}, "give an sbatch option as --name=value"),
])
def test_wrong_resources_are_one_error_naming_them(section, options, message):
    with pytest.raises(ConfigError, match=None) as error:
        resources_for("paper", section, "t.yaml", options)
    assert message in str(error.value)


def test_several_gpus_keep_the_settings_tokens_per_update():
    one_gpu = ["fairseq-train", "bin", "--max-tokens", "3584", "--update-freq", "8", "--save-dir", "x"]
    assert distributed_argv(one_gpu, 1) == one_gpu
    four = distributed_argv(one_gpu, 4)
    assert four[four.index("--update-freq") + 1] == "2" and four[four.index("--distributed-world-size") + 1] == "4"
    assert int(four[four.index("--distributed-port") + 1]) > 0
    # a setting written for 4 GPUs (Explicit Sparse's WMT14) run on one: 4 times the update frequency
    written_for_four = ["fairseq-train", "bin", "--update-freq", "32", "--distributed-world-size", "4"]
    one = distributed_argv(written_for_four, 1)
    assert one[one.index("--update-freq") + 1] == "128" and one[one.index("--distributed-world-size") + 1] == "1"
    with pytest.raises(ConfigError, match="3 GPUs cannot keep its tokens per update"):
        distributed_argv(one_gpu, 3)


def test_each_kind_of_step_asks_for_its_kinds_resources(tmp_path):
    def step(kind, runs_alone=False):
        return Step(kind, ["true"], tmp_path / "out", tmp_path / "log", kind, runs_alone=runs_alone)

    assert [kind_of(step("prep")), kind_of(step("train")), kind_of(step("generate")), kind_of(step("average")),
            kind_of(step("speed", runs_alone=True)), kind_of(step("generate", runs_alone=True))] == \
        ["prep", "train", "finish", "finish", "timed", "timed"]
