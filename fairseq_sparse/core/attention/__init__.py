"""The registry of attention functions and one module per method family. Importing a method's module
registers its functions, and every module of this package is imported here: a new method is one new
file, with no edit elsewhere."""

if "." not in __name__:  # fairseq imported this folder as a --user-dir, by its own name
    from fairseq_sparse.core.errors import refuse_folder_as_user_dir

    refuse_folder_as_user_dir(__file__)

import importlib
import pkgutil

from .functions import register_selection  # noqa: F401
from .registry import (  # noqa: F401
    ATTN_IMPLS,
    DEFAULT_K,
    HARD_TRAIN_CHOICES,
    SUBLAYERS,
    AttentionContext,
    AttentionSpec,
    PatternGeometry,
    attention_names,
    check_attn_impl,
    check_hard_train,
    check_k,
    check_oow_window,
    function_module,
    get_attention,
    register_attention,
)

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
