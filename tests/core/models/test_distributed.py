"""Multi-process training on CPU: two real fairseq-train processes (gloo, 127.0.0.1), as a user runs them.

Each case starts rank 0 and rank 1 of

    fairseq-train DATA --user-dir fairseq_sparse ... --cpu --distributed-backend gloo
        --distributed-init-method tcp://127.0.0.1:PORT --distributed-world-size 2
        --distributed-rank R --distributed-no-spawn

on the binarised de-en Bible verses of conftest.py's `bible` fixture, with a tiny
transformer_sparse_mini and 3 updates, and checks:

* both processes exit 0;
* the replicas end with identical parameters and buffers (torch.equal, every tensor), and
  rank 0's checkpoint_last.pt holds them after 3 updates;
* the logged statistics are aggregates over both ranks. The launcher records, on each
  rank, the logging output of its own forward/backward (its local batch: loss sum,
  nll_loss sum, ntokens, ..., L0Drop's open / closed gate counts) and every stats dict
  handed to fairseq's progress bar (fairseq sets every rank but 0 to WARNING, so rank 1
  prints no JSON lines; its stats are taken from the same progress.log call). Per update,
  the train_inner stats of the two ranks must be identical (timings aside), and `loss`,
  `nll_loss` (with L0Drop also `l0_loss`, `sparsity`) must equal the criterion's own
  `reduce_metrics` over the local outputs of *both* ranks, to the logged rounding, and
  `wpb` / `bsz` the sums of both ranks' target tokens / sentences. This can fail: the test
  asserts that rank 0's batch alone gives a different `loss` (beyond rounding) and `wpb`,
  so a log of rank 0's local numbers, or of any one rank's, is caught. (L0Drop's
  `l0_loss` and `sparsity` are nearly equal on every batch of a fresh model, whose gates
  are all open, so only `loss` and `wpb` are required to tell the two apart.) Rank 0's
  stdout, what a user reads, must carry the same train_inner numbers;
* the end-of-run `train` and `valid` stats are finite and identical on both ranks.

These checks were seen to fail, each on its own, with the launcher changed to keep each
rank's logging outputs local, to broadcast rank 0's instead of summing, to skip the
gradient all-reduce (legacy_ddp) or DDP's gradient sync (pytorch_ddp), and to add one
parameter that gets no gradient (DDP: "Expected to have finished reduction ...").

No case passes --find-unused-parameters: with the default --ddp-backend (pytorch_ddp) DDP
stops at the second update if a method leaves a parameter without a gradient, which is
part of what is tested. One case runs --ddp-backend legacy_ddp.

What fairseq 0.12 cannot do in CPU processes is worked around in the launcher below (see
LAUNCHER), never in the plugin. test_logged_l0_lambda_is_the_configured_lambda guards a bug
found here: L0Drop's logged l0_lambda was summed over ranks (2 ranks logged 0.6 for 0.3).
"""

import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import fairseq_sparse  # noqa: F401  (registers the plugin; allow-lists checkpoint types for torch.load)
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
from fairseq.logging import metrics
from fairseq_sparse.core.attention import attention_names, get_attention
from fairseq_sparse.core.criterions.l0drop import L0DropCriterion

ROOT = Path(__file__).resolve().parents[3]
USER_DIR = str(ROOT / "fairseq_sparse")
FAIRSEQ_TRAIN = Path(sys.executable).parent / "fairseq-train"
UPDATES = 3
TIMEOUT = 240  # seconds for one two-process run; one takes 10-20 s on 2 CPU cores

