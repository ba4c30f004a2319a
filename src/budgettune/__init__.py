"""budgettune: find, by measurement, the recompute configuration that fits a memory limit.

Public API::

    from budgettune import Workload, load_pinned
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from budgettune.workload import Workload

__version__ = "0.1.0"
__all__ = ["Workload", "load_pinned", "__version__"]

if TYPE_CHECKING:
    from budgettune.pinning import PinnedConfig


def load_pinned(path: Any, **kwargs: Any) -> PinnedConfig:
    """Read a pinned config JSON (see `budgettune.pinning.load_pinned`)."""
    from budgettune.pinning import load_pinned as _load_pinned

    return _load_pinned(path, **kwargs)
