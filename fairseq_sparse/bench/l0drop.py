#!/usr/bin/env python
"""Decode throughput of L0Drop: compressed vs uncompressed memory vs a softmax baseline, as ratios.

For subword-like and character-like inputs (different vocabulary and sentence
lengths), one run builds a softmax Transformer and the same model with L0Drop gates
(identical shared weights), sets the gates so that ``--pruned`` of the source
encodings are pruned (by a quantile of log alpha over the batch: the same share
a trained model would reach, without training one), and times forced-length beam
search (min_len = max_len) of the three, interleaved, median of ``--repeats``.
(``fairseq_sparse.bench.run`` has the compressed model as its ``l0drop`` row, against every
attention function.)

    python -m fairseq_sparse.bench.l0drop                       # CPU, both levels, 45% pruned
    python -m fairseq_sparse.bench.l0drop --device cuda --batch-size 32 --arch transformer_sparse

Timings are not tests: this script asserts nothing.
"""

import argparse
import logging
import sys

import torch

import fairseq_sparse  # noqa: F401
from fairseq_sparse.bench.common import (build, forced_length_decoder, interleaved_medians, make_batch, prune_fraction,
                                         random_sentences, synthetic_dictionary)

logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO, stream=sys.stdout, force=True)
logger = logging.getLogger("fairseq_sparse.bench.l0drop")

# vocabulary size, max source length, decoding steps
LEVELS = {"subword": (8000, 32, 30), "char": (300, 160, 150)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", nargs="+", choices=sorted(LEVELS), default=["subword", "char"])
    parser.add_argument("--pruned", "--sparsity", type=float, default=0.45, help="fraction of source encodings pruned")
    parser.add_argument("--arch", default="transformer_sparse_iwslt_de_en")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--decode-len", type=int, help="decoding steps (default: the level's: subword 30, char 150)")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    rows = []
    for level in args.levels:
        vocab, src_len, steps = LEVELS[level]
        steps = args.decode_len or steps
        dictionary = synthetic_dictionary(vocab)
        sources = random_sentences(dictionary, args.batch_size, src_len, args.seed)
        batch, _ = make_batch(sources, sources, dictionary, args.device)
        baseline = build(args.arch, dictionary, args.seed, args.device)
        gated = build(args.arch, dictionary, args.seed, args.device, l0drop=True)
        achieved = prune_fraction(gated, batch, args.pruned, args.seed)
        decode_baseline = forced_length_decoder(baseline, dictionary, args.beam, steps)
        decode_gated = forced_length_decoder(gated, dictionary, args.beam, steps)

        def with_compression(compress):
            def job():
                gated.encoder.compress = compress
                decode_gated(batch)
            return job

        logger.info(f"{level}: {len(sources)} sentences of {src_len // 2}-{src_len} tokens, {steps} steps, "
                    f"pruned {achieved:.1%}")
        seconds = interleaved_medians(
            {"baseline": lambda: decode_baseline(batch), "uncompressed": with_compression(False), "compressed": with_compression(True)},
            args.repeats, args.device, log=logger.info,
        )
        rows.append((level, achieved, seconds, len(sources)))

    print("\n| input | pruned | baseline sent/s | uncompressed / baseline | compressed / baseline | compressed / uncompressed |")
    print("|---|---:|---:|---:|---:|---:|")
    for level, achieved, s, n in rows:
        print(f"| {level} | {achieved:.1%} | {n / s['baseline']:.2f} | {s['baseline'] / s['uncompressed']:.2f}x | "
              f"{s['baseline'] / s['compressed']:.2f}x | {s['uncompressed'] / s['compressed']:.2f}x |")
    print(f"\n{args.arch}, beam {args.beam}, forced-length decoding, median of {args.repeats} interleaved repetitions; "
          "ratio = reference time / time (>1 is faster)")


if __name__ == "__main__":
    main()
