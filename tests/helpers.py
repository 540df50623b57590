"""Small builders shared by the model tests: a tiny transformer_sparse without a data set."""

import argparse
from typing import Dict

import torch
from fairseq.data import Dictionary
from fairseq.models import ARCH_MODEL_REGISTRY, ARCH_CONFIG_REGISTRY

import fairseq_sparse  # noqa: F401  (registers the model)

VOCAB = 20


def tiny_dictionary() -> Dictionary:
    d = Dictionary()
    for i in range(VOCAB):
        d.add_symbol(f"w{i}")
    return d


class TinyTask:
    def __init__(self):
        self.source_dictionary = tiny_dictionary()
        self.target_dictionary = self.source_dictionary


def model_args(arch: str = "transformer_sparse_mini", **overrides) -> argparse.Namespace:
    args = argparse.Namespace(
        encoder_embed_dim=16, encoder_ffn_embed_dim=32, encoder_attention_heads=4,
        decoder_embed_dim=16, decoder_ffn_embed_dim=32, decoder_attention_heads=4,
        encoder_layers=2, decoder_layers=2, dropout=0.0, attention_dropout=0.0,
    )
    for key, value in overrides.items():
        setattr(args, key, value)
    ARCH_CONFIG_REGISTRY[arch](args)
    return args


def build_model(arch: str = "transformer_sparse_mini", seed: int = 0, **overrides):
    torch.manual_seed(seed)
    args = model_args(arch, **overrides)
    return ARCH_MODEL_REGISTRY[arch].build_model(args, TinyTask())


def random_batch(lengths, tgt_lengths, seed=0, pad=1, eos=2) -> Dict[str, torch.Tensor]:
    """Left-padded sources and right-padded targets, as fairseq's translation task makes them."""
    gen = torch.Generator().manual_seed(seed)
    bsz, src_len, tgt_len = len(lengths), max(lengths), max(tgt_lengths)
    src = torch.full((bsz, src_len), pad)
    prev = torch.full((bsz, tgt_len), pad)
    for i, (n, m) in enumerate(zip(lengths, tgt_lengths)):
        src[i, src_len - n:] = torch.randint(4, 4 + VOCAB, (n,), generator=gen)
        src[i, -1] = eos
        prev[i, :m] = torch.randint(4, 4 + VOCAB, (m,), generator=gen)
        prev[i, 0] = eos
    return {"src_tokens": src, "src_lengths": torch.tensor(lengths), "prev_output_tokens": prev}
