"""`Storage`: Optuna's RDBStorage plus our ``bt_`` tables on one database URL.

Every write is one short transaction. Reads and writes return frozen dataclasses
(`budgettune.storage.records`); no ORM object leaves this package.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import optuna
from sqlalchemy import Engine, select
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from budgettune.errors import PinnedConfigError, StorageError, one_line
from budgettune.storage.engine import display_url, driver_line
from budgettune.storage.models import (
    MEASUREMENT_KINDS,
    MeasurementRow,
    PinRow,
    WorkloadRow,
)
from budgettune.storage.records import (
    StoredMeasurement,
    StoredWorkload,
    dumps,
    measurement_columns,
    stored_measurement,
    stored_workload,
)
from budgettune.trial.results import TrialResult
from budgettune.trial.spec import TrialSpec


class Storage:
    """One open study storage. Create it with `budgettune.storage.open_storage`."""

    def __init__(self, *, url: str, engine: Engine, optuna_storage: optuna.storages.RDBStorage):
        self._url = url
        self._engine = engine
        self._optuna_storage = optuna_storage
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @property
    def url(self) -> str:
        """The storage URL, password included (pass it to subprocesses, never print it)."""
        return self._url

    @property
    def display_url(self) -> str:
        """The storage URL with its password masked, for messages."""
        return display_url(self._url)

    @property
    def optuna_storage(self) -> optuna.storages.RDBStorage:
        """Optuna's RDBStorage on the same database (for `optuna.create_study` and friends)."""
        return self._optuna_storage

    def close(self) -> None:
        """Release the connection pools."""
        self._engine.dispose()
        self._optuna_storage.engine.dispose()

    def __enter__(self) -> Storage:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Storage({self.display_url!r})"

    @contextmanager
    def _transaction(self) -> Iterator[Session]:
        try:
            with self._sessions.begin() as session:
                yield session
        except IntegrityError:
            raise
        except DBAPIError as exc:
            raise StorageError(f"storage {self.display_url}: {driver_line(exc)}") from exc

    def study_names(self) -> list[str]:
        """Names of the Optuna studies in this storage, sorted."""
        return sorted(s.study_name for s in self._optuna_storage.get_all_studies())

    def record_workload(
        self, *, ref: str, options: Mapping[str, Any], fingerprint: Mapping[str, Any]
    ) -> str:
        """Record a workload once per fingerprint digest (a second call is a no-op).

        Args:
            ref: the workload reference.
            options: builder keyword arguments (JSON-serialisable).
            fingerprint: ``param_count``, ``param_bytes``, ``batch`` (list of strings), ``digest``.

        Returns:
            The digest.
        """
        digest = str(fingerprint["digest"])
        row = WorkloadRow(
            digest=digest,
            ref=ref,
            options_json=dumps(dict(options)),
            param_count=int(fingerprint["param_count"]),
            param_bytes=int(fingerprint["param_bytes"]),
            batch_json=dumps([str(item) for item in fingerprint["batch"]]),
        )
        if self.workload(digest) is not None:
            return digest
        try:
            with self._transaction() as session:
                session.add(row)
        except IntegrityError:
            pass  # another process recorded the same digest between our check and insert
        return digest

    def workload(self, digest: str) -> StoredWorkload | None:
        """The recorded workload with this digest, or None."""
        with self._transaction() as session:
            row = session.scalars(select(WorkloadRow).where(WorkloadRow.digest == digest)).first()
            return None if row is None else stored_workload(row)

    def record_measurement(
        self,
        *,
        study_name: str,
        trial_number: int | None,
        kind: str,
        workload_digest: str | None,
        spec: TrialSpec,
        result: TrialResult,
    ) -> int:
        """Store one run of ``spec`` (figures, phase peaks, error, versions) in one transaction.

        Args:
            study_name: the Optuna study.
            trial_number: the Optuna trial number, None outside the ask/tell loop.
            kind: ``trial``, ``reverify`` or ``verify``.
            workload_digest: the digest given by `record_workload`, if any.
            spec: the configuration measured.
            result: what the child reported.

        Returns:
            The row id.

        Raises:
            ValueError: on an unknown ``kind``.
        """
        if kind not in MEASUREMENT_KINDS:
            raise ValueError(f"unknown measurement kind {kind!r}; one of {MEASUREMENT_KINDS}")
        row = MeasurementRow(
            study_name=study_name,
            trial_number=trial_number,
            kind=kind,
            workload_digest=workload_digest,
            **measurement_columns(spec, result),
        )
        with self._transaction() as session:
            session.add(row)
            session.flush()
            return row.id

    def measurements(self, study_name: str, *, kind: str | None = None) -> list[StoredMeasurement]:
        """The stored runs of a study in insertion order, optionally of one ``kind`` only."""
        query = (
            select(MeasurementRow, WorkloadRow)
            .outerjoin(WorkloadRow, WorkloadRow.digest == MeasurementRow.workload_digest)
            .where(MeasurementRow.study_name == study_name)
            .order_by(MeasurementRow.id)
        )
        if kind is not None:
            query = query.where(MeasurementRow.kind == kind)
        with self._transaction() as session:
            return [stored_measurement(row, workload) for row, workload in session.execute(query)]

    def record_pin(
        self,
        *,
        study_name: str,
        pin: Mapping[str, Any],
        peak_bytes: int,
        step_time_ms: float,
        slowdown: float | None,
        limit_bytes: int,
        mem_metric: str,
    ) -> int:
        """Store a pinned config (the JSON document) with its headline figures.

        Returns:
            The row id; the newest pin of a study is its current one (`latest_pin`).
        """
        row = PinRow(
            study_name=study_name,
            pin_json=json.dumps(dict(pin), sort_keys=True),
            peak_bytes=int(peak_bytes),
            step_time_ms=float(step_time_ms),
            slowdown=None if slowdown is None or math.isnan(slowdown) else float(slowdown),
            limit_bytes=int(limit_bytes),
            mem_metric=mem_metric,
        )
        with self._transaction() as session:
            session.add(row)
            session.flush()
            return row.id

    def latest_pin(self, study_name: str) -> Mapping[str, Any] | None:
        """The newest pinned config JSON recorded for a study, or None."""
        query = (
            select(PinRow.pin_json)
            .where(PinRow.study_name == study_name)
            .order_by(PinRow.id.desc())
            .limit(1)
        )
        with self._transaction() as session:
            text = session.scalars(query).first()
        if text is None:
            return None
        try:
            value = json.loads(text)
        except (ValueError, RecursionError) as exc:  # a corrupt row (issue 48): one line
            raise PinnedConfigError(
                f"the stored pin of study {study_name!r} is not readable JSON "
                f"({one_line(exc, with_type=True)[:120]})"
            ) from None
        if not isinstance(value, dict):
            raise PinnedConfigError(
                f"the stored pin of study {study_name!r} is a JSON {type(value).__name__}, "
                "not an object"
            )
        return value
