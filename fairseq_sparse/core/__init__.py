"""The plugin's core, what ``--user-dir fairseq_sparse`` loads: the attention registry
(``attention``), the attention module and L0Drop's gates (``modules``), the registered model and
architectures (``models``), the criteria (``criterions``) and checkpoint loading.

It imports nothing of the tools around it (data preparation, the table runner, benchmarks,
analysis, the commands), which build on it; ``tests/test_layout.py`` checks the direction.
Importing it registers the architectures and criteria with fairseq.
"""

from . import checkpoint_loading  # noqa: F401  (first: makes fairseq checkpoints loadable on torch >= 2.6)
from .errors import report_usage_errors_in_one_line
from .interactive_inputs import skip_long_inputs_in_interactive
from . import attention  # noqa: F401
from .criterions import alignment as alignment_criterion  # noqa: F401
from .criterions import l0drop as l0drop_criterion  # noqa: F401
from .models import l0drop, presets_topk_paper, sparse_transformer  # noqa: F401
from .models.sparse_transformer import SparseTransformerModel  # noqa: F401

report_usage_errors_in_one_line()  # in fairseq-* commands: what the user asked wrongly is one line, not a traceback
skip_long_inputs_in_interactive()  # in fairseq-interactive: an input longer than the model reads is one line, skipped
