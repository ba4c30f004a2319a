"""The study storage: Optuna's RDBStorage plus budgettune's ``bt_`` tables, with migrations.

Nothing outside this package imports SQLAlchemy or alembic; it hands out frozen dataclasses.

    storage = open_storage("postgresql://me@db/tune")      # or a file path, or None
    digest = storage.record_workload(ref=..., options=..., fingerprint=...)
    storage.record_measurement(study_name=..., trial_number=3, kind="trial", ...)
    upgrade(url)                                            # `budgettune db upgrade`
"""

from __future__ import annotations

from budgettune.storage.engine import display_url, normalize_url
from budgettune.storage.lifecycle import current_revision, open_storage, study_names, upgrade
from budgettune.storage.migrations import HEAD_REVISION, VERSION_TABLE
from budgettune.storage.models import MEASUREMENT_KINDS
from budgettune.storage.records import StoredMeasurement, StoredWorkload
from budgettune.storage.repository import Storage

__all__ = [
    "HEAD_REVISION",
    "MEASUREMENT_KINDS",
    "VERSION_TABLE",
    "Storage",
    "StoredMeasurement",
    "StoredWorkload",
    "current_revision",
    "display_url",
    "normalize_url",
    "open_storage",
    "study_names",
    "upgrade",
]