# Runs the `fairseq-train` console script next to sys.executable for one rank, after one patch
# fairseq 0.12 needs to train in CPU processes and a few recording hooks, then saves what the
# test compares. Usage: python launch.py OUT.pt PATH/TO/fairseq-train <fairseq-train arguments>
LAUNCHER = r'''
import runpy
import sys

# first, as in the fairseq-train script: fairseq_cli.train configures logging before fairseq is imported
import fairseq_cli.train  # noqa: F401
import torch
import torch.nn.parallel

out_path, script = sys.argv[1], sys.argv[2]
sys.argv = [script] + sys.argv[3:]

# The one workaround, for a fairseq 0.12 limitation: --ddp-backend pytorch_ddp / c10d (the
# default) builds DistributedDataParallel(module, device_ids=[args.device_id],
# output_device=args.device_id, ...) (fairseq/models/distributed_fairseq_model.py, line 62), and
# torch refuses that for a CPU module: "ValueError: DistributedDataParallel device_ids and
# output_device arguments only work with single-device/multiple-device GPU modules or CPU
# modules, but got device_ids [0], output_device 0, and module parameters {device(type='cpu')}".
# The subclass drops the two for a CPU module and changes nothing else (find_unused_parameters
# stays as fairseq sets it: False). --ddp-backend legacy_ddp needs no workaround.
#
# Two other fairseq limitations are avoided, not patched, by starting one process per rank
# with --distributed-no-spawn and a tcp:// init method (what the test runs):
# - fairseq's own spawn (fairseq-train --distributed-world-size 2 without an init method) needs
#   GPUs: "AssertionError: world size is 2 but have 0 available devices"
#   (fairseq/distributed/utils.py, line 161), and would spawn min(torch.cuda.device_count(),
#   world size) processes (line 382);
# - torchrun (env://) sets device_id = rank % torch.cuda.device_count()
#   (fairseq/distributed/utils.py, line 91): "ZeroDivisionError: integer modulo by zero" on CPU.
import fairseq.models.distributed_fairseq_model as distributed_fairseq_model


class CpuDistributedDataParallel(torch.nn.parallel.DistributedDataParallel):
    def __init__(self, module, device_ids=None, output_device=None, **kwargs):
        if all(p.device.type == "cpu" for p in module.parameters()):
            device_ids = output_device = None
        super().__init__(module, device_ids=device_ids, output_device=output_device, **kwargs)


distributed_fairseq_model.DistributedDataParallel = CpuDistributedDataParallel

# Recording only (no change to training): each local forward/backward's logging output, each
# stats dict fairseq logs (fairseq sets the logger of every rank but 0 to WARNING, so rank 1's
# JSON lines never reach its stdout), and the trainer, to save the replica's parameters.
from fairseq.logging import progress_bar
from fairseq.tasks.fairseq_task import FairseqTask
from fairseq.trainer import Trainer

record = {"local": [], "logged": []}
trainers = []


def _number(value):
    if torch.is_tensor(value):
        return value.item()
    return value


_train_step = FairseqTask.train_step


def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False, **kwargs):
    loss, sample_size, logging_output = _train_step(
        self, sample, model, criterion, optimizer, update_num, ignore_grad, **kwargs)
    record["local"].append({"update": update_num, "dummy": bool(ignore_grad),
                            "log": {k: _number(v) for k, v in logging_output.items()}})
    return loss, sample_size, logging_output


FairseqTask.train_step = train_step


def _recording(method):
    def wrapper(self, stats, tag=None, step=None):
        record["logged"].append({"method": method.__name__, "tag": tag, "step": step,
                                 "stats": {k: _number(v) for k, v in stats.items()}})
        return method(self, stats, tag=tag, step=step)
    return wrapper


progress_bar.JsonProgressBar.log = _recording(progress_bar.JsonProgressBar.log)
progress_bar.JsonProgressBar.print = _recording(progress_bar.JsonProgressBar.print)

_trainer_init = Trainer.__init__


def trainer_init(self, *args, **kwargs):
    _trainer_init(self, *args, **kwargs)
    trainers.append(self)


Trainer.__init__ = trainer_init

# the console script itself (.venv/bin/fairseq-train: sys.exit(cli_main()))
try:
    runpy.run_path(script, run_name="__main__")
except SystemExit as stop:
    if stop.code not in (None, 0):
        raise

(trainer,) = trainers
record["rank"] = trainer.data_parallel_rank
record["world_size"] = trainer.data_parallel_world_size
record["state"] = {k: v.detach().clone() for k, v in trainer.get_model().state_dict().items()}
torch.save(record, out_path)
'''

