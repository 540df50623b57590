"""Tables as configured experiments: ``schema`` (the YAML), ``measures`` (what a column measures),
``plan`` (the commands), ``runner`` (running them, with locks and completion markers, through
``command``, the one command runner the GPU report shares), ``report`` (Markdown, CSV, plot), ``cli``.
``python -m fairseq_sparse.tables NAME`` is the entry point."""
