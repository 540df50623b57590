"""fairseq-sparse: sparse attention for fairseq NMT (``--user-dir fairseq_sparse``)."""

from . import checkpoint_loading  # noqa: F401  (first: makes fairseq checkpoints loadable on torch >= 2.6)
from . import attention  # noqa: F401
from .models import l0drop, sparse_transformer  # noqa: F401
from .models import presets_topk_paper  # noqa: F401  (the Extremely Sparse Transformer paper's architectures)
from .criterions import alignment as alignment_criterion  # noqa: F401
from .criterions import l0drop as l0drop_criterion  # noqa: F401

# the hub class, for ``fairseq_sparse.SparseTransformerModel.from_pretrained(...)``; its module is
# imported above anyway (it registers the architectures), so exporting it costs nothing
from .models.sparse_transformer import SparseTransformerModel

__version__ = "0.1.0"
__all__ = ["SparseTransformerModel", "__version__"]