TINY_MODEL = [
    "--arch", "transformer_sparse_mini", "--encoder-layers", "1", "--decoder-layers", "1",
    "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
    "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
]

LABEL_SMOOTHED = ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]
L0DROP = ["--l0drop", "--criterion", "label_smoothed_cross_entropy_l0drop", "--label-smoothing", "0.1",
          "--l0-lambda", "0.3"]


def attn(encoder, decoder, cross):
    return ["--encoder-attn-fn", encoder, "--decoder-attn-fn", decoder, "--cross-attn-fn", cross, "--attn-k", "4"]


# Every registered function in at least one sublayer where it is valid (self-attention-only
# patterns in encoder/decoder self-attention). test_every_attention_function_has_a_group fails
# when a newly registered function is in none of them.
ATTENTION_GROUPS = {
    "topk-hard-rela_g": attn("topk", "hard", "rela_g"),
    "entmax_alpha-sparsemax-entmax15": attn("entmax_alpha", "sparsemax", "entmax15"),
    "rela_i-relu-relu_rmsnorm": attn("rela_i", "relu", "relu_rmsnorm"),
    "rela_g_layernorm-rela_g_gelu-rela_g_leaky_relu": attn("rela_g_layernorm", "rela_g_gelu", "rela_g_leaky_relu"),
    "window-bigbird-random": attn("window", "bigbird", "random"),
    "block-dilated-softmax": attn("block", "dilated", "softmax"),
    "global-topk_oow-hard": attn("global", "topk_oow", "hard"),
}

# case -> (fairseq-train options, criterion class whose reduce_metrics the logs must match).
# Start-up (two fairseq imports on 2 cores) is most of a run, so the encoder options (L0Drop,
# pruning patterns) ride along with attention groups instead of running on their own.
CASES = {
    "topk-hard-rela_g+l0drop": (L0DROP + ATTENTION_GROUPS["topk-hard-rela_g"], L0DropCriterion),
    "entmax_alpha-sparsemax-entmax15+l0drop-every-layer": (
        L0DROP + ["--l0drop-every-layer", "--encoder-layers", "2"]
        + ATTENTION_GROUPS["entmax_alpha-sparsemax-entmax15"],
        L0DropCriterion),
    "rela_i-relu-relu_rmsnorm+prune-group": (
        LABEL_SMOOTHED + ["--encoder-prune-pattern", "group"] + ATTENTION_GROUPS["rela_i-relu-relu_rmsnorm"],
        LabelSmoothedCrossEntropyCriterion),
    "rela_g_layernorm-rela_g_gelu-rela_g_leaky_relu+prune-freq": (
        LABEL_SMOOTHED + ["--encoder-prune-pattern", "freq"]
        + ATTENTION_GROUPS["rela_g_layernorm-rela_g_gelu-rela_g_leaky_relu"],
        LabelSmoothedCrossEntropyCriterion),
    **{name: (LABEL_SMOOTHED + ATTENTION_GROUPS[name], LabelSmoothedCrossEntropyCriterion)
       for name in ("window-bigbird-random", "block-dilated-softmax", "global-topk_oow-hard")},
    # the other DDP implementation, with functions that own parameters and L0Drop gates
    "legacy_ddp+l0drop+rela_g-entmax_alpha-rela_g": (
        L0DROP + attn("rela_g", "entmax_alpha", "rela_g") + ["--ddp-backend", "legacy_ddp"], L0DropCriterion),
}
# every case but legacy_ddp runs fairseq's default --ddp-backend (pytorch_ddp)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_ranks(data: Path, tmp_path: Path, extra):
    """Start rank 0 and rank 1, wait for both; returns (records, stdout+stderr) per rank."""
    codes, outputs = start_two_ranks(data, tmp_path, extra)
    if codes != [0, 0] and "EADDRINUSE" in "".join(outputs):  # the free port was taken meanwhile
        codes, outputs = start_two_ranks(data, tmp_path, extra)
    assert codes == [0, 0], "fairseq-train exit codes %s\n" % codes + "".join(
        f"\n---- rank {r} (last 4000 characters) ----\n{out[-4000:]}" for r, out in enumerate(outputs))
    records = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in (0, 1)]
    return records, outputs


