"""Triton kernels for what the field's libraries do not fuse (on a CUDA device with Triton installed).

Each kernel has an eager twin in the core that defines it; the kernel is tested against that twin on the
CPU under Triton's interpreter (``TRITON_INTERPRET=1``, float32 and float16) and compiled for sm_75,
sm_80, sm_86, sm_89 and sm_90 without a GPU, their shared memory checked against each card's
(tests/core/kernels/). Triton is optional: without it every path is the eager one.
"""
