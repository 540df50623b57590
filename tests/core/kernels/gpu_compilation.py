"""Compiling a kernel for the GPUs our users train on, on a machine without one: what Triton's interpreter
cannot check (bf16 and fp16 pointers, Triton's type rules, PTX generation)."""

import os
import subprocess
import sys


def assert_compiles(script: str) -> None:
    """Run ``script`` (which compiles kernels with ``triton.compile`` and prints "compiled") in a fresh
    interpreter without ``TRITON_INTERPRET``, which would make every kernel an interpreted one."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0 and "compiled" in result.stdout, result.stderr[-3000:]
