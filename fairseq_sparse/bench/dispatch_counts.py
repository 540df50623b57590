#!/usr/bin/env python
"""Dispatched operations and host synchronisations of one training step and one decoding step, per
attention function, counted on the CPU.

A ``TorchDispatchMode`` sees every aten operation a step dispatches (forward and backward). Some
of them make the host wait for the device on a GPU: reading a value (``.item()``, ``bool(t)``,
``int(t)``, ``torch.equal``), and operations whose output size depends on values (``nonzero``,
boolean indexing, ``masked_select``, ``unique``). The same Python runs on every device, so counting
them on the CPU counts the stalls a GPU step would have; and a decoding step at sentence length is
launch-bound on a GPU, so its number of operations is its cost there.

    TRITON_INTERPRET=1 python -m fairseq_sparse.bench.dispatch_counts     # every registered function
    TRITON_INTERPRET=1 python -m fairseq_sparse.bench.dispatch_counts --functions softmax topk hard --where

(TRITON_INTERPRET=1: the Triton kernels a GPU launches are launched, and counted, through Triton's interpreter;
their bodies are skipped, which changes no count, unless --run-kernels.)

Rows: a training step (forward + backward of a small transformer_sparse model on a batch of
sentences, and at --long tokens), and one incremental decoding step (batch x beam hypotheses, with
the cache reordered as beam search does) of the model in eval mode. ``--where`` prints the source
line of each synchronisation. Measurements are not tests; tests/bench/test_dispatch_counts.py
holds the criteria.
"""

import argparse
import contextlib
import sys
import traceback
from collections import Counter
from typing import Callable, Dict, List, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fairseq_sparse.bench.common import (L0DROP, build_row, long_batch, make_batch, random_sentences,
                                         synthetic_dictionary)
from fairseq_sparse.core.attention import DEFAULT_K, attention_names
from fairseq_sparse.core.kernels import device as kernel_device
from fairseq_sparse.core.modules import function_in_chunks, gathered_attention

aten = torch.ops.aten

# Operations that wait for the device: they return a value to the host, or their output's size
# depends on the values of their input.
SYNCHRONISING = {
    aten._local_scalar_dense.default,  # .item(), bool(t), int(t), float(t), .tolist()
    aten.is_nonzero.default,
    aten.equal.default,
    aten.nonzero.default,
    aten.masked_select.default,
    aten.unique_consecutive.default,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.repeat_interleave.Tensor,
    aten.allclose.default,
}


def _indexes_with_booleans(func, args) -> bool:
    """Boolean-mask indexing (``x[mask]``, ``x[mask] = y``) finds its positions with a nonzero."""
    if func not in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default):
        return False
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices)


class DispatchCounter(TorchDispatchMode):
    """Counts the operations dispatched while active, and those that synchronise with the device.

    ``where`` records the innermost frame of this package (or the caller's) for each synchronisation.
    """

    def __init__(self, where: bool = False):
        super().__init__()
        self.operations = 0
        self.synchronisations: List[str] = []
        self.by_operation: Counter = Counter()
        self.where = where

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.operations += 1
        self.by_operation[str(func.overloadpacket)] += 1
        if func in SYNCHRONISING or _indexes_with_booleans(func, args):
            self.synchronisations.append(f"{func}" + (f" at {_caller()}" if self.where else ""))
        return func(*args, **(kwargs or {}))


def _caller() -> str:
    """The innermost frame outside torch and this module: where the synchronising call was written."""
    frames = [f for f in traceback.extract_stack()[:-3] if "/torch/" not in f.filename and "dispatch_counts" not in f.filename]
    return f"{frames[-1].filename.split('site-packages/')[-1]}:{frames[-1].lineno}" if frames else "?"


def count(step: Callable[[], None], where: bool = False) -> DispatchCounter:
    """The counts of one call of ``step``."""
    counter = DispatchCounter(where)
    with counter:
        step()
    return counter


# --- the steps --------------------------------------------------------------------------------

ARCH = "transformer_sparse_mini"


DICTIONARY = synthetic_dictionary(1000)


