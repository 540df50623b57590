"""What every sequence kernel of the registry (``AttentionSpec.sequence_kernel``) promises the users' regime, checked
through the attention module along a GPU's route (Triton's interpreter on the CPU): the kernel runs in place of
the registered function, and nothing of size (T, S) is kept for the backward pass."""

import os

import pytest
import torch

from fairseq_sparse.core.attention import attention_names, get_attention
from fairseq_sparse.core.kernels import device
from fairseq_sparse.core.modules.sparse_multihead_attention import SparseMultiheadAttention

pytestmark = pytest.mark.skipif(device.triton is None, reason="Triton is not installed (requirements.txt pins it)")
ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
WITH_KERNEL = [name for name in attention_names() if get_attention(name).sequence_kernel is not None]


@pytest.fixture
def fused(monkeypatch):
    assert ON_GPU or os.environ.get("TRITON_INTERPRET") == "1", "tests/conftest.py sets the interpreter on a CPU"
    monkeypatch.setattr(device, "INTERPRETED_ON_CPU", True)


def test_rela_and_top_k_declare_a_sequence_kernel():
    assert {"topk", "rela_g", "rela_i", "relu", "relu_rmsnorm", "rela_g_layernorm", "rela_g_gelu",
            "rela_g_leaky_relu"} == set(WITH_KERNEL)


def _largest_saved(step) -> int:
    """The number of elements of the largest tensor autograd saves while ``step`` runs."""
    sizes = [0]

    def pack(tensor):
        sizes.append(tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        step()
    return max(sizes)


@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
@pytest.mark.parametrize("name", WITH_KERNEL)
def test_nothing_of_size_t_by_s_is_kept_for_the_backward_pass(name, cross, fused):
    """With the kernel the module saves q, k, v and per-query numbers, never a (B, H, T, S) score or weight tensor,
    which the registered function's call keeps (so the check can fail). 70 queries and keys: two blocks of each."""
    length, embed, heads, batch = 70, 64, 4, 2
    module = SparseMultiheadAttention(embed, heads, attn_fn=name, self_attention=not cross,
                                      encoder_decoder_attention=cross).to(DEVICE).train()
    x = torch.randn(length, batch, embed, device=DEVICE, requires_grad=True)
    memory = torch.randn(length, batch, embed, device=DEVICE, requires_grad=True) if cross else x
    t_by_s = batch * heads * length * length
    assert _largest_saved(lambda: module(x, memory, memory, need_weights=False)) < t_by_s
    assert _largest_saved(lambda: module(x, memory, memory, need_weights=True)) >= t_by_s