def start_two_ranks(data: Path, tmp_path: Path, extra):
    """One attempt: (exit codes, outputs) of the two processes."""
    shutil.rmtree(tmp_path / "ckpt", ignore_errors=True)  # fairseq-train would resume from it
    launcher = tmp_path / "launch.py"
    launcher.write_text(LAUNCHER)
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    common = [
        str(data), "--user-dir", USER_DIR, *TINY_MODEL, "--optimizer", "adam", "--lr", "0.005",
        "--max-tokens", "400", "--max-update", str(UPDATES), "--seed", "1", "--save-dir", str(tmp_path / "ckpt"),
        "--no-epoch-checkpoints", "--log-format", "json", "--log-interval", "1",
        "--cpu", "--distributed-backend", "gloo", "--distributed-init-method", f"tcp://127.0.0.1:{port}",
        "--distributed-world-size", "2", "--distributed-no-spawn", *extra,
    ]
    procs, logs = [], []
    for rank in (0, 1):
        log = open(tmp_path / f"rank{rank}.log", "w+")
        cmd = [sys.executable, str(launcher), str(tmp_path / f"rank{rank}.pt"), str(FAIRSEQ_TRAIN),
               *common, "--distributed-rank", str(rank)]
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path))
        logs.append(log)
    # a rank that fails leaves the other waiting in a collective: stop it soon after
    deadline = time.monotonic() + TIMEOUT
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        if any(p.poll() not in (None, 0) for p in procs):
            deadline = min(deadline, time.monotonic() + 15)
        time.sleep(0.2)
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    return [p.returncode for p in procs], outputs


def reduce(criterion, outputs):
    """The criterion's reduce_metrics over logging outputs: {key: (unrounded value, logged rounding)}."""
    with metrics.aggregate(new_root=True) as agg:
        criterion.reduce_metrics(outputs)
        return {k: (agg[k].avg, agg[k].round) for k in agg.keys() if hasattr(agg[k], "avg")}


def logged(record, tag):
    """The stats dicts a rank passed to progress.log / progress.print with this tag (keys without prefix)."""
    return [e["stats"] for e in record["logged"] if e["tag"] == tag]


def stdout_stats(output: str, tag: str):
    """The JSON stats of fairseq's log lines `... | INFO | TAG | {...}`."""
    return [json.loads(m.group(1)) for m in re.finditer(rf"\| {tag} \| (\{{.*\}})\s*$", output, re.M)]


TIMING = {"wps", "ups", "wall", "train_wall", "gb_free"}  # differ between ranks by nature

_RUNS = {}  # case -> (directory, records, outputs): a case runs once per session


def two_rank_run(case, bible, tmp_path_factory):
    if case not in _RUNS:
        directory = tmp_path_factory.mktemp(re.sub(r"\W+", "_", case))
        _RUNS[case] = (directory, *run_two_ranks(bible / "bin", directory, CASES[case][0]))
    return _RUNS[case]


def test_every_attention_function_has_a_group():
    placed = {}  # function -> sublayers it runs in
    for args in ATTENTION_GROUPS.values():
        for sublayer, fn in zip(("encoder", "decoder", "cross"), args[1:6:2]):
            placed.setdefault(fn, set()).add(sublayer)
    assert sorted(placed) == sorted(attention_names()), "add the new function to a group of ATTENTION_GROUPS"
    for fn, sublayers in placed.items():
        if get_attention(fn).self_attention_only:
            assert "cross" not in sublayers, fn


