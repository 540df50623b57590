"""Shared pieces of the benchmarks in ``fairseq_sparse.bench``: batches, models, interleaved timing,
forced-length decoding, L0Drop gates set to prune a chosen share, and stock fairseq's own
Transformer with a plugin model's weights (the ``fairseq`` reference row).

Timings are never asserted in tests; these helpers only measure.
"""

import argparse
import dataclasses
import functools
import gc
import math
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from fairseq.data import Dictionary, data_utils
from fairseq.data.data_utils import collate_tokens
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
from fairseq.sequence_generator import SequenceGenerator

from fairseq_sparse.core.attention import ATTN_IMPLS, SUBLAYERS, get_attention
from fairseq_sparse.core.models.options import SparseModelOptions
from fairseq_sparse.core.modules.l0drop import GAMMA, ZETA

# The benchmark row of the softmax model with L0Drop gates, decoded from the compressed memory.
L0DROP = "l0drop"
# The benchmark row of stock fairseq's own Transformer (fairseq.models.transformer and
# fairseq.modules.MultiheadAttention), loaded with the weights of the plugin's softmax row.
FAIRSEQ = "fairseq"

# Stock fairseq's counterpart of each plugin architecture: the architecture of fairseq's `transformer`
# model that fills in the most of the same options, and the options that then still differ (the
# plugin's own, --encoder-attn-fn and the like, aside). Derived from both registries, so a new preset
# needs no entry here; build_stock_reference checks that every field of the two models' TransformerConfig
# agrees, so a wrong counterpart fails loudly instead of timing another model.
STOCK_MODEL = "transformer"
PLUGIN_MODEL = "transformer_sparse"
_UNSET = object()  # an option a stock architecture does not set


def _architecture_options(arch: str, plugin_only: frozenset) -> Dict[str, Any]:
    args = argparse.Namespace(**BUILD_PRESETS)   # as ``build`` builds both models
    ARCH_CONFIG_REGISTRY[arch](args)
    return {k: v for k, v in vars(args).items() if k not in plugin_only}


@functools.lru_cache(maxsize=None)
def stock_architectures() -> Dict[str, Tuple[str, Dict[str, Any]]]:
    """{plugin architecture: (stock fairseq architecture, options set on top of it)}."""
    plugin_only = frozenset(f.name for f in dataclasses.fields(SparseModelOptions))
    stock = {a: _architecture_options(a, plugin_only) for a, m in ARCH_MODEL_REGISTRY.items()
             if m is ARCH_MODEL_REGISTRY[STOCK_MODEL]}
    found = {}
    for arch, model in ARCH_MODEL_REGISTRY.items():
        if model is not ARCH_MODEL_REGISTRY[PLUGIN_MODEL]:
            continue
        ours = _architecture_options(arch, plugin_only)
        candidates = []
        for name, theirs in stock.items():
            differing = {k: v for k, v in ours.items() if theirs.get(k, _UNSET) != v}
            # fewest differing options first; among equals the shortest name (transformer, not its aliases)
            candidates.append((len(differing), len(name), name, differing))
        _, _, name, differing = min(candidates, key=lambda c: c[:3])
        found[arch] = (name, differing)
    return found



# --dtype of the benchmarks: the precision models run in (parameters, activations; losses in float32).
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def add_dtype_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dtype", choices=sorted(DTYPES),
                        help="precision of every row's model and inputs (default: bf16 on CUDA, as users train there; "
                             "fp32 on the CPU)")


def add_attn_impl_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--attn-impl", choices=ATTN_IMPLS, default=ATTN_IMPLS[0],
                        help="how the plugin's rows compute attention (the model option --attn-impl; default: %(default)s)")


def resolve_dtype(args: argparse.Namespace) -> torch.dtype:
    """``args.dtype`` filled in with its device's default; the torch dtype."""
    if args.dtype is None:
        args.dtype = "bf16" if str(args.device).startswith("cuda") else "fp32"
    return DTYPES[args.dtype]


def row_sublayers(row: str) -> Tuple[str, ...]:
    """Sublayers a benchmark row runs its attention function in (the ``l0drop`` row: softmax everywhere)."""
    if row == L0DROP:
        return SUBLAYERS
    return get_attention(row).sublayers


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


