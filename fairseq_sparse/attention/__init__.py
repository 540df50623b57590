from . import functions  # noqa: F401  (registers the functions)
from . import structured  # noqa: F401  (registers the structured patterns and Top-k OOW)
from .functions import register_selection  # noqa: F401
from .registry import (  # noqa: F401
    DEFAULT_K,
    HARD_TRAIN_CHOICES,
    AttentionContext,
    AttentionSpec,
    attention_names,
    check_k,
    get_attention,
    register_attention,
)
