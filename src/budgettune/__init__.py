"""budgettune: find, by measurement, the recompute configuration that fits a memory limit.

Public API::

    from budgettune import Workload, load_pinned
    import budgettune
    pinned = budgettune.search(build, max_mem="20GB")   # `budgettune.api.search`
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any

import budgettune.search as search
from budgettune.workload import Workload

__version__ = "0.1.0"
__all__ = ["Workload", "load_pinned", "search", "__version__"]

if TYPE_CHECKING:
    from budgettune.pinning import PinnedConfig


def load_pinned(path: Any, **kwargs: Any) -> PinnedConfig:
    """Read a pinned config JSON (see `budgettune.pinning.load_pinned`)."""
    from budgettune.pinning import load_pinned as _load_pinned

    return _load_pinned(path, **kwargs)


class _CallableSearch(types.ModuleType):
    """``budgettune.search(build, max_mem=...)`` is the public Python API (`budgettune.api`),
    and ``budgettune.search`` is also the study's package: Python sets a package's attribute
    to its subpackage on import, so a function of that name here would be replaced the first
    time anything imports ``budgettune.search.*``. The package is made callable instead (a
    module's ``__class__`` may be reassigned); its ``__init__`` imports nothing, so a training
    job's ``import budgettune`` stays free of Optuna and SQLAlchemy."""

    def __call__(self, *args: Any, **kwargs: Any) -> PinnedConfig:
        from budgettune.api import search as _search

        return _search(*args, **kwargs)


search.__class__ = _CallableSearch
