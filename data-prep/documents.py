#!/usr/bin/env python
"""Kept for checkouts: the same as ``python -m fairseq_sparse.data.documents`` (see that module)."""
import runpy

runpy.run_module("fairseq_sparse.data.documents", run_name="__main__", alter_sys=True)
