#!/usr/bin/env python
"""Decode speed of trained models, measured interleaved: fairseq-generate commands run in turn.

A table's speed column compares two decodes. Timed hours apart on one machine they disagree by
more than the effect: the study's softmax model decoded the same test book at 3406 tokens/s at
06:41 and at 2756 at 15:43. Here every round runs each command once, each as its own
fairseq-generate process (exactly the command a table decodes with), in an order that rotates
every round; a command's speed is the median over rounds of what fairseq-generate reports for
generation alone (model loading and process start excluded). A drift of the machine thus hits
every command alike, and their ratio is one run's.

    python -m fairseq_sparse.bench.decode_speed --rounds 3 --out speed.csv \\
        --run softmax "DATA --path softmax.pt --gen-subset test --beam 4" \\
        --run topk "DATA --path softmax.pt --gen-subset test --beam 4 --model-overrides \\"{'cross_attn_fn': 'topk'}\\""

Prints each command's median generated tokens/s and seconds and their ratio to the first
command's; the CSV has one line per decode (label, round, order in the round, seconds, tokens/s).
Timings are not tests: this script asserts nothing.
"""

import argparse
import csv
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Tuple

from fairseq_sparse.evaluate import decode_seconds, decode_tokens_per_second

FIELDS = ["label", "round", "order", "seconds", "tokens_per_second"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", nargs=2, action="append", required=True, metavar=("LABEL", "ARGS"),
                        help="a label and the fairseq-generate arguments (one shell-quoted string); "
                             "give two or more, the first is the reference of the printed ratios")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every command (default 3)")
    parser.add_argument("--out", type=Path, required=True, help="CSV: one line per decode")
    parser.add_argument("--generate", default=str(Path(sys.executable).parent / "fairseq-generate"),
                        help="the fairseq-generate executable (default: the one beside this Python)")
    return parser


def rotation(labels: List[str], rounds: int) -> List[List[str]]:
    """The order of each round: shifted by one every round, so no command always runs first."""
    return [labels[r % len(labels):] + labels[:r % len(labels)] for r in range(rounds)]


def decode_speeds(csv_path: Path, field: str) -> Dict[str, float]:
    """{label: median ``field`` (seconds, tokens_per_second) over the rounds} of this command's CSV."""
    with open(csv_path, encoding="utf-8") as f:
        lines = list(csv.DictReader(f))
    labels = dict.fromkeys(line["label"] for line in lines)
    return {label: statistics.median(float(x[field]) for x in lines if x["label"] == label) for label in labels}


def decode_once(generate: str, args: str, log: Path) -> Tuple[float, float]:
    """(seconds, generated tokens/s) fairseq-generate reports for one decode; its output goes to ``log``."""
    with open(log, "w", encoding="utf-8") as out:
        status = subprocess.run([generate, *shlex.split(args)], stdout=out, stderr=subprocess.STDOUT).returncode
    if status != 0:
        tail = "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:])
        raise SystemExit(f"fairseq-generate failed (exit status {status}): {generate} {args}\n{tail}")
    return decode_seconds(log), decode_tokens_per_second(log)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    runs = dict(args.run)
    if len(runs) < 2 or len(runs) != len(args.run):
        raise SystemExit("--run: give two or more commands with distinct labels")
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be at least 1, got {args.rounds}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    partial = args.out.with_name(args.out.name + ".partial")  # the CSV appears only once every round ran
    with tempfile.TemporaryDirectory() as tmp, open(partial, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        for round_, order in enumerate(rotation(list(runs), args.rounds), 1):
            for position, label in enumerate(order, 1):
                seconds, speed = decode_once(args.generate, runs[label], Path(tmp) / "generate.txt")
                writer.writerow({"label": label, "round": round_, "order": position, "seconds": seconds,
                                 "tokens_per_second": speed})
                print(f"round {round_}/{args.rounds}: {label} {speed:.1f} tokens/s ({seconds:.1f}s)", flush=True)
    partial.replace(args.out)
    seconds, speeds = (decode_speeds(args.out, field) for field in ("seconds", "tokens_per_second"))
    reference = args.run[0][0]
    for label in runs:
        print(f"{label}: median {speeds[label]:.1f} tokens/s, {seconds[label]:.2f}s; vs {reference}: "
              f"{speeds[label] / speeds[reference]:.3f}x tokens/s, {seconds[reference] / seconds[label]:.3f}x time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
