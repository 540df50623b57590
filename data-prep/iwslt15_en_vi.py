#!/usr/bin/env python
"""Kept for checkouts: the same as ``python -m fairseq_sparse.data.iwslt15_en_vi`` (see that module)."""
import runpy

runpy.run_module("fairseq_sparse.data.iwslt15_en_vi", run_name="__main__", alter_sys=True)
