"""Tables as configured experiments: ``schema`` (the YAML), ``measures`` (what a column measures),
``plan`` (the commands), ``runner`` (running them, one table's or several as one queue, with locks and
completion markers, through ``command``, the one command runner the GPU report shares), ``dry_run``, ``report`` (Markdown, CSV, plot), ``cli``.
``python -m fairseq_sparse.tables NAME`` is the entry point."""
