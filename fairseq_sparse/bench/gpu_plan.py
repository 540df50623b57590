"""The GPU report's plan: every step it runs, in order, each with its command (nothing is run here)."""

import argparse
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import fairseq_sparse
from fairseq_sparse.core.attention import attention_names, get_attention

# the directory holding this package (a checkout or site-packages): every step imports the same plugin
PACKAGE_PARENT = Path(fairseq_sparse.__file__).resolve().parents[1]

GROUPS = ("environment", "data", "train", "equality", "operations", "memory", "run")
PRECISIONS = ("fp16", "bf16")
# The L0Drop rows of the training check: (row, fairseq-train options). Both train with the L0 criterion.
L0DROP_ROWS = {
    "l0drop": ["--l0drop", "--criterion", "label_smoothed_cross_entropy_l0drop", "--label-smoothing", "0.1",
               "--l0-lambda", "0.3"],
    "l0drop_every_layer": ["--l0drop", "--l0drop-every-layer", "--criterion", "label_smoothed_cross_entropy_l0drop",
                           "--label-smoothing", "0.1", "--l0-lambda", "0.3"],
}
TINY_MODEL = ["--arch", "transformer_sparse_mini", "--encoder-embed-dim", "64", "--decoder-embed-dim", "64",
              "--encoder-ffn-embed-dim", "128", "--decoder-ffn-embed-dim", "128", "--encoder-attention-heads", "4",
              "--decoder-attention-heads", "4", "--share-all-embeddings"]
# The papers' decoding settings: beam 4, batch 1 (run.py's decode1 job) and batch 128.
RUN_OPTIONS = ["--device", "cuda", "--arch", "transformer_sparse", "--beam", "4", "--batch-size", "128",
               "--long-lengths", "512", "1024", "2048", "4096"]
# Document lengths: where top-k and the patterns gather their keys (modules/gathered_attention.py).
MEMORY_LENGTHS = ["512", "1024", "2048", "4096"]
# The speed profile: the users' regime in one call of 10 minutes on one H100/H200 (issue 73's measurements), bf16.
# Training steps at 512-8,192 tokens (one sequence each) against stock fairseq, for the methods whose training a
# kernel or a gathered path speeds up; decoding (beam 4, batch 1 and 128) against softmax, for those with a
# decoding-step kernel and L0Drop's compressed memory; 3 repetitions (the median).
SPEED_TRAIN_FUNCTIONS = ["topk", "window", "block", "rela_g", "hard"]
SPEED_TRAIN_LENGTHS = ["512", "1024", "2048", "4096", "8192"]
SPEED_DECODE_FUNCTIONS = ["hard", "topk", "rela_g", "l0drop"]
SPEED_RUN_COMMON = ["--device", "cuda", "--arch", "transformer_sparse", "--repeats", "3"]
SPEED_TRAIN_OPTIONS = [*SPEED_RUN_COMMON, "--skip-decode", "--long-lengths", *SPEED_TRAIN_LENGTHS,
                       "--long-batch-size", "1", "--functions", *SPEED_TRAIN_FUNCTIONS]
SPEED_DECODE_OPTIONS = [*SPEED_RUN_COMMON, "--skip-train", "--beam", "4", "--batch-size", "128",
                        "--functions", *SPEED_DECODE_FUNCTIONS]
# Peak memory of one self-attention sublayer (forward and backward) of the same training rows, up to 8,192 tokens.
SPEED_MEMORY_LENGTHS = ["1024", "4096", "8192"]
SPEED_MEMORY_FUNCTIONS = ["softmax", *SPEED_TRAIN_FUNCTIONS]
# --attn-impl flex (the patterns through FlexAttention): every pattern that has a mask_mod in the full profile,
# the two the document-length targets name (and BigBird's random keys, for equality) in the speed profile.
FLEX_FUNCTIONS = [name for name in attention_names() if get_attention(name).flex_mask is not None]
SPEED_FLEX_RUN_FUNCTIONS = ["window", "block"]
# The speed profile's equality check: the functions with a kernel of their own (a decoding step, ReLA's sequence
# kernel), and softmax, L0Drop (its compressed memory of counted keys) and stock fairseq beside them.
SPEED_EQUALITY_FUNCTIONS = [name for name in attention_names() if get_attention(name).decoding_kernel is not None
                            or get_attention(name).sequence_kernel is not None] + ["softmax", "l0drop", "fairseq"]
