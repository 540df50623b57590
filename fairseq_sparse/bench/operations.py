#!/usr/bin/env python
"""Per-operation cost of standard vs hard retrieval attention (Hard Retrieval paper, Table 2).

Times 1000 iterations of each step of one decoding step's attention, on the same
tensors, interleaved and rotated (median of --repeats), and prints them beside the
paper's seconds (GPU):

    standard: compare (q K^T, eq. 1) -> normalise (softmax, eq. 2) -> attend (P V, eq. 3)
    hard:     compare (q K^T, eq. 1) -> argmax (eq. 11)             -> index (V[i], eq. 6)

The normalise/argmax and attend/index steps run the registered functions' own code
(``masked_softmax``, ``retrieve_rows``), so the numbers describe this plugin.

    python -m fairseq_sparse.bench.operations [--hypotheses 128 --heads 8 --keys 30 --head-dim 64] [--device cuda]
"""

import argparse

import torch

from fairseq_sparse.core.attention.functions import masked_softmax
from fairseq_sparse.core.attention.hard_retrieval import retrieve_rows
from fairseq_sparse.bench.common import interleaved_medians

PAPER_SECONDS = {"compare": (14.40, 14.40), "normalise / argmax": (6.22, 2.10), "attend / index": (12.26, 2.93)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hypotheses", type=int, default=128, help="batch x beam rows of one decoding step")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--keys", type=int, default=30, help="source (or target prefix) length")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device")

    gen = torch.Generator().manual_seed(0)
    shape = (args.hypotheses, args.heads)
    q = torch.randn(*shape, 1, args.head_dim, generator=gen).to(args.device)
    k = torch.randn(*shape, args.keys, args.head_dim, generator=gen).to(args.device)
    v = torch.randn(*shape, args.keys, args.head_dim, generator=gen).to(args.device)
    scores = q @ k.transpose(-1, -2)
    probs = masked_softmax(scores, None)
    index = scores.argmax(dim=-1)

    def repeat(fn):
        def job():
            with torch.no_grad():
                for _ in range(args.iterations):
                    fn()
        return job

    seconds = interleaved_medians({
        "compare": repeat(lambda: torch.matmul(q, k.transpose(-1, -2))),
        "normalise": repeat(lambda: masked_softmax(scores, None)),
        "argmax": repeat(lambda: scores.argmax(dim=-1)),
        "attend": repeat(lambda: torch.matmul(probs, v)),
        "index": repeat(lambda: retrieve_rows(v, index)),
    }, args.repeats, args.device, log=lambda _: None)

    rows = [("compare", seconds["compare"], seconds["compare"]),
            ("normalise / argmax", seconds["normalise"], seconds["argmax"]),
            ("attend / index", seconds["attend"], seconds["index"])]
    print(f"\nseconds per {args.iterations} iterations; {args.hypotheses} hypotheses x {args.heads} heads, "
          f"{args.keys} keys, d_h {args.head_dim}, {args.device}, torch threads {torch.get_num_threads()}")
    print("| operation | standard | hard | paper standard | paper hard |")
    print("|---|---:|---:|---:|---:|")
    for name, std, hard in rows:
        paper_std, paper_hard = PAPER_SECONDS[name]
        print(f"| {name} | {std:.3f} | {hard:.3f} | {paper_std:.2f} | {paper_hard:.2f} |")
    total_std, total_hard = sum(r[1] for r in rows), sum(r[2] for r in rows)
    print(f"| total | {total_std:.3f} | {total_hard:.3f} | 32.88 | 19.43 |")
    print(f"\nhard / standard time: {total_hard / total_std:.2f} (paper: {19.43 / 32.88:.2f})")


if __name__ == "__main__":
    main()
