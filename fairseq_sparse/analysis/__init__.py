"""Attention analysis for fairseq-sparse checkpoints (``python -m fairseq_sparse.analysis``).

Each metric is a plain function on tensors (``zero_weights``, ``diversity``, ``alignment``,
``l0drop_stats``); ``collect`` runs teacher-forced passes and records per-head attention;
each subcommand's computation over a split is in ``head_stats`` (zero weights, diversity),
``alignment_error`` (aer), ``pruning`` (l0drop) or ``heatmap``; ``pages`` writes their Markdown,
CSV and PNG (with ``report``'s tables and plots); ``cli`` parses the command line and dispatches.
"""

if "." not in __name__:  # fairseq imported this folder as a --user-dir, by its own name
    from fairseq_sparse.core.errors import refuse_folder_as_user_dir

    refuse_folder_as_user_dir(__file__)

from fairseq_sparse.core.attention import SUBLAYERS  # noqa: F401  (encoder self-, decoder self-, cross)
