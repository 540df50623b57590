"""Teacher-forced forward passes that record per-head attention of every sublayer.

Forward hooks on each ``SparseMultiheadAttention`` ask for per-head weights
(``need_head_weights=True``) and hand the caller back what it asked for, so the model
computes what it computes in evaluation (to float rounding: with weights requested a sublayer
runs its registered function, not the fused kernel it otherwise may). L0Drop models are run without the
compressed memory (``compress = False``), so cross-attention keeps one column per
source token; pruned encodings are zero vectors (or masked with ``--l0drop-mask-pruned``).
"""

from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Tuple

import torch
from torch import Tensor

from ..core.modules.sparse_multihead_attention import SparseMultiheadAttention
from . import SUBLAYERS


class NotASparseModel(TypeError):
    """A checkpoint whose attention modules are not fairseq-sparse's (another architecture)."""


def attention_modules(model) -> Dict[Tuple[str, int], SparseMultiheadAttention]:
    """{(sublayer, layer index): module} for 'encoder', 'decoder' (self) and 'cross'."""
    found = {}
    for i, layer in enumerate(model.encoder.layers):
        found[("encoder", i)] = layer.self_attn
    for i, layer in enumerate(model.decoder.layers):
        found[("decoder", i)] = layer.self_attn
        if getattr(layer, "encoder_attn", None) is not None:
            found[("cross", i)] = layer.encoder_attn
    for key, module in found.items():
        if not isinstance(module, SparseMultiheadAttention):
            raise NotASparseModel(f"{key[0]} attention of layer {key[1]} is {type(module).__name__}, not SparseMultiheadAttention")
    return found


class AttentionRecorder:
    """Context manager: ``recorder.weights[(sublayer, layer)]`` is (H, B, T, S) after a forward pass."""

    def __init__(self, model):
        self.modules = attention_modules(model)
        self.weights: Dict[Tuple[str, int], Tensor] = {}
        # what the model's own call asked of each module (need_weights, need_head_weights), by module:
        # the recorder asks for per-head weights and hands back what was asked, keeping nothing on modules
        self.asked: Dict[int, Tuple[bool, bool]] = {}
        self.handles = []

    def __enter__(self) -> "AttentionRecorder":
        for key, module in self.modules.items():
            self.handles.append(module.register_forward_pre_hook(self._pre_hook, with_kwargs=True))
            self.handles.append(module.register_forward_hook(self._make_hook(key), with_kwargs=True))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _pre_hook(self, module, args, kwargs):
        self.asked[id(module)] = (kwargs.get("need_weights", True), kwargs.get("need_head_weights", False))
        kwargs = dict(kwargs, need_weights=True, need_head_weights=True)
        return args, kwargs

    def _make_hook(self, key):
        def hook(module, args, kwargs, output):
            out, weights = output
            self.weights[key] = weights.detach()
            need_weights, need_head_weights = self.asked.pop(id(module))
            if need_head_weights:
                return out, weights
            return out, (weights.mean(dim=0) if need_weights else None)
        return hook


@dataclass
class BatchAttention:
    """Attention of one batch. weights[sublayer]: (L, H, B, T, S); valid[sublayer]: (B, T, S)."""

    ids: Tensor  # (B,) sentence ids in the split
    src_tokens: Tensor  # (B, S) left-padded
    target: Tensor  # (B, T) right-padded, ends in </s>
    prev: Tensor  # (B, T) decoder inputs: </s> followed by the target shifted right
    weights: Dict[str, Tensor]
    valid: Dict[str, Tensor]
    closed: Optional[Tensor] = None  # (B, S) L0Drop gates that are exactly 0
    attn_fn: Dict[str, List[str]] = field(default_factory=dict)  # per sublayer, per layer

    def sentence(self, b: int, pad: int) -> Tuple[Tensor, Tensor]:
        """Indices of the real source positions and real target positions of sentence b."""
        return (self.src_tokens[b] != pad).nonzero().squeeze(1), (self.target[b] != pad).nonzero().squeeze(1)


def valid_masks(src_tokens: Tensor, prev_output_tokens: Tensor, key_padding: Tensor, pad: int) -> Dict[str, Tensor]:
    """Valid (query, key) pairs per sublayer, (B, T, S) bool. key_padding: the encoder's
    padding mask for cross-attention keys (includes pruned keys with --l0drop-mask-pruned)."""
    src_real = src_tokens != pad
    tgt_real = prev_output_tokens != pad
    tgt_len = prev_output_tokens.size(1)
    causal = torch.ones(tgt_len, tgt_len, dtype=torch.bool, device=src_tokens.device).tril()
    return {
        "encoder": src_real[:, :, None] & src_real[:, None, :],
        "decoder": tgt_real[:, :, None] & tgt_real[:, None, :] & causal,
        "cross": tgt_real[:, :, None] & ~key_padding[:, None, :],
    }