# set before an architecture fills in its defaults, for the plugin's models and stock fairseq's alike
BUILD_PRESETS = {"dropout": 0.1, "attention_dropout": 0.1, "share_all_embeddings": True}


def build(arch: str, dictionary: Dictionary, seed: int, device: str, **options):
    args = argparse.Namespace(**BUILD_PRESETS, **options)
    ARCH_CONFIG_REGISTRY[arch](args)
    torch.manual_seed(seed)
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, DictionaryTask(dictionary)).to(device)
    for layer in model.decoder.layers:
        layer.need_attn = False  # as fairseq-generate: weights only for the alignment layer
    return model


def build_row(row: str, arch: str, dictionary: Dictionary, seed: int, device: str, k: int,
              batch: Dict[str, torch.Tensor], pruned: float, attn_impl: str = "auto"):
    """The model of one benchmark row and, for ``l0drop``, the fraction of ``batch``'s encodings it prunes.

    An attention function runs in ``row_sublayers(row)``; the ``l0drop`` row is the softmax
    model with L0Drop gates set by ``prune_fraction`` (it decodes from the compressed memory).
    """
    if row == L0DROP:
        model = build(arch, dictionary, seed, device, l0drop=True, attn_impl=attn_impl)
        return model, prune_fraction(model, batch, pruned, seed)
    return build(arch, dictionary, seed, device, attn_k=k, attn_impl=attn_impl,
                 **{f"{s}_attn_fn": row for s in row_sublayers(row)}), None


def stock_architecture(arch: str) -> Tuple[str, Dict[str, Any]]:
    """Stock fairseq's ``transformer`` architecture (and options) of the same sizes as ``arch``."""
    known = stock_architectures()
    if arch not in known:
        raise ValueError(f"no stock fairseq counterpart is known for --arch {arch}; known: {', '.join(sorted(known))}")
    return known[arch]


def describe_stock_architecture(arch: str) -> str:
    stock, options = stock_architecture(arch)
    return stock + "".join(f", {key}={value}" for key, value in options.items())


