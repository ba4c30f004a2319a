"""budgettune: find, by measurement, the recompute configuration that fits a memory limit.

Public API::

    import budgettune
    pinned = budgettune.search(build, max_mem="20GB")   # the search (`budgettune.api.search`)
    pinned = budgettune.load_pinned("budgettune-pin.json")   # in the training job

`import budgettune` stays light (no Optuna, no SQLAlchemy: a training job imports it to apply a
pin); the search's stack is imported the first time ``budgettune.search`` is looked up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from budgettune.errors import (
    BudgettuneError,
    NoFeasibleConfigError,
    NothingMeasuredError,
    PinnedConfigError,
    StorageError,
    StudyFileError,
    UsageError,
)
from budgettune.workload import Workload

__version__ = "0.1.0"
__all__ = [
    "BudgettuneError",
    "NoFeasibleConfigError",
    "NothingMeasuredError",
    "PinnedConfig",
    "PinnedConfigError",
    "StorageError",
    "StudyFileError",
    "UsageError",
    "Workload",
    "__version__",
    "load_pinned",
    "search",
]

if TYPE_CHECKING:
    from budgettune.api import search
    from budgettune.pinning import PinnedConfig, load_pinned
else:

    def load_pinned(path: Any, **kwargs: Any) -> PinnedConfig:
        """Read a pinned config JSON (see `budgettune.pinning.load_pinned`)."""
        from budgettune.pinning import load_pinned as _load_pinned

        return _load_pinned(path, **kwargs)

    def __getattr__(name: str) -> Any:
        # PEP 562: the search and the pin's class, imported when first asked for
        if name == "search":
            from budgettune.api import search

            return search
        if name == "PinnedConfig":
            from budgettune.pinning import PinnedConfig

            return PinnedConfig
        raise AttributeError(f"module 'budgettune' has no attribute {name!r}")