SPEED_FLEX_EQUALITY_FUNCTIONS = ["window", "block", "bigbird"]
PROFILES = ("full", "speed")
VALID_PAIRS = 40  # sentence pairs of the synthetic validation set


@dataclass
class ReportStep:
    """One step of the report: what it runs, and (filled in as it runs) how it went."""

    name: str
    group: str
    describe: str
    command: Optional[List[str]] = None
    timeout: float = 600.0
    env: Dict[str, str] = field(default_factory=dict)
    row: str = ""
    precision: str = ""
    status: str = "not run"  # ok | FAILED | not run
    seconds: float = 0.0
    returncode: Optional[int] = None
    stdout: str = ""
    stderr: str = ""
    note: str = ""
    losses: List[float] = field(default_factory=list)

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", self.name)


def train_rows() -> Dict[str, List[str]]:
    """fairseq-train options choosing each row's attention: every registered function, then the L0Drop rows."""
    rows = {}
    for fn in attention_names():
        options = [f"--{sublayer}-attn-fn={fn}" for sublayer in get_attention(fn).sublayers]
        rows[fn] = options + ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]
    rows.update(L0DROP_ROWS)
    return rows


def row_placement(row: str) -> str:
    """Where a training row's attention runs, in words."""
    if row in L0DROP_ROWS:
        return "softmax everywhere, " + ("gates after every encoder layer" if "every" in row else "gates on encoder outputs")
    return "+".join(get_attention(row).sublayers)


def data_step(data: Path, train_pairs: int) -> ReportStep:
    python = sys.executable
    return ReportStep("data", "data",
                f"(in-process) write a synthetic copy-task bitext ({train_pairs} train / {VALID_PAIRS} valid pairs, "
                f"40 word types) to {data}/raw, then:",
                command=[python, "-m", "fairseq_cli.preprocess", "--source-lang", "src", "--target-lang", "tgt",
                         "--trainpref", str(data / "raw" / "train"), "--validpref", str(data / "raw" / "valid"),
                         "--destdir", str(data / "bin"), "--joined-dictionary", "--workers", "1"])


def train_steps(data: Path, updates: int, timeout: float) -> List[ReportStep]:
    """A few updates of real fairseq-train per row and precision."""
    steps = []
    for row, options in train_rows().items():
        for precision in PRECISIONS:
            # fairseq 0.12's own entry point reads --bf16 as "on a TPU": bfloat16 runs go through the plugin's
            trainer = "fairseq_sparse.train" if precision == "bf16" else "fairseq_cli.train"
            command = [sys.executable, "-m", trainer, str(data / "bin"), "--user-dir", str(PACKAGE_PARENT / "fairseq_sparse"),
                       *TINY_MODEL, *options, "--optimizer", "adam", "--lr", "0.002", "--max-tokens", "1000",
                       "--max-update", str(updates), "--no-save", "--disable-validation",
                       "--log-format", "json", "--log-interval", "1", "--seed", "1", "--num-workers", "0",
                       f"--{precision}"]
            steps.append(ReportStep(f"train {row} {precision}", "train", f"fairseq-train, {row}, --{precision}:",
                              command=command, timeout=timeout, env={"OMP_NUM_THREADS": "1"},
                              row=row, precision=precision))
    return steps