@pytest.mark.parametrize("case", list(CASES))
def test_two_process_cpu_training(case, bible, tmp_path_factory):
    criterion = CASES[case][1]
    directory, (rank0, rank1), (out0, out1) = two_rank_run(case, bible, tmp_path_factory)
    assert (rank0["rank"], rank1["rank"]) == (0, 1) and rank0["world_size"] == rank1["world_size"] == 2

    # identical replicas, and rank 0's checkpoint_last.pt is that replica after UPDATES updates
    assert rank0["state"].keys() == rank1["state"].keys()
    different = [k for k in rank0["state"] if not torch.equal(rank0["state"][k], rank1["state"][k])]
    assert not different, f"replicas differ in {different}"
    checkpoint = torch.load(directory / "ckpt" / "checkpoint_last.pt", map_location="cpu")
    assert checkpoint["model"].keys() == rank0["state"].keys()
    assert all(torch.equal(checkpoint["model"][k], v) for k, v in rank0["state"].items())
    assert checkpoint["optimizer_history"][-1]["num_updates"] == UPDATES

    # train_inner: the same aggregate on both ranks ...
    inner0, inner1 = logged(rank0, "train_inner"), logged(rank1, "train_inner")
    assert [s["num_updates"] for s in inner0] == list(range(1, UPDATES + 1))
    strip = lambda stats: {k: v for k, v in stats.items() if k not in TIMING}  # noqa: E731
    assert [strip(s) for s in inner0] == [strip(s) for s in inner1], "the ranks logged different statistics"

    # ... equal to reduce_metrics over the batches of both ranks, and not to rank 0's alone
    metric_keys = ["loss", "nll_loss"] + (["l0_loss", "pruned"] if criterion is L0DropCriterion else [])
    discriminating = {"loss": False, "wpb": False}
    for update, stats in enumerate(inner0):
        local = [[e for e in record["local"] if e["update"] == update] for record in (rank0, rank1)]
        assert [len(steps) for steps in local] == [1, 1], "one batch per rank and update expected (no --update-freq)"
        assert not any(steps[0]["dummy"] for steps in local), "a rank had no batch: the check would be weaker"
        outputs = [steps[0]["log"] for steps in local]
        both, alone = reduce(criterion, outputs), reduce(criterion, outputs[:1])
        for key in metric_keys:
            value, digits = both[key]
            tolerance = 0.5 * 10 ** -digits + 1e-6  # the logged value is rounded to `digits`
            assert math.isfinite(stats[key]), (update, key, stats)
            assert abs(stats[key] - value) <= tolerance, (
                f"update {update + 1}: logged {key} {stats[key]} is not the aggregate {value} of both ranks "
                f"(rank 0 alone: {alone[key][0]})")
            if key == "loss" and abs(alone[key][0] - value) > 2 * tolerance:
                discriminating["loss"] = True
        ntokens, nsentences = (sum(o[k] for o in outputs) for k in ("ntokens", "nsentences"))
        assert abs(stats["wpb"] - ntokens) <= 0.05 and abs(stats["bsz"] - nsentences) <= 0.05, (stats, outputs)
        discriminating["wpb"] |= outputs[0]["ntokens"] != ntokens
    assert all(discriminating.values()), f"rank 0's batch alone gives the same numbers: {discriminating}"

    # rank 0's stdout: the JSON lines a user reads carry these numbers; fairseq silences rank 1
    printed = stdout_stats(out0, "train_inner")
    assert [(float(p["loss"]), float(p["wpb"])) for p in printed] == [(s["loss"], s["wpb"]) for s in inner0], printed
    assert "| train_inner |" not in out1

    # end of training: the epoch's train line and the validation, finite and identical on both ranks
    for tag in ("train", "valid"):
        (end0,), (end1,) = logged(rank0, tag), logged(rank1, tag)
        assert math.isfinite(end0["loss"]) and strip(end0) == strip(end1), (tag, end0, end1)


def test_logged_l0_lambda_is_the_configured_lambda(bible, tmp_path_factory):
    _, records, _ = two_rank_run("topk-hard-rela_g+l0drop", bible, tmp_path_factory)
    for record in records:
        for tag in ("train_inner", "train", "valid"):
            values = [s["l0_lambda"] for s in logged(record, tag)]
            assert values and values == [0.3] * len(values), f"--l0-lambda 0.3, rank {record['rank']} logged {tag} {values}"
