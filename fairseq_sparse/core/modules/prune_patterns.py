"""Rule-based pruning of encoder outputs (L0Drop paper, section 7), as fixed 0/1 gates.

``--encoder-prune-pattern``:

* ``group``: keep the 1st, 3rd, 5th, ... real token of each sentence (prunes 50%);
* ``freq``: prune the 100 most frequent source types of the training data (dictionary counts);
* ``inv_freq``: prune the rarest source types that together cover 40% of the training tokens;
* ``pos``: prune function words, punctuation, MD and EX (a table of word types, built by
  ``python -m fairseq_sparse.data.pos_prune_table`` with the offline HanTa tagger) and every subword
  continuation (BPEO: a token whose predecessor ends with ``@@``); word-initial pieces of
  split words (BPEH) are kept, as in the paper.

The gates reuse L0Drop's compressed decoder. Type tables are module buffers, so a
checkpoint carries the pattern it was trained with: a model built from a checkpoint
(``fairseq-generate``, the hub, the analyses) takes the ``pos`` table from there and never
reads ``--encoder-prune-pos-table``, whose file may be gone (``use_stored_table``).
"""

from pathlib import Path
from typing import Optional

import torch
from fairseq.data import Dictionary
from omegaconf import OmegaConf, open_dict
from torch import Tensor, nn

from ..errors import UsageError
from .l0drop import GateOutput

PATTERNS = ("group", "freq", "inv_freq", "pos")
TOP_FREQUENT_TYPES = 100
INV_FREQ_TOKEN_SHARE = 0.4
BPE_JOINER = "@@"
STORED_TABLE_OPTION = "encoder_prune_pos_table_stored"  # a model option (models.options), set when a checkpoint is loaded


def frequent_types(dictionary: Dictionary, top: int = TOP_FREQUENT_TYPES) -> Tensor:
    """Bool (V,): the ``top`` most frequent non-special types."""
    counts = torch.tensor(dictionary.count, dtype=torch.float)
    counts[: dictionary.nspecial] = -1
    table = torch.zeros(len(dictionary), dtype=torch.bool)
    table[counts.topk(min(top, len(dictionary) - dictionary.nspecial)).indices] = True
    return table


def rare_types(dictionary: Dictionary, share: float = INV_FREQ_TOKEN_SHARE) -> Tensor:
    """Bool (V,): the rarest non-special types whose counts add up to ``share`` of all tokens."""
    counts = torch.tensor(dictionary.count, dtype=torch.float)
    counts[: dictionary.nspecial] = float("inf")
    order = counts.argsort()
    regular = order[: len(dictionary) - dictionary.nspecial]
    covered = counts[regular].cumsum(0) / counts[regular].sum()
    table = torch.zeros(len(dictionary), dtype=torch.bool)
    table[regular[covered <= share]] = True
    return table


def table_from_file(dictionary: Dictionary, path: str) -> Tensor:
    """Bool (V,): the word types listed (one a line) in ``path``."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"--encoder-prune-pos-table: no such file: {path} (build it with python -m fairseq_sparse.data.pos_prune_table)")
    table = torch.zeros(len(dictionary), dtype=torch.bool)
    for word in Path(path).read_text(encoding="utf-8").split():
        index = dictionary.index(word)
        if index != dictionary.unk():
            table[index] = True
    return table


def use_stored_table(model_cfg) -> None:
    """Mark the model options of a loaded checkpoint so that its model is built without reading the pos
    table file: the table is a buffer of the checkpoint's state, which is loaded into the model next."""
    if getattr(model_cfg, "encoder_prune_pattern", None) != "pos":
        return
    if OmegaConf.is_config(model_cfg):
        with open_dict(model_cfg):
            model_cfg[STORED_TABLE_OPTION] = True
    else:
        setattr(model_cfg, STORED_TABLE_OPTION, True)


def joiner_types(dictionary: Dictionary) -> Tensor:
    """Bool (V,): subword pieces that continue into the next token (``xx@@``)."""
    return torch.tensor([symbol.endswith(BPE_JOINER) for symbol in dictionary.symbols], dtype=torch.bool)


def check_pattern(pattern: str) -> str:
    if pattern not in PATTERNS:
        raise UsageError(f"--encoder-prune-pattern must be one of {', '.join(PATTERNS)}, got {pattern!r}")
    return pattern


class RulePatternGate(nn.Module):
    """Fixed gates: 0 for the tokens a rule prunes, 1 otherwise (no penalty, nothing learned)."""

    def __init__(self, pattern: str, dictionary: Dictionary, pos_table: Optional[str] = None, table_stored: bool = False):
        """``table_stored``: the model is built to load a checkpoint, whose state holds the pos table."""
        super().__init__()
        self.pattern = check_pattern(pattern)
        prunable = torch.zeros(len(dictionary), dtype=torch.bool)
        if pattern == "freq":
            prunable = frequent_types(dictionary)
        elif pattern == "inv_freq":
            prunable = rare_types(dictionary)
        elif pattern == "pos" and table_stored:
            pass  # a placeholder of the right size: loading the checkpoint's state fills it in
        elif pattern == "pos":
            if pos_table is None:
                raise UsageError("--encoder-prune-pattern pos needs --encoder-prune-pos-table FILE")
            prunable = table_from_file(dictionary, pos_table)
        self.register_buffer("prunable_types", prunable)
        self.register_buffer("joiner_types", joiner_types(dictionary))

    def pruned(self, src_tokens: Tensor, padding_mask: Tensor) -> Tensor:
        """(B, T) bool: real tokens the rule prunes."""
        real = ~padding_mask
        if self.pattern == "group":
            position = real.long().cumsum(dim=1) - 1
            return real & (position % 2 == 1)
        pruned = self.prunable_types[src_tokens]
        if self.pattern == "pos":
            previous = torch.cat([torch.zeros_like(src_tokens[:, :1]), src_tokens[:, :-1]], dim=1)
            pruned = pruned | self.joiner_types[previous]  # BPEO: the previous piece joins into this one
        return real & pruned

    def forward(self, x: Tensor, padding_mask: Tensor, src_tokens: Tensor):
        """x: (T, B, C). Returns x with pruned encodings zeroed, and the gate statistics."""
        closed = self.pruned(src_tokens, padding_mask)
        gates = (~closed & ~padding_mask).to(torch.float)
        gated = x * gates.transpose(0, 1).unsqueeze(-1).to(x.dtype)
        return gated, GateOutput(gates=gates, expected_l0=torch.zeros_like(gates), closed=closed)
