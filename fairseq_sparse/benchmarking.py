"""Shared pieces of the benchmark scripts: batches, interleaved timing, forced-length decoding.

Timings are never asserted in tests; these helpers only measure.
"""

import argparse
import statistics
import time
from typing import Callable, Dict, List, Sequence

import torch
from fairseq.data import Dictionary
from fairseq.data.data_utils import collate_tokens
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
from fairseq.sequence_generator import SequenceGenerator


class DictionaryTask:
    """The two attributes ``build_model`` reads from a fairseq task."""

    def __init__(self, dictionary: Dictionary):
        self.source_dictionary = self.target_dictionary = dictionary


def synthetic_dictionary(size: int) -> Dictionary:
    dictionary = Dictionary()
    for i in range(size):
        dictionary.add_symbol(f"w{i}")
    return dictionary


def random_sentences(dictionary: Dictionary, count: int, max_len: int, seed: int) -> List[torch.Tensor]:
    """Token sequences ending in EOS, lengths uniform in [max_len / 2, max_len]."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(2, max_len // 2), max_len + 1, (count,), generator=gen).tolist()
    return [torch.cat([torch.randint(dictionary.nspecial, len(dictionary), (n - 1,), generator=gen),
                       torch.tensor([dictionary.eos()])]) for n in lengths]


def make_batch(sources: Sequence[torch.Tensor], targets: Sequence[torch.Tensor], dictionary: Dictionary, device: str):
    """fairseq's layout: left-padded sources, right-padded targets, EOS moved to the front for teacher forcing."""
    pad, eos = dictionary.pad(), dictionary.eos()
    batch = {
        "src_tokens": collate_tokens(list(sources), pad, eos, left_pad=True),
        "src_lengths": torch.tensor([len(s) for s in sources]),
        "prev_output_tokens": collate_tokens(list(targets), pad, eos, left_pad=False, move_eos_to_beginning=True),
    }
    target = collate_tokens(list(targets), pad, eos, left_pad=False)
    return {k: v.to(device) for k, v in batch.items()}, target.to(device)


def build(arch: str, dictionary: Dictionary, seed: int, device: str, **options):
    args = argparse.Namespace(dropout=0.1, attention_dropout=0.1, share_all_embeddings=True, **options)
    ARCH_CONFIG_REGISTRY[arch](args)
    torch.manual_seed(seed)
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, DictionaryTask(dictionary)).to(device)
    for layer in model.decoder.layers:
        layer.need_attn = False  # as fairseq-generate: weights only for the alignment layer
    return model


def forced_length_decoder(model, dictionary: Dictionary, beam: int, steps: int) -> Callable[[Dict], None]:
    """Beam search with min_len = max_len, so every model decodes the same number of steps."""
    generator = SequenceGenerator([model], dictionary, beam_size=beam, max_len_a=0, max_len_b=steps, min_len=steps)

    def decode(batch: Dict[str, torch.Tensor]) -> None:
        model.eval()
        with torch.no_grad():
            generator.generate([model], {"net_input": {k: batch[k] for k in ("src_tokens", "src_lengths")}})

    return decode


def timed(fn: Callable[[], None], device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def interleaved_medians(jobs: Dict[str, Callable[[], None]], repeats: int, device: str, log=print) -> Dict[str, float]:
    """One untimed warm-up each, then ``repeats`` rounds over all jobs in turn; median seconds per job.

    The order rotates every round, so no job always runs first (after the previous round's last).
    """
    for job in jobs.values():
        job()
    names = list(jobs)
    times: Dict[str, List[float]] = {name: [] for name in jobs}
    for rep in range(repeats):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(timed(jobs[name], device))
        log(f"repetition {rep + 1}/{repeats} done")
    return {name: statistics.median(values) for name, values in times.items()}
