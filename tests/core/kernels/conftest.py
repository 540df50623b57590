"""The fixture every kernel test takes: the kernels' route, on a GPU or through Triton's interpreter on the CPU."""

import os

import pytest
import torch

from fairseq_sparse.core.kernels import device


@pytest.fixture
def fused(monkeypatch):
    """Take the Triton kernels where the module would on a GPU (on the CPU, ``device.INTERPRETED_ON_CPU``)."""
    assert torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1", \
        "tests/conftest.py sets the interpreter on a CPU"
    monkeypatch.setattr(device, "INTERPRETED_ON_CPU", True)
