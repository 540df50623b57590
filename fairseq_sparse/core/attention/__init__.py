# importing a method's module registers its functions
from . import entmax_family, functions, hard_retrieval, rela, structured  # noqa: F401
from .functions import register_selection  # noqa: F401
from .registry import (  # noqa: F401
    ATTN_IMPLS,
    DEFAULT_K,
    HARD_TRAIN_CHOICES,
    AttentionContext,
    AttentionSpec,
    attention_names,
    check_attn_impl,
    check_hard_train,
    check_k,
    function_module,
    get_attention,
    register_attention,
)
