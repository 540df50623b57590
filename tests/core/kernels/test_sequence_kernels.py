"""What every sequence kernel of the registry (``AttentionSpec.sequence_kernel``) promises the users' regime, checked
through the attention module along a GPU's route (Triton's interpreter on the CPU): the kernel runs in place of
the registered function, the module's output and every parameter's gradient equal the reference path's, and nothing
of size (T, S) is kept for the backward pass. Each kernel's own conformance cases are in its test file."""

import pytest
import torch
from helpers import relatively_close

from fairseq_sparse.bench.dispatch_counts import count
from fairseq_sparse.core.attention import attention_names, get_attention
from fairseq_sparse.core.kernels import device
from fairseq_sparse.core.modules.sparse_multihead_attention import SparseMultiheadAttention

pytestmark = pytest.mark.skipif(device.triton is None, reason="Triton is not installed (requirements.txt pins it)")
ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
WITH_KERNEL = [name for name in attention_names() if get_attention(name).sequence_kernel is not None]


def test_rela_and_top_k_declare_a_sequence_kernel():
    assert {"topk", "rela_g", "rela_i", "relu", "relu_rmsnorm", "rela_g_layernorm", "rela_g_gelu",
            "rela_g_leaky_relu"} == set(WITH_KERNEL)


def _kernel_calls(name, counter) -> tuple:
    """How many times a step dispatched the method's sequence kernel forward and backward (custom operations named
    after the kernel's function: ``fairseq_sparse.topk_attention`` and ``..._backward``)."""
    kernel = get_attention(name).sequence_kernel
    forward = f"fairseq_sparse.{getattr(kernel, 'func', kernel).__name__}"
    return counter.by_operation.get(forward, 0), counter.by_operation.get(f"{forward}_backward", 0)


@pytest.mark.parametrize("cross", [False, True], ids=["decoder-self", "cross"])
@pytest.mark.parametrize("name", ["rela_g", "rela_i", "rela_g_leaky_relu", "topk"])
def test_the_module_trains_with_the_kernel_as_with_the_reference(name, cross, fused):
    """Output and the gradients of every parameter (projections; ReLA's output norm's gain and gate), with fairseq's
    future mask in decoder self-attention and left source padding in cross-attention."""
    embed, heads, length, source = 64, 4, 37, 29
    modules = {}
    for impl in ("auto", "reference"):
        torch.manual_seed(5)
        modules[impl] = SparseMultiheadAttention(embed, heads, attn_fn=name, attn_k=4, impl=impl,
                                                 self_attention=not cross,
                                                 encoder_decoder_attention=cross).to(DEVICE).train()
    x = torch.randn(length, 3, embed, device=DEVICE)
    memory = torch.randn(source, 3, embed, device=DEVICE)
    padding = torch.zeros(3, source, dtype=torch.bool, device=DEVICE)
    padding[1, :6] = True
    future = torch.triu(torch.full((length, length), float("-inf"), device=DEVICE), 1)  # fairseq's buffered_future_mask

    def step(module):
        if cross:
            out, _ = module(x, memory, memory, key_padding_mask=padding, static_kv=True, need_weights=False)
        else:
            out, _ = module(x, x, x, attn_mask=future, need_weights=False)
        out.pow(2).sum().backward()
        return out

    assert _kernel_calls(name, count(lambda: step(modules["auto"]))) == (1, 1)
    assert _kernel_calls(name, count(lambda: step(modules["reference"]))) == (0, 0)
    for module in modules.values():
        module.zero_grad()
    got, expected = step(modules["auto"]), step(modules["reference"])
    assert relatively_close(got, expected)
    named = dict(modules["reference"].named_parameters())
    for parameter_name, parameter in modules["auto"].named_parameters():
        assert relatively_close(parameter.grad, named[parameter_name].grad, 5e-5), parameter_name


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


@pytest.mark.parametrize("name", ["rela_g", "topk"])
def test_where_no_tiles_fit_the_module_takes_the_reference_path(name, fused, monkeypatch):
    """A card, dtype and head size without tiles (``tiles.sequence_tiles`` answers None, as for float32 at d_h 256 on a
    T4) never launch the kernel: the module computes the call as ``--attn-impl reference`` does, without an error."""
    from fairseq_sparse.core.kernels import tiles

    monkeypatch.setattr(tiles, "sequence_tiles", lambda kernel, q: None)
    modules = {}
    for impl in ("auto", "reference"):
        torch.manual_seed(5)
        modules[impl] = SparseMultiheadAttention(32, 2, attn_fn=name, attn_k=3, impl=impl,
                                                 self_attention=True).to(DEVICE).train()
    x = torch.randn(9, 2, 32, device=DEVICE)
    counter = count(lambda: modules["auto"](x, x, x, need_weights=False))
    assert _kernel_calls(name, counter) == (0, 0)
    assert relatively_close(modules["auto"](x, x, x, need_weights=False)[0],
                            modules["reference"](x, x, x, need_weights=False)[0])
