"""Shared pieces of the benchmarks in ``benchmarks/``: batches, models, interleaved timing,
forced-length decoding, L0Drop gates set to a chosen sparsity.

Timings are never asserted in tests; these helpers only measure.
"""

import argparse
import gc
import math
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from fairseq.data import Dictionary, data_utils
from fairseq.data.data_utils import collate_tokens
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
from fairseq.sequence_generator import SequenceGenerator

from .modules.l0drop import GAMMA, ZETA

# Where each method runs: its paper's placement (hard retrieval: decoder self + cross).
PLACEMENT = {"hard": ("decoder", "cross")}
ALL_SUBLAYERS = ("encoder", "decoder", "cross")
# The benchmark row of the softmax model with L0Drop gates, decoded from the compressed memory.
L0DROP = "l0drop"


def placement(fn: str, self_only: bool) -> Tuple[str, ...]:
    """Sublayers ``fn`` runs in: its paper's placement, never cross-attention for a self-attention-only pattern."""
    sublayers = PLACEMENT.get(fn, ALL_SUBLAYERS)
    return tuple(s for s in sublayers if not (self_only and s == "cross"))


def row_sublayers(row: str) -> Tuple[str, ...]:
    """Sublayers a benchmark row runs its attention function in (the ``l0drop`` row: softmax everywhere)."""
    from .attention import get_attention

    if row == L0DROP:
        return ALL_SUBLAYERS
    return placement(row, get_attention(row).self_attention_only)


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


def load_binarised_pairs(data: str, pair: str, split: str, count: int,
                         dictionary: Dictionary) -> Optional[Tuple[List[torch.Tensor], List[torch.Tensor]]]:
    """The first ``count`` sentence pairs of a binarised fairseq split, or None if it is missing."""
    src, tgt = pair.split("-")
    src_data = data_utils.load_indexed_dataset(f"{data}/{split}.{pair}.{src}", dictionary)
    tgt_data = data_utils.load_indexed_dataset(f"{data}/{split}.{pair}.{tgt}", dictionary)
    if src_data is None or tgt_data is None:
        return None
    count = min(len(src_data), count)
    return [src_data[i] for i in range(count)], [tgt_data[i] for i in range(count)]


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


def build_row(row: str, arch: str, dictionary: Dictionary, seed: int, device: str, k: int,
              batch: Dict[str, torch.Tensor], sparsity: float):
    """The model of one benchmark row and, for ``l0drop``, the fraction of ``batch``'s encodings it prunes.

    An attention function runs in ``row_sublayers(row)``; the ``l0drop`` row is the softmax
    model with L0Drop gates set by ``prune_fraction`` (it decodes from the compressed memory).
    """
    if row == L0DROP:
        model = build(arch, dictionary, seed, device, l0drop=True)
        return model, prune_fraction(model, batch, sparsity, seed)
    return build(arch, dictionary, seed, device, attn_k=k, **{f"{s}_attn_fn": row for s in row_sublayers(row)}), None


def forced_length_decoder(model, dictionary: Dictionary, beam: int, steps: int) -> Callable[[Dict], None]:
    """Beam search with min_len = max_len, so every model decodes the same number of steps."""
    generator = SequenceGenerator([model], dictionary, beam_size=beam, max_len_a=0, max_len_b=steps, min_len=steps)

    def decode(batch: Dict[str, torch.Tensor]) -> None:
        model.eval()
        with torch.no_grad():
            generator.generate([model], {"net_input": {k: batch[k] for k in ("src_tokens", "src_lengths")}})

    return decode


def timed(fn: Callable[[], None], device: str) -> float:
    """Seconds ``fn`` takes, with the GPU synchronised at both ends.

    As ``timeit`` does, Python's cyclic garbage collector is off while ``fn`` runs (a
    collection of the other jobs' garbage would be charged to whichever job triggers it);
    it runs, untimed, before.
    """
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start
    finally:
        if gc_was_enabled:
            gc.enable()


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


# g_hat = clamp(sigmoid(a) * (zeta - gamma) + gamma, 0, 1) is 0 exactly when a <= this
CLOSING_LOG_ALPHA = -math.log((ZETA - GAMMA) / -GAMMA - 1)


def prune_fraction(model, batch: Dict[str, torch.Tensor], sparsity: float, seed: int) -> float:
    """Set random L0Drop gate weights and a bias that closes ``sparsity`` of the batch's encodings.

    The bias is a quantile of log alpha over the batch's real tokens: the sparsity a trained
    model would reach, without training one. Returns the fraction actually closed.
    """
    from .models.sparse_transformer import SparseTransformerEncoder

    gate = model.encoder.l0drop_gate.log_alpha
    gen = torch.Generator().manual_seed(seed)
    was_training = model.training
    with torch.no_grad():
        gate.weight.copy_(torch.randn(gate.weight.shape, generator=gen).to(gate.weight.device))
        gate.bias.zero_()
        encoded = SparseTransformerEncoder.forward(model.encoder.eval(), batch["src_tokens"], batch["src_lengths"])
        real = batch["src_tokens"].ne(model.encoder.padding_idx).t()
        scores = gate(encoded["encoder_out"][0]).squeeze(-1)[real]
        gate.bias.fill_(CLOSING_LOG_ALPHA - torch.quantile(scores.float(), sparsity).item())
        closed = model.encoder(batch["src_tokens"], src_lengths=batch["src_lengths"])["l0drop_closed"][0]
    model.train(was_training)
    return closed.sum().item() / real.sum().item()
