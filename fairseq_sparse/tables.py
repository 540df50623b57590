"""``python -m fairseq_sparse.tables NAME``: regenerate a table (see ``fairseq_sparse.experiments``).

The names below are the experiments package's, re-exported for code written against this module.
"""

import sys

from fairseq_sparse.experiments.arguments import merge_args, parse_flags  # noqa: F401
from fairseq_sparse.experiments.cli import build_parser, main  # noqa: F401
from fairseq_sparse.experiments.errors import ConfigError, StepError  # noqa: F401
from fairseq_sparse.experiments.measures import MEASURES  # noqa: F401
from fairseq_sparse.experiments.plan import Plan, Step  # noqa: F401
from fairseq_sparse.experiments.cells import collect  # noqa: F401
from fairseq_sparse.experiments.report import write_report  # noqa: F401
from fairseq_sparse.experiments.schema import CONFIGS, load_table, resolve_config  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
