"""The benchmarks' stock fairseq counterpart of every plugin architecture is derived, not listed."""

import pytest
from fairseq.models import ARCH_MODEL_REGISTRY

from fairseq_sparse.bench.common import build, build_stock_reference, stock_architectures, synthetic_dictionary

PLUGIN_ARCHITECTURES = sorted(a for a, m in ARCH_MODEL_REGISTRY.items() if m is ARCH_MODEL_REGISTRY["transformer_sparse"])


def test_every_plugin_architecture_has_a_stock_counterpart():
    assert sorted(stock_architectures()) == PLUGIN_ARCHITECTURES
    assert stock_architectures()["transformer_sparse_mini"] == (
        "transformer_iwslt_de_en", {"encoder_layers": 2, "decoder_layers": 2})


@pytest.mark.parametrize("arch", [a for a in PLUGIN_ARCHITECTURES if "big" not in a])
def test_the_counterpart_has_the_same_configuration_and_parameters(arch):
    """build_stock_reference fails on any differing TransformerConfig field or parameter name (the big
    architecture is left out only for the memory and time of building it on a small machine)."""
    dictionary = synthetic_dictionary(64)
    # the benchmarks compare stock fairseq with the plugin's softmax (a preset's own function aside)
    reference = build(arch, dictionary, 0, "cpu", **{f"{s}_attn_fn": "softmax" for s in ("encoder", "decoder", "cross")})
    stock = build_stock_reference(arch, reference, dictionary, 0, "cpu")
    assert type(stock).__name__ == "TransformerModel"
