#!/usr/bin/env python
"""Kept for checkouts: the same as ``python -m fairseq_sparse.data.iwslt14_de_en`` (see that module)."""
import runpy

runpy.run_module("fairseq_sparse.data.iwslt14_de_en", run_name="__main__", alter_sys=True)