def row_model(row: str, k: int, batch: Dict[str, torch.Tensor]):
    """The benchmarks' model of ``row`` (``bench.common.build_row``: its paper's placement; ``l0drop``:
    softmax with L0Drop gates pruning about half of ``batch``'s encodings)."""
    return build_row(row, ARCH, DICTIONARY, seed=1, device="cpu", k=k, batch=batch, pruned=0.45)[0]


def sentence_batch(count: int, max_len: int, seed: int = 1) -> Dict[str, torch.Tensor]:
    sentences = random_sentences(DICTIONARY, 2 * count, max_len, seed)
    return make_batch(sentences[:count], sentences[count:], DICTIONARY, "cpu")[0]


def one_sequence(length: int) -> Dict[str, torch.Tensor]:
    return long_batch(DICTIONARY, 1, length, seed=1, device="cpu")[0]


def training_step(model, batch) -> Callable[[], None]:
    def step():
        model.train()
        logits, _ = model(**batch)
        logits.float().logsumexp(-1).sum().backward()
        model.zero_grad(set_to_none=True)
    return step


def decoding_step(model, batch, prefix: int = 3, beam: int = 2) -> Callable[[], None]:
    """One incremental step after ``prefix`` steps, with the cache reordered first, as beam search does."""
    model.eval()
    rows = torch.arange(batch["src_tokens"].size(0)).repeat_interleave(beam)
    src_tokens, src_lengths = batch["src_tokens"][rows], batch["src_lengths"][rows]
    tokens = batch["prev_output_tokens"][rows]
    with torch.no_grad():
        encoder_out = model.encoder(src_tokens, src_lengths=src_lengths)
        state: dict = {}
        for t in range(prefix):
            model.decoder(tokens[:, : t + 1], encoder_out=encoder_out, incremental_state=state)
    order = torch.arange(rows.numel()).view(-1, beam).flip(-1).reshape(-1)  # a reorder within sentences
    snapshot = {key: dict(value) for key, value in state.items()}

    def step():
        with torch.no_grad():
            state.clear()
            state.update({key: dict(value) for key, value in snapshot.items()})
            model.decoder.reorder_incremental_state_scripting(state, order)
            model.decoder(tokens[:, : prefix + 1], encoder_out=encoder_out, incremental_state=state)
    return step


def steady(step: Callable[[], None], where: bool = False) -> DispatchCounter:
    """The counts of a step's second call (the first one fills caches: masks, remembered answers)."""
    step()
    return count(step, where)


# The pointers the plugin's kernels write through (core/kernels: outputs, gradients, top-k's per-query rows, the
# dropout mask drawn for tests).
KERNEL_OUTPUTS = frozenset({"out_ptr", "dq_ptr", "dk_ptr", "dv_ptr", "kth_ptr", "lse_ptr", "keep_ptr"})


@contextlib.contextmanager
def kernel_bodies_skipped():
    """Launch the interpreted Triton kernels without running their bodies, which write zeros instead. The dispatcher
    sees a kernel as the one custom operation that launches it (``fairseq_sparse.rectified_attention``), whatever
    the body computes, so the counts are those of running it (``tests/bench/test_dispatch_counts.py`` checks),
    and a 512-token step of interpreted kernels takes minutes. Zeros rather than ``torch.empty``'s contents: the
    eager functions downstream (entmax's sort) fail on NaN."""
    from triton.runtime.interpreter import InterpretedFunction

    def launch_writing_zeros(self, *args, grid, warmup, **kwargs):
        for name, arg in zip(self.arg_names, args):
            if name in KERNEL_OUTPUTS and isinstance(arg, torch.Tensor):
                arg.data.zero_()  # inside the launching custom operation: the counter does not see it

    run = InterpretedFunction.run
    InterpretedFunction.run = launch_writing_zeros
    try:
        yield
    finally:
        InterpretedFunction.run = run