def _flat_config(cfg, prefix: str = "") -> Dict[str, Any]:
    items = dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else dict(cfg)
    flat = {}
    for key, value in items.items():
        if isinstance(value, dict):
            flat.update(_flat_config(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def build_stock_reference(arch: str, reference, dictionary: Dictionary, seed: int, device: str):
    """Stock fairseq's Transformer of ``arch``'s sizes, with the weights of ``reference`` (a softmax plugin model).

    transformer_sparse keeps fairseq's module tree and parameter names, so the state dict
    loads as it is. Raises ``RuntimeError`` (naming the keys or the configuration fields)
    if the parameter names or shapes, or any field of the models' TransformerConfig, differ.
    """
    stock_arch, options = stock_architecture(arch)
    stock = build(stock_arch, dictionary, seed, device, **options)
    ours, theirs = _flat_config(reference.cfg), _flat_config(stock.cfg)
    differing = sorted(k for k in set(ours) | set(theirs) if ours.get(k, "<absent>") != theirs.get(k, "<absent>"))
    if differing:
        raise RuntimeError(f"stock fairseq's {stock_arch} is not configured like {arch}: "
                           + "; ".join(f"{k}: plugin {ours.get(k, '<absent>')!r}, fairseq {theirs.get(k, '<absent>')!r}"
                                       for k in differing))
    state = reference.state_dict()
    own_keys = set(stock.state_dict())
    missing, unexpected = sorted(own_keys - set(state)), sorted(set(state) - own_keys)
    if missing or unexpected:
        raise RuntimeError(f"parameter names differ between the plugin's {arch} and stock fairseq's {stock_arch}: "
                           f"{len(missing)} missing from the plugin's state dict {missing[:5]}, "
                           f"{len(unexpected)} not in stock fairseq's {unexpected[:5]}")
    stock.load_state_dict(state, strict=True)  # raises on any shape mismatch
    return stock


def forced_length_decoder(model, dictionary: Dictionary, beam: int, steps: int) -> Callable[[Dict], List]:
    """Beam search with min_len = max_len, so every model decodes the same number of steps.

    The returned function gives ``SequenceGenerator.generate``'s hypotheses (a list per sentence).
    """
    generator = SequenceGenerator([model], dictionary, beam_size=beam, max_len_a=0, max_len_b=steps, min_len=steps)

    def decode(batch: Dict[str, torch.Tensor]) -> List:
        model.eval()
        with torch.no_grad():
            return generator.generate([model], {"net_input": {k: batch[k] for k in ("src_tokens", "src_lengths")}})

    return decode


def compare_models(model_a, model_b, batch: Dict[str, torch.Tensor], dictionary: Dictionary, beam: int,
                   steps: int) -> Dict[str, Any]:
    """Do two models compute the same function? Eval mode, teacher-forced logits and forced-length beam search.

    Returns the max abs difference of the logits over ``batch`` and of the hypotheses'
    scores, and in how many sentences the beam hypotheses (tokens, in order) differ.
    """
    was_training = model_a.training, model_b.training
    model_a.eval(), model_b.eval()
    with torch.no_grad():
        logits_a, logits_b = model_a(**batch)[0].float(), model_b(**batch)[0].float()
    hyps_a = forced_length_decoder(model_a, dictionary, beam, steps)(batch)
    hyps_b = forced_length_decoder(model_b, dictionary, beam, steps)(batch)
    model_a.train(was_training[0]), model_b.train(was_training[1])
    differ, score_diff = 0, 0.0
    for sent_a, sent_b in zip(hyps_a, hyps_b):
        same = len(sent_a) == len(sent_b) and all(torch.equal(a["tokens"], b["tokens"]) for a, b in zip(sent_a, sent_b))
        differ += not same
        if same:
            score_diff = max([score_diff] + [abs(float(a["score"]) - float(b["score"])) for a, b in zip(sent_a, sent_b)])
    return {"max_abs_logit_diff": (logits_a - logits_b).abs().max().item(), "sentences": len(hyps_a),
            "hypotheses_differ": differ, "max_abs_score_diff": score_diff}


def long_batch(dictionary: Dictionary, count: int, length: int, seed: int, device: str):
    """``count`` random sequences of exactly ``length`` tokens (EOS included) as sources and targets."""
    gen = torch.Generator().manual_seed(seed + length)
    sequences = [torch.cat([torch.randint(dictionary.nspecial, len(dictionary), (length - 1,), generator=gen),
                            torch.tensor([dictionary.eos()])]) for _ in range(count)]
    targets = [torch.cat([torch.randint(dictionary.nspecial, len(dictionary), (length - 1,), generator=gen),
                          torch.tensor([dictionary.eos()])]) for _ in range(count)]
    return make_batch(sequences, targets, dictionary, device)


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


def prune_fraction(model, batch: Dict[str, torch.Tensor], pruned: float, seed: int) -> float:
    """Set random L0Drop gate weights and a bias that closes the share ``pruned`` of the batch's encodings.

    The bias is a quantile of log alpha over the batch's real tokens: the share a trained
    model would reach, without training one. Returns the fraction actually closed.
    """
    from fairseq_sparse.core.models.sparse_layers import SparseTransformerEncoder

    gate = model.encoder.l0drop_gate.log_alpha
    gen = torch.Generator().manual_seed(seed)
    was_training = model.training
    with torch.no_grad():
        gate.weight.copy_(torch.randn(gate.weight.shape, generator=gen).to(gate.weight.device))
        gate.bias.zero_()
        encoded = SparseTransformerEncoder.forward(model.encoder.eval(), batch["src_tokens"], batch["src_lengths"])
        real = batch["src_tokens"].ne(model.encoder.padding_idx).t()
        scores = gate(encoded["encoder_out"][0]).squeeze(-1)[real]
        gate.bias.fill_(CLOSING_LOG_ALPHA - torch.quantile(scores.float(), pruned).item())
        closed = model.encoder(batch["src_tokens"], src_lengths=batch["src_lengths"])["l0drop_closed"][0]
    model.train(was_training)
    return closed.sum().item() / real.sum().item()
