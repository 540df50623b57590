"""Attention analysis for fairseq-sparse checkpoints (``python -m fairseq_sparse.analysis``).

Each metric is a plain function on tensors (``sparsity``, ``diversity``, ``alignment``,
``l0drop_stats``); ``collect`` runs teacher-forced passes and records per-head attention;
``report`` writes Markdown, CSV and PNG; ``cli`` wires them into subcommands.
"""

from fairseq_sparse.models.options import SUBLAYERS  # noqa: F401  (encoder self-, decoder self-, cross)