@contextlib.contextmanager
def gpu_route(run_kernels: bool = False):
    """Take, on the CPU, the route a GPU takes: fixed-size gathered slots, the Triton kernels (interpreted; their
    bodies run only with ``run_kernels``), and the query chunks a CUDA device's budgets cut (larger than the CPU's,
    so fewer chunks); all restored after."""
    saved = (gathered_attention.host_reads_values, gathered_attention.chunk_elements, kernel_device.INTERPRETED_ON_CPU,
             function_in_chunks.FUNCTION_CHUNK_ELEMENTS)
    gathered_attention.host_reads_values = lambda device: False
    gathered_attention.chunk_elements = lambda device: gathered_attention.GATHER_CHUNK_ELEMENTS["cuda"]
    function_in_chunks.FUNCTION_CHUNK_ELEMENTS = {**saved[3], "cpu": saved[3]["cuda"]}
    kernel_device.run_on_cpu(True)
    if not kernel_device.INTERPRETED_ON_CPU:
        print("note: the Triton kernels are counted as their eager twins (Triton missing, or TRITON_INTERPRET=1 "
              "not set before the plugin was imported)", file=sys.stderr)
    try:
        with contextlib.nullcontext() if run_kernels or not kernel_device.INTERPRETED_ON_CPU else kernel_bodies_skipped():
            yield
    finally:
        (gathered_attention.host_reads_values, gathered_attention.chunk_elements, kernel_device.INTERPRETED_ON_CPU,
         function_in_chunks.FUNCTION_CHUNK_ELEMENTS) = saved


def count_rows(row: str, k: int = DEFAULT_K, long: int = 512, where: bool = False) -> Dict[str, DispatchCounter]:
    """Steady-state counts of ``row``'s training step (sentences; one sequence of ``long`` tokens) and decoding step."""
    sentences = sentence_batch(8, 24)
    model = row_model(row, k, sentences)
    return {
        "train": steady(training_step(model, sentences), where),
        f"train {long}": steady(training_step(model, one_sequence(long)), where),
        "decode": steady(decoding_step(model, sentence_batch(8, 24, seed=2)), where),
    }


def main(argv: Optional[List[str]] = None) -> Dict[str, Dict[str, DispatchCounter]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--functions", nargs="+", default=attention_names() + [L0DROP],
                        help=f"attention functions, and '{L0DROP}' (softmax with L0Drop's compressed memory); default: all")
    parser.add_argument("--k", type=int, default=DEFAULT_K)
    parser.add_argument("--long", type=int, default=512, help="tokens of the long training step's one sequence")
    parser.add_argument("--where", action="store_true", help="print where each synchronisation happens")
    parser.add_argument("--cpu-route", action="store_true",
                        help="count the CPU's own route (the gathered path sizes its slots from values read on the host, "
                             "free on a CPU; eager norms); default: the route a GPU takes (Triton kernels interpreted)")
    parser.add_argument("--run-kernels", action="store_true",
                        help="run the interpreted kernels' bodies too (the same counts, minutes longer at --long 512)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = ["softmax"] + [name for name in dict.fromkeys(args.functions) if name != "softmax"]
    with contextlib.nullcontext() if args.cpu_route else gpu_route(args.run_kernels):
        results = {row: count_rows(row, args.k, args.long, args.where) for row in rows}
    base = results["softmax"]
    print(f"steady-state operations and host synchronisations per step, counted on the CPU along the "
          f"{'CPU' if args.cpu_route else 'GPU'}'s route; {ARCH}, k={args.k}; train: 8 sentence pairs of up to 24 tokens, "
          f"and one pair of {args.long}; decode: 8 sentences x beam 2, step 4")
    print("| row | " + " | ".join(f"{step} ops | ×softmax | syncs" for step in base) + " |")
    print("|---|" + "---:|---:|---:|" * len(base))
    for name, counts in results.items():
        cells = [f"{c.operations} | {c.operations / base[step].operations:.2f} | {len(c.synchronisations)}"
                 for step, c in counts.items()]
        print(f"| {name} | " + " | ".join(cells) + " |")
    if args.where:
        for name, counts in results.items():
            for step, counter in counts.items():
                for place, times in Counter(counter.synchronisations).items():
                    print(f"{name} / {step}: {times} x {place}")
    return results


if __name__ == "__main__":
    main()
