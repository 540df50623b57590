"""fairseq-sparse: sparse attention for fairseq NMT (``--user-dir fairseq_sparse``)."""

# the plugin's core registers the architectures and criteria with fairseq (--user-dir runs this
# file); the tools around it (data, experiments, bench, analysis, the commands) load on demand
from .core import SparseTransformerModel  # the hub class: fairseq_sparse.SparseTransformerModel.from_pretrained(...)


__version__ = "0.1.0"
__all__ = ["SparseTransformerModel", "__version__"]
