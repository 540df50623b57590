#!/usr/bin/env python
"""Train-step and beam-search decode throughput of each attention function and of L0Drop, as ratios to stock fairseq and to softmax.

One run builds one model per row, all with the same architecture and seed, and times
three jobs per row on the same sentences:

* train: one training step (forward + backward + Adam step) on the large batch;
  throughput in target tokens per second;
* decode, batch 1: beam search over ``--single-sentences`` sentences, one at a time;
* decode, large batch: beam search over ``--batch-size`` sentences in one batch;
* with ``--long-lengths L ...``: one training step on ``--long-batch-size`` random
  sequences of exactly L source and L target tokens (document-level lengths), per L.

Decoding is forced to ``--decode-len`` steps (min_len = max_len), so an untrained model's
early EOS cannot shorten the work and every row decodes the same number of steps. The
measurements run one after the other (decode batch 1, decode large batch, train, then
the long train steps), and within each the rows are interleaved: one untimed warm-up each, then ``--repeats``
rounds whose order rotates every round; the median time is reported. Machine noise thus
hits every row alike, and each ratio (reference time / row time; > 1 is faster than the
reference) compares times measured in the same run. Every row is reported against two
references: ``fairseq`` and ``softmax``. (The kinds are not mixed in one round
because the job after a train step runs slower, its large allocations just freed: with
all jobs in one rotated cycle, one row's decode would always follow a train step.)

Rows: ``fairseq`` is stock fairseq's own ``transformer`` model of the same sizes (e.g.
transformer_iwslt_de_en for transformer_sparse_iwslt_de_en), with stock
``MultiheadAttention`` (which takes PyTorch's fused ``F.multi_head_attention_forward`` path
whenever it has no incremental state) and the weights of the ``softmax`` row. Both are
always measured. Before the timings the script prints whether the two give the same
outputs: the max abs difference of their logits on the large batch (eval mode) and whether
their beam hypotheses are identical. Attention functions run where their paper puts them
(hard retrieval: decoder self- and cross-attention; self-attention-only patterns: encoder
and decoder self-attention; everything else: all three sublayers). The ``l0drop`` row is the softmax model with
L0Drop gates whose bias is set so that ``--pruned`` of the large batch's source
encodings are pruned; it decodes from the compressed memory (Algorithm 1). Its train
row samples the gates (the fraction pruned in training is whatever the sampled gates
give) and adds the expected-L0 penalty; its decode jobs run on an untrained copy, so the
pruned fraction stays the one set.

    python -m fairseq_sparse.bench.run                                     # CPU, default rows
    python -m fairseq_sparse.bench.run --device cuda --arch transformer_sparse --batch-size 128
    python -m fairseq_sparse.bench.run --data data/iwslt14.de-en/bin --functions softmax topk hard
    python -m fairseq_sparse.bench.run --csv speed.csv
    python -m fairseq_sparse.bench.run --device cuda --long-lengths 512 1024

Timings are not tests: this script asserts nothing. What it times is ``run_jobs`` (the long train
steps: ``long_lengths``), what it prints and writes ``run_report``; this module reads the options and
the sentences and runs them in order.
"""

import argparse
import logging
import sys
import warnings
from typing import Dict, List, Optional, Tuple

import torch
from fairseq.data import Dictionary

import fairseq_sparse  # noqa: F401
from fairseq_sparse.core.attention import DEFAULT_K, attention_names
from fairseq_sparse.bench.common import (FAIRSEQ, L0DROP, stock_architectures, add_attn_impl_option, add_dtype_option,
                                         compare_models, load_binarised_pairs, make_batch, random_sentences, resolve_dtype,
                                         synthetic_dictionary)
from fairseq_sparse.bench.long_lengths import long_job
from fairseq_sparse.bench.run_jobs import JOBS, REFERENCES, Batch, build_models, measure, throughput, timed_jobs
from fairseq_sparse.bench.run_report import describe, format_equivalence, format_report, write_csv
from fairseq_sparse.core.modules.gathered_attention import GATHER_CHUNK_ELEMENTS

logger = logging.getLogger("fairseq_sparse.bench.run")

# Every registered function that is not a structured pattern (structured.py) or one of
# ReLA's Table 1 ablations 8-10 (rela_g_layernorm, rela_g_gelu, rela_g_leaky_relu; pass
# them, or any registered name, with --functions), then the L0Drop row. The fairseq and
# softmax rows are always measured: they are the references.
DEFAULT_FUNCTIONS = ["softmax", "topk", "hard", "rela_g", "rela_i", "relu", "relu_rmsnorm",
                     "sparsemax", "entmax15", "entmax_alpha", L0DROP]

