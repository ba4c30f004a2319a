"""Stored data that cannot be read: a row budgettune did not write (edited by hand or by
another program) or a damaged one, told in one line instead of a traceback (issue 48's P6-2:
a trial attr or study attr that is not JSON, 1e400, 5,000 digits or 5,000 levels deep, a
parameter's distribution that is not JSON, a trial state Optuna does not know)."""

from __future__ import annotations

import os
import traceback
from collections.abc import Mapping
from typing import Any

from budgettune.errors import READ_ERRORS, SpecError, StorageError

_READERS = (
    os.sep.join(("", "optuna", "storages", "")),
    os.sep.join(("", "optuna", "distributions.py")),
    os.sep.join(("", "optuna", "study", "")),  # the best trial read from stored constraints
    os.sep.join(("", "budgettune", "storage", "")),
)
"""Where such an error must have been raised for it to be the stored data's: Optuna's
storages, distributions and study (which reads a trial's stored constraints, issue 48's P7-2),
and budgettune's own storage room."""


def unreadable_data(exc: BaseException) -> StorageError | None:
    """A one-line `StorageError` for ``exc`` when it was raised while stored data was read
    (a frame of its traceback is in a storage reader, `_READERS`); None otherwise (a fault of
    budgettune's own elsewhere keeps its traceback)."""
    if not isinstance(exc, (*READ_ERRORS, SpecError)):  # a stored spec edited by hand (P10-2)
        return None
    frames = [frame.f_code.co_filename for frame, _ in traceback.walk_tb(exc.__traceback__)]
    if not any(reader in name for name in frames for reader in _READERS):
        return None
    what = str(exc) if not isinstance(exc, RecursionError) else "nested too deep"
    return StorageError(
        f"the study's stored data cannot be read ({type(exc).__name__}: {what:.300}): a row "
        "budgettune did not write, or a damaged one; restore the database from a copy "
        "(`--debug` shows where it failed)"
    )


def stored_object(attrs: Mapping[str, Any], key: str) -> dict[str, Any]:
    """A study attribute budgettune writes as a JSON object (``search``, ``search_spec``), or
    ``{}`` where it is missing or hand-edited to something else (issue 48's P9-1 and P9-2:
    ``[5]`` or ``null`` there crashed ``show`` and ``worker``)."""
    value = attrs.get(key)
    return value if isinstance(value, dict) else {}
