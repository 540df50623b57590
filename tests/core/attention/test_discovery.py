"""A new attention method is one file: its module registers it, and the registry's facts reach the
benchmarks and the analysis with no other edit."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import fairseq_sparse

PACKAGE = Path(fairseq_sparse.__file__).resolve().parent

NEW_METHOD = '''
"""A method a user adds: ReLU attention with rows rescaled to sum to at most one (for the test)."""
from typing import Optional

from torch import Tensor

from .functions import attend, fill_masked
from .registry import AttentionContext, AttentionOutput, register_attention


@register_attention("capped_relu", placement=("encoder", "cross"), weights_are_probabilities=False)
def capped_relu_attention(scores: Tensor, values: Tensor, mask: Optional[Tensor], ctx: AttentionContext) -> AttentionOutput:
    """ReLU attention, each row divided by max(1, its sum)."""
    weights = fill_masked(scores.relu(), mask, 0.0)
    weights = weights / weights.sum(dim=-1, keepdim=True).clamp(min=1.0)
    return attend(weights, values, ctx), weights
'''

CHECK = """
import torch
from fairseq_sparse.core.attention import attention_names, get_attention
from fairseq_sparse.bench import memory, run, dispatch_counts
from fairseq_sparse.bench.common import row_sublayers
from fairseq_sparse.analysis.head_stats import renormalised
from fairseq_sparse.core.modules.sparse_multihead_attention import SparseMultiheadAttention

assert "capped_relu" in attention_names()
assert "capped_relu" in memory.DEFAULT_FUNCTIONS
assert row_sublayers("capped_relu") == ("encoder", "cross")
assert renormalised("auto", "capped_relu") and not renormalised("auto", "softmax")
x = torch.randn(5, 2, 16)
out, weights = SparseMultiheadAttention(16, 4, attn_fn="capped_relu", self_attention=True)(x, x, x)
assert out.shape == (5, 2, 16) and float(weights.sum(-1).max()) <= 1.0 + 1e-6
print("discovered")
"""


def test_a_new_method_file_registers_itself_and_reaches_the_tools(tmp_path):
    copy = tmp_path / "fairseq_sparse"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "core" / "attention" / "capped_relu.py").write_text(NEW_METHOD, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    result = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300, env=env,
                            cwd=tmp_path)
    assert result.returncode == 0 and "discovered" in result.stdout, result.stderr[-3000:]


def test_every_module_of_the_attention_package_is_imported():
    names = {path.stem for path in (PACKAGE / "core" / "attention").glob("*.py") if path.stem != "__init__"}
    assert {name for name in names if f"fairseq_sparse.core.attention.{name}" not in sys.modules} == set()