def benchmark_steps(report_dir: Path, timeout: float, run_timeout: float, dtype: str = "bf16",
                    profile: str = "full", csv_name: str = "speed.csv") -> List[ReportStep]:
    """The benchmarks of fairseq_sparse.bench on the GPU, in ``dtype``; run.py's CSV goes beside the report.
    The ``speed`` profile keeps the users' regime's measurements only (``speed_steps``)."""
    if profile == "speed":
        return speed_steps(report_dir, timeout, run_timeout, dtype, csv_name)
    python = sys.executable
    steps = [ReportStep("equality", "equality", "CPU vs CUDA logits of the same weights, per function:",
                  command=[python, "-m", "fairseq_sparse.bench.cuda_equality", "--device", "cuda"], timeout=timeout),
             ReportStep("operations", "operations", "Hard Retrieval Table 2, per-operation times:",
                  command=[python, "-m", "fairseq_sparse.bench.operations", "--device", "cuda"], timeout=timeout)]
    steps.append(ReportStep("equality flex", "equality",
                      "CPU vs CUDA with --attn-impl flex on CUDA (FlexAttention, compiled), logits and gradients:",
                      command=[python, "-m", "fairseq_sparse.bench.cuda_equality", "--device", "cuda",
                               "--device-attn-impl", "flex", "--functions", *FLEX_FUNCTIONS], timeout=timeout))
    for causal in (False, True):
        steps.append(ReportStep("memory causal" if causal else "memory", "memory",
                          f"peak memory, {'decoder (causal)' if causal else 'encoder'} self-attention, {dtype}:",
                          command=[python, "-m", "fairseq_sparse.bench.memory", "--device", "cuda", "--dtype", dtype,
                                   "--lengths", *MEMORY_LENGTHS, "--functions", *attention_names()]
                          + (["--causal"] if causal else []),
                          timeout=timeout))
    steps.append(ReportStep("memory flex", "memory", f"peak memory, encoder self-attention, --attn-impl flex, {dtype}:",
                      command=[python, "-m", "fairseq_sparse.bench.memory", "--device", "cuda", "--dtype", dtype,
                               "--attn-impl", "flex", "--lengths", *MEMORY_LENGTHS, "--functions", *FLEX_FUNCTIONS],
                      timeout=timeout))
    steps.append(ReportStep("run", "run", f"train / decode throughput vs stock fairseq and softmax, {dtype}:",
                      command=[python, "-m", "fairseq_sparse.bench.run", *RUN_OPTIONS, "--dtype", dtype,
                               "--csv", str(report_dir / csv_name)],
                      timeout=run_timeout))
    flex_options = _without_option(RUN_OPTIONS, "--functions")
    steps.append(ReportStep("run flex", "run", f"the same with --attn-impl flex for the patterns (compilation in the warm-up), {dtype}:",
                      command=[python, "-m", "fairseq_sparse.bench.run", *flex_options, "--functions", *FLEX_FUNCTIONS,
                               "--attn-impl", "flex", "--dtype", dtype,
                               "--csv", str(report_dir / csv_name.replace(".csv", ".flex.csv"))],
                      timeout=run_timeout))
    return steps


