"""Where the Triton kernels run: a CUDA device with Triton, or the CPU under Triton's interpreter when asked.

The CPU runs a kernel only under the interpreter, which Triton chooses when the kernel is defined
(``TRITON_INTERPRET=1`` before the plugin is imported), and only when asked (``INTERPRETED_ON_CPU``: the
tests, and ``bench.dispatch_counts`` counting a GPU's route): the eager twin is faster on a CPU.
"""

import os

import torch

try:
    import triton
except ImportError:  # Triton is optional: every kernel has an eager twin that runs everywhere
    triton = None
if not hasattr(torch.library, "custom_op"):  # torch < 2.4 (setup.py admits 2.1): no kernels, the eager twins
    triton = None

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
INTERPRETED_ON_CPU = False


def runs_fused(device: torch.device) -> bool:
    """True where the kernels run: a CUDA device with Triton, or the CPU under the interpreter when asked."""
    if triton is None:
        return False
    if device.type == "cuda":
        return True
    return device.type == "cpu" and INTERPRETED_ON_CPU and INTERPRETED


def run_on_cpu(asked: bool) -> None:
    """Ask (or stop asking) the CPU to run the kernels, where Triton's interpreter was chosen at import."""
    global INTERPRETED_ON_CPU
    INTERPRETED_ON_CPU = asked and triton is not None and INTERPRETED
