"""Small builders shared by the model tests: a tiny transformer_sparse without a data set, and a tiny
binarised bitext with in-process fairseq-preprocess / fairseq-train for tests that need a checkpoint; and the
tolerance the kernel tests compare with."""

import argparse
from pathlib import Path
from typing import Dict

import torch
from fairseq.data import Dictionary
from fairseq.models import ARCH_MODEL_REGISTRY, ARCH_CONFIG_REGISTRY

import fairseq_sparse  # noqa: F401  (registers the model)
from fairseq_sparse.core.models.sparse_layers import SparseTransformerEncoder

VOCAB = 20


def relatively_close(got: torch.Tensor, expected: torch.Tensor, tolerance: float = 2e-5) -> bool:
    """Every entry within ``tolerance`` of ``expected``'s largest magnitude (at least 1): float32 kernels that sum
    in another order than the reference."""
    return bool((got - expected).abs().max() <= tolerance * max(1.0, expected.abs().max()))


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


def close_some_gates(model, batch, seed=0):
    """Random gate weights, centred on this batch, so that about half of its encodings are pruned."""
    gen = torch.Generator().manual_seed(seed)
    gate = model.encoder.l0drop_gate.log_alpha
    with torch.no_grad():
        gate.weight.copy_(torch.randn(gate.weight.shape, generator=gen) * 3.0)
        gate.bias.fill_(0.0)
        encoded = SparseTransformerEncoder.forward(model.encoder, batch["src_tokens"], batch["src_lengths"])
        real = batch["src_tokens"].ne(1).t()
        gate.bias.fill_(-gate(encoded["encoder_out"][0]).squeeze(-1)[real].median().item())
    return model


# ---------------------------------------------------------------- a tiny binarised bitext and in-process fairseq

TINY_SRC = ["the dog@@ gy runs .", "a cat sleeps .", "the cat runs home .", "a dog@@ gy sleeps at home .",
            "the man walks .", "a man runs to the dog@@ gy ."]
TINY_TGT = ["der Hund@@ i läuft .", "eine Katze schläft .", "die Katze läuft heim .", "ein Hund@@ i schläft da@@ heim .",
            "der Mann geht .", "ein Mann läuft zum Hund@@ i ."]
# a 2+2-layer model of width 16 and two updates on the CPU: a checkpoint in seconds
TINY_TRAIN = [
    "--arch", "transformer_sparse_mini", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
    "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32", "--encoder-layers", "2",
    "--decoder-layers", "2", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
    "--optimizer", "adam", "--lr", "0.001", "--max-tokens", "500", "--max-update", "2", "--cpu",
    "--no-epoch-checkpoints", "--no-save-optimizer-state", "--seed", "1", "--log-format", "none",
    "--required-batch-size-multiple", "1", "--disable-validation",
]


def run_in_process(tool: str, *args) -> None:
    """fairseq-preprocess / fairseq-train in this process (saves their start-up time)."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    argv = [str(a) for a in args]
    if tool == "fairseq-preprocess":
        from fairseq_cli import preprocess

        preprocess.main(options.get_preprocessing_parser().parse_args(argv))
    else:
        from fairseq_cli import train

        args = options.parse_args_and_arch(options.get_training_parser(), input_args=argv)
        train.main(convert_namespace_to_omegaconf(args))


def tiny_bitext(root) -> Path:
    """TINY_SRC/TINY_TGT (en-de) as train, valid and test, binarised into ``root/bin``."""
    root = Path(root)
    for split in ("train", "valid", "test"):
        (root / f"{split}.en").write_text("\n".join(TINY_SRC) + "\n", encoding="utf-8")
        (root / f"{split}.de").write_text("\n".join(TINY_TGT) + "\n", encoding="utf-8")
    run_in_process("fairseq-preprocess", "--source-lang", "en", "--target-lang", "de", "--trainpref", root / "train",
                   "--validpref", root / "valid", "--testpref", root / "test", "--destdir", root / "bin", "--workers", "1")
    return root / "bin"