def speed_steps(report_dir: Path, timeout: float, run_timeout: float, dtype: str = "bf16",
                csv_name: str = "speed.csv") -> List[ReportStep]:
    """The users' regime, most wanted first (a --budget cuts the last steps): the kernels against the reference in
    float32 (CPU vs CUDA, TF32 off for torch and kernels alike) and in ``dtype`` (the device's kernels against the
    same device's reference path), ``dtype`` training speed at 512-8,192 tokens against stock fairseq, ``dtype``
    decoding speed against softmax, peak memory; then window and block through FlexAttention."""
    python = sys.executable
    equality = [python, "-m", "fairseq_sparse.bench.cuda_equality", "--device", "cuda"]
    run = [python, "-m", "fairseq_sparse.bench.run"]
    memory = [python, "-m", "fairseq_sparse.bench.memory", "--device", "cuda", "--dtype", dtype,
              "--lengths", *SPEED_MEMORY_LENGTHS]
    return [
        ReportStep("equality", "equality", "CPU vs CUDA logits and gradients of the same weights, float32, per function "
                   "with a kernel:", command=[*equality, "--functions", *SPEED_EQUALITY_FUNCTIONS], timeout=timeout),
        ReportStep(f"equality {dtype}", "equality",
                   f"CUDA kernels vs CUDA reference path (--attn-impl reference), {dtype}, same weights:",
                   command=[*equality, "--dtype", dtype, "--functions", *SPEED_EQUALITY_FUNCTIONS], timeout=timeout),
        ReportStep("run train", "run", f"train steps at {SPEED_TRAIN_LENGTHS[0]}-{SPEED_TRAIN_LENGTHS[-1]} tokens vs "
                   f"stock fairseq, {dtype}:", command=[*run, *SPEED_TRAIN_OPTIONS, "--dtype", dtype, "--csv",
                                                        str(report_dir / csv_name.replace(".csv", ".train.csv"))],
                   timeout=run_timeout),
        ReportStep("run decode", "run", f"beam-4 decoding (batch 1 and 128) vs softmax, {dtype}:",
                   command=[*run, *SPEED_DECODE_OPTIONS, "--dtype", dtype, "--csv",
                            str(report_dir / csv_name.replace(".csv", ".decode.csv"))], timeout=run_timeout),
        ReportStep("memory", "memory", f"peak memory, encoder self-attention, {dtype}:",
                   command=[*memory, "--functions", *SPEED_MEMORY_FUNCTIONS], timeout=timeout),
        ReportStep("memory causal", "memory", f"peak memory, decoder (causal) self-attention, {dtype}:",
                   command=[*memory, "--functions", *SPEED_MEMORY_FUNCTIONS, "--causal"], timeout=timeout),
        ReportStep("equality flex", "equality",
                   "CPU vs CUDA with --attn-impl flex on CUDA (FlexAttention, compiled), logits and gradients:",
                   command=[*equality, "--device-attn-impl", "flex", "--functions", *SPEED_FLEX_EQUALITY_FUNCTIONS],
                   timeout=timeout),
        ReportStep("run train flex", "run", f"train steps of window and block with --attn-impl flex (compilation in "
                   f"the warm-up), {dtype}:",
                   command=[*run, *_without_option(SPEED_TRAIN_OPTIONS, "--functions"), "--functions",
                            *SPEED_FLEX_RUN_FUNCTIONS, "--attn-impl", "flex", "--dtype", dtype, "--csv",
                            str(report_dir / csv_name.replace(".csv", ".flex.csv"))], timeout=run_timeout),
    ]


def _without_option(options: List[str], name: str) -> List[str]:
    """``options`` without ``name`` and the values that follow it (up to the next option)."""
    kept, skipping = [], False
    for item in options:
        if item.startswith("--"):
            skipping = item == name
        if not skipping:
            kept.append(item)
    return kept


def side_file(args: argparse.Namespace, name: str) -> str:
    """A file written beside the report: ``name`` for the full report, REPORT-STEM.NAME for the speed
    profile, whose reports of several devices and precisions share results/bench."""
    return name if args.profile == "full" else f"{args.out.stem}.{name}"


def build_plan(args: argparse.Namespace, work: Path, report_dir: Path) -> List[ReportStep]:
    """The steps of the groups ``args.only`` names, in order; the environment always (the report names the device)."""
    steps = [ReportStep("environment", "environment",
                  "(in-process) torch.cuda.get_device_name(0); torch, CUDA, cuDNN, fairseq, fairseq-sparse, numpy and "
                  "Python versions"),
             data_step(work / "data", args.train_pairs),
             *train_steps(work / "data", args.train_updates, args.step_timeout),
             *benchmark_steps(report_dir, args.step_timeout, args.run_timeout, args.dtype, args.profile,
                              side_file(args, "speed.csv"))]
    return [s for s in steps if s.group in args.only or s.group == "environment"]


def format_plan(steps: Sequence[ReportStep], work: Path, out: Path) -> str:
    """Every step and its command, numbered, as the dry run prints it and the report ends with it."""
    lines = [f"plan: {len(steps)} steps, plugin from {PACKAGE_PARENT}; report {out}; data and logs under {work}"]
    for i, step in enumerate(steps, 1):
        lines.append(f"{i:3d}. [{step.group}] {step.name}: {step.describe}")
        if step.command:
            env = "".join(f"{k}={v} " for k, v in step.env.items())
            lines.append(f"       {env}{shlex.join(step.command)}")
    return "\n".join(lines)