@torch.no_grad()
def run_batch(model, sample: dict, pad: int) -> BatchAttention:
    net_input = sample["net_input"]
    src_tokens, prev = net_input["src_tokens"], net_input["prev_output_tokens"]
    with AttentionRecorder(model) as recorder:
        encoder_out = model.encoder(src_tokens, src_lengths=net_input["src_lengths"])
        model.decoder(prev, encoder_out=encoder_out)
    padding = encoder_out.get("encoder_padding_mask")
    key_padding = padding[0] if padding else src_tokens.eq(pad)
    weights, attn_fn = {}, {}
    for sublayer in SUBLAYERS:
        keys = sorted(k for k in recorder.modules if k[0] == sublayer)
        if keys:
            weights[sublayer] = torch.stack([recorder.weights[k].float() for k in keys])
            attn_fn[sublayer] = [recorder.modules[k].attn_fn for k in keys]
    closed = encoder_out["l0drop_closed"][0] if encoder_out.get("l0drop_closed") else None
    return BatchAttention(ids=sample["id"], src_tokens=src_tokens, target=sample["target"], prev=prev, weights=weights,
                          valid=valid_masks(src_tokens, prev, key_padding, pad), closed=closed, attn_fn=attn_fn)


DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def load(path: str, data: str, cpu: bool = True, dtype: str = "float32", model_overrides: str = "{}"):
    """(model in eval mode, task) from a fairseq checkpoint; L0Drop memory compression off.

    ``dtype`` casts the model as fairseq's --fp16 / --bf16 do; attention weights (what the
    analyses read) stay float32 whatever it is. ``model_overrides``: as fairseq-generate's
    --model-overrides (a Python dict literal), e.g. to analyse a softmax model decoded with top-k.
    """
    import ast

    from fairseq import checkpoint_utils

    import fairseq_sparse  # noqa: F401  (registers the model, makes checkpoints loadable)

    overrides = ast.literal_eval(model_overrides or "{}")
    if not isinstance(overrides, dict):
        raise ValueError(f"--model-overrides must be a dict literal, got {model_overrides!r}")
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={**overrides, "data": data})
    model = models[0].eval()
    try:  # here rather than at the first batch, and naming the checkpoint
        attention_modules(model)
    except (NotASparseModel, AttributeError) as err:
        arch = getattr(getattr(model, "cfg", None), "_name", None) or type(model).__name__
        raise NotASparseModel(f"{path} is a {arch} model, not transformer_sparse ({err}): the analyses record the "
                              "attention of transformer_sparse checkpoints (--arch transformer_sparse*)") from err
    if hasattr(model.encoder, "compress"):
        model.encoder.compress = False
    model.to(DTYPES[dtype])
    if not cpu:
        model.cuda()
    return model, task


def batches(model, task, split: str, max_tokens: int = 4000, max_sentences: Optional[int] = None,
            ids: Optional[List[int]] = None, cpu: bool = True) -> Iterator[BatchAttention]:
    """BatchAttention for the first ``max_sentences`` sentences of ``split`` (or the given ids)."""
    from fairseq import utils

    if split not in task.datasets:  # the heatmap command has loaded it to check --sentences
        task.load_dataset(split)
    dataset = task.dataset(split)
    pad = task.source_dictionary.pad()
    if ids is None:
        ids = list(range(len(dataset) if max_sentences is None else min(len(dataset), max_sentences)))
    chunk: List = []
    tokens = 0
    for i in ids:
        item = dataset[i]
        size = len(item["source"]) + len(item["target"])
        if chunk and tokens + size > max_tokens:
            yield _run(model, dataset, chunk, pad, cpu, utils)
            chunk, tokens = [], 0
        chunk.append(item)
        tokens += size
    if chunk:
        yield _run(model, dataset, chunk, pad, cpu, utils)


def _run(model, dataset, items, pad, cpu, utils) -> BatchAttention:
    sample = dataset.collater(items)
    if not cpu:
        sample = utils.move_to_cuda(sample)
    return run_batch(model, sample, pad)


def pieces(dictionary, tokens: Tensor) -> List[str]:
    """The strings (subword pieces) of ``tokens``."""
    return [dictionary[int(t)] for t in tokens]