# Stock fairseq's decoder self-attention passes a float causal mask with a bool padding mask
# to F.multi_head_attention_forward, which warns once about the mixed types; the warning
# says nothing about the benchmark.
warnings.filterwarnings("ignore", message="Support for mismatched key_padding_mask and attn_mask is deprecated")


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--functions", nargs="+", default=DEFAULT_FUNCTIONS,
                        help=f"rows: registered attention functions and/or '{L0DROP}' (default: %(default)s); "
                             f"'{FAIRSEQ}' (stock fairseq) and softmax are always measured, as the references")
    parser.add_argument("--arch", default="transformer_sparse_iwslt_de_en",
                        help=f"a transformer_sparse architecture with a stock fairseq counterpart: "
                             f"{', '.join(sorted(stock_architectures()))} (default: %(default)s)")
    parser.add_argument("--k", type=int, default=DEFAULT_K, help="k for functions that take it")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    add_dtype_option(parser)
    add_attn_impl_option(parser)
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--gather-chunk-elements", type=int, metavar="N",
                        help="the gathered path's chunk budget on --device, in float32 entries (top-k and the "
                             "patterns at length; default: gathered_attention.GATHER_CHUNK_ELEMENTS)")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences of the large batch (train and decode)")
    parser.add_argument("--single-sentences", type=int, default=4,
                        help="sentences decoded one at a time for the batch-1 job (the first of the large batch)")
    parser.add_argument("--src-len", type=int, default=30, help="max length of random sentences (min is half)")
    parser.add_argument("--decode-len", type=int, default=30, help="decoding steps (min_len = max_len)")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repetitions; the median is reported")
    parser.add_argument("--pruned", "--sparsity", type=float, default=0.45, help="fraction of source encodings the l0drop row prunes")
    parser.add_argument("--skip-train", action="store_true", help="time decoding only (the long train steps too are skipped)")
    parser.add_argument("--skip-decode", action="store_true",
                        help="time train steps only (the GPU report times training and decoding of different rows)")
    parser.add_argument("--long-lengths", nargs="*", type=int, default=[], metavar="L",
                        help="also time a train step on --long-batch-size random sequences of exactly L source and "
                             "L target tokens, per L (e.g. 512 1024; default: none)")
    parser.add_argument("--long-batch-size", type=int, default=2, help="sequences in each long train batch")
    parser.add_argument("--data", help="binarised fairseq data dir with a joined dictionary (default: random tokens)")
    parser.add_argument("--pair", default="de-en", help="language pair of --data")
    parser.add_argument("--split", default="test")
    parser.add_argument("--vocab", type=int, default=8000, help="vocabulary size of random data")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--csv", metavar="FILE", help="also write one row per function to this CSV file")
    args = parser.parse_args(argv)
    for name in args.functions:
        if name not in (L0DROP, FAIRSEQ) and name not in attention_names():
            parser.error(f"unknown row {name!r}; valid choices: {FAIRSEQ}, {L0DROP}, {', '.join(attention_names())}")
    if args.arch not in stock_architectures():
        parser.error(f"--arch {args.arch}: no stock fairseq counterpart is known; choose one of "
                     f"{', '.join(sorted(stock_architectures()))}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device")
    if args.single_sentences < 1 or args.batch_size < 1 or args.repeats < 1 or args.long_batch_size < 1:
        parser.error("--batch-size, --single-sentences, --long-batch-size and --repeats must be positive")
    if args.skip_train and args.skip_decode:
        parser.error("--skip-train and --skip-decode: nothing left to time")
    if any(length < 2 for length in args.long_lengths):
        parser.error("--long-lengths: every length must be at least 2 (EOS included)")
    args.long_lengths = list(dict.fromkeys(args.long_lengths))
    resolve_dtype(args)
    return args


def load_sentences(args: argparse.Namespace, dictionary: Dictionary) -> Tuple[List, List]:
    count = max(args.batch_size, args.single_sentences)
    if not args.data:
        sources = random_sentences(dictionary, count, args.src_len, args.seed)
        return sources, sources
    pairs = load_binarised_pairs(args.data, args.pair, args.split, count, dictionary)
    if pairs is None:
        sys.exit(f"python -m fairseq_sparse.bench.run: error: no binarised {args.split}.{args.pair} split in {args.data}")
    return pairs


def batches(args: argparse.Namespace) -> Tuple[Dictionary, Batch, torch.Tensor, List[Batch]]:
    """The dictionary, the large batch and its target, and the sentences decoded one at a time."""
    dictionary = Dictionary.load(f"{args.data}/dict.{args.pair.split('-')[0]}.txt") if args.data else synthetic_dictionary(args.vocab)
    sources, targets = load_sentences(args, dictionary)
    large, target = make_batch(sources[:args.batch_size], targets[:args.batch_size], dictionary, args.device)
    singles = [make_batch([s], [s], dictionary, args.device)[0] for s in sources[:args.single_sentences]]
    pad = dictionary.pad()
    logger.info(f"{args.arch}, large batch {len(large['src_tokens'])} sentences ({int(large['src_tokens'].ne(pad).sum())} "
                f"source / {int(target.ne(pad).sum())} target tokens), {len(singles)} sentences at batch 1, "
                f"{args.decode_len} forced steps, beam {args.beam}, device {args.device}, {args.dtype}, --attn-impl "
                f"{args.attn_impl}, torch threads "
                f"{torch.get_num_threads()}, {'data ' + args.data if args.data else 'random tokens'}")
    return dictionary, large, target, singles


def main(argv: Optional[List[str]] = None) -> Dict[str, Dict[str, float]]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.gather_chunk_elements:
        GATHER_CHUNK_ELEMENTS[torch.device(args.device).type] = args.gather_chunk_elements
    rows = list(REFERENCES) + [fn for fn in dict.fromkeys(args.functions) if fn not in REFERENCES]
    dictionary, large, target, singles = batches(args)
    models = build_models(rows, args, dictionary, large)
    if models.achieved is not None:
        logger.info(f"{L0DROP}: {models.achieved:.1%} of the large batch's source encodings pruned")
    equivalence = compare_models(models.train["softmax"], models.train[FAIRSEQ], large, dictionary, args.beam,
                                 args.decode_len)
    print(format_equivalence(equivalence, args, len(large["src_tokens"])), flush=True)
    jobs, units = timed_jobs(models, args, dictionary, large, target, singles)
    seconds = measure(jobs, rows, args.repeats, args.device)
    columns = list(JOBS) + [long_job(length) for length in args.long_lengths]
    results = throughput({row: describe(row, models.achieved, args.arch) for row in rows}, seconds, units, columns)
    print(format_report(results, args, models.achieved, units))
    if args.csv:
        write_csv(args.csv, results, args, columns, equivalence)
    return results


if __name__ == "__main__":
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO,
                        stream=sys.stdout, force=True)
    main()
