"""What the storage hands out: frozen dataclasses, and their conversion from and to rows."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from budgettune.storage.models import MeasurementRow, WorkloadRow
from budgettune.trial.phases import check_phases
from budgettune.trial.results import Measurement, TrialOutcome, TrialResult
from budgettune.trial.spec import TrialSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class StoredWorkload:
    """A workload as recorded: its reference, builder options and fingerprint."""

    digest: str
    """The fingerprint digest (the workload's identity)."""
    ref: str
    """The workload reference (``builtin:NAME``, ``file.py:fn``, ``pkg.mod:fn``)."""
    options: Mapping[str, Any]
    """Keyword arguments given to the builder."""
    param_count: int
    """Number of parameters."""
    param_bytes: int
    """Bytes of the parameters."""
    batch: tuple[str, ...]
    """Shape and dtype of every batch tensor, as the fingerprint writes them."""
    created_at: datetime
    """When it was first recorded (UTC)."""

    def fingerprint(self) -> dict[str, Any]:
        """The fingerprint mapping (``param_count``, ``param_bytes``, ``batch``, ``digest``)."""
        return {
            "param_count": self.param_count,
            "param_bytes": self.param_bytes,
            "batch": list(self.batch),
            "digest": self.digest,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class StoredFigures:
    """A run's measured figures as stored (None: not measured), in our table and in Optuna's
    user attrs alike (`StoredMeasurement`, `storage.user_attrs.TrialRecord`); see
    `trial.results.Measurement` for what each is."""

    peak_allocated_bytes: int | None = None
    """The allocator's allocated peak."""
    peak_reserved_bytes: int | None = None
    """The allocator's reserved peak."""
    peak_device_bytes: int | None = None
    """What nvidia-smi would show at the peak."""
    steady_bytes: int | None = None
    """Parameters + gradients + optimizer state before the step."""
    phase_peak_bytes: Mapping[str, int] = field(default_factory=dict)
    """The peak of each phase (forward, backward, optimizer)."""
    peak_phase: str | None = None
    """The phase that set the peak."""
    step_time_ms: float | None = None
    """Median step time."""
    step_time_p10_ms: float | None = None
    """10th percentile of the step time."""
    step_time_p90_ms: float | None = None
    """90th percentile of the step time."""
    compile_s: float | None = None
    """Seconds of the warm-up steps (compile)."""
    loss: float | None = None
    """First-step loss (None: not stored; NaN: stored, but not a finite number)."""
    grad_norm: float | None = None
    """First-step gradient norm (as ``loss``)."""
    host_peak_bytes: int | None = None
    """Host memory held for offloaded activations, at most (0: no offload; None: not stored,
    a run from before offload was measured)."""
    offload_bytes: int | None = None
    """Bytes the measured step copied to host memory (as many came back)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StoredMeasurement(StoredFigures):
    """One stored run of a TrialSpec; `to_result` gives back the `TrialResult`."""

    id: int
    """Row id (increases with insertion order)."""
    study_name: str
    """The Optuna study it belongs to."""
    trial_number: int | None
    """Optuna trial number; None for runs outside the ask/tell loop (e.g. ``verify``)."""
    kind: str
    """``trial``, ``reverify`` or ``verify``."""
    workload_digest: str | None
    """Digest of the workload measured, when recorded."""
    spec: TrialSpec
    """The configuration measured."""
    outcome: TrialOutcome
    """How the run ended."""
    error: str = ""
    """One-line error of a failed run."""
    device_name: str = ""
    torch_version: str = ""
    cuda_version: str = ""
    log_path: str = ""
    wall_s: float = 0.0
    """Wall time of the child process."""
    phases_s: Mapping[str, float] = field(default_factory=dict)
    """Seconds of each phase of the process (`TrialResult.phases_s`; empty before 0004)."""
    cold_caches: bool = False
    """It started with empty compile caches (`TrialResult.cold_caches`; False before 0005)."""
    workload_fingerprint: Mapping[str, Any] | None = None
    """The fingerprint of the recorded workload with this digest, if recorded."""
    created_at: datetime
    """When it was stored (UTC)."""

    @property
    def has_measurement(self) -> bool:
        """Whether memory and time figures were stored."""
        return self.peak_allocated_bytes is not None

    def measurement(self) -> Measurement | None:
        """The figures as a `Measurement` (None when the run produced none)."""
        if not self.has_measurement:
            return None
        return Measurement(
            peak_allocated_bytes=_int(self.peak_allocated_bytes),
            peak_reserved_bytes=_int(self.peak_reserved_bytes),
            peak_device_bytes=_int(self.peak_device_bytes),
            steady_bytes=_int(self.steady_bytes),
            phase_peak_bytes=dict(self.phase_peak_bytes),
            peak_phase=self.peak_phase or "forward",
            step_time_ms=_float(self.step_time_ms),
            step_time_p10_ms=_float(self.step_time_p10_ms),
            step_time_p90_ms=_float(self.step_time_p90_ms),
            compile_s=_float(self.compile_s),
            loss=_float(self.loss),
            grad_norm=_float(self.grad_norm),
            host_peak_bytes=_int(self.host_peak_bytes),
            offload_bytes=_int(self.offload_bytes),
        )

    def to_result(self) -> TrialResult:
        """The `TrialResult` this row was recorded from."""
        return TrialResult(
            outcome=self.outcome,
            measurement=self.measurement(),
            error=self.error,
            device_name=self.device_name,
            torch_version=self.torch_version,
            cuda_version=self.cuda_version,
            log_path=self.log_path,
            wall_s=self.wall_s,
            phases_s=dict(self.phases_s),
            cold_caches=self.cold_caches,
            workload_fingerprint=(
                None if self.workload_fingerprint is None else dict(self.workload_fingerprint)
            ),
        )


def _read_outcome(row: MeasurementRow) -> TrialOutcome:
    """The row's outcome; an ``ok`` with a non-finite loss or grad norm (stored before the
    ``non_finite`` outcome existed; SQLite keeps a NaN as NULL) reads as ``non_finite``."""
    outcome = TrialOutcome(row.outcome)
    if outcome is TrialOutcome.OK and not all(
        value is not None and math.isfinite(value) for value in (row.loss, row.grad_norm)
    ):
        return TrialOutcome.NON_FINITE
    return outcome


def _phases(text: str | None) -> dict[str, float]:
    """A row's phases; a column that is not phases JSON (written by hand) reads as none."""
    if not text:
        return {}
    try:
        return check_phases(json.loads(text))
    except ValueError:  # json.JSONDecodeError is one
        return {}


def _int(value: int | None) -> int:
    return 0 if value is None else int(value)


def _float(value: float | None) -> float:
    # SQLite stores NaN as NULL; a diverged loss comes back as NaN, not as a missing value.
    return math.nan if value is None else float(value)


def as_utc(value: datetime) -> datetime:
    """SQLite returns naive datetimes; every stored time is UTC."""
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value


def dumps(data: Any) -> str:
    """Canonical JSON for a column."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def measurement_columns(spec: TrialSpec, result: TrialResult) -> dict[str, Any]:
    """Column values of a `MeasurementRow` for a spec and its result."""
    columns: dict[str, Any] = {
        "spec_json": dumps(spec.to_json_dict()),
        "outcome": result.outcome.value,
        "error": result.error,
        "device_name": result.device_name,
        "torch_version": result.torch_version,
        "cuda_version": result.cuda_version,
        "log_path": result.log_path,
        "wall_s": float(result.wall_s),
        "phases_json": dumps(dict(result.phases_s)) if result.phases_s else None,
        "cold_caches": result.cold_caches,
    }
    figures = result.measurement
    if figures is not None:
        columns.update(
            peak_allocated_bytes=figures.peak_allocated_bytes,
            peak_reserved_bytes=figures.peak_reserved_bytes,
            peak_device_bytes=figures.peak_device_bytes,
            steady_bytes=figures.steady_bytes,
            phase_peaks_json=dumps(dict(figures.phase_peak_bytes)),
            peak_phase=figures.peak_phase,
            step_time_ms=figures.step_time_ms,
            step_time_p10_ms=figures.step_time_p10_ms,
            step_time_p90_ms=figures.step_time_p90_ms,
            compile_s=figures.compile_s,
            loss=figures.loss,
            grad_norm=figures.grad_norm,
            host_peak_bytes=figures.host_peak_bytes,
            offload_bytes=figures.offload_bytes,
        )
    return columns


def stored_workload(row: WorkloadRow) -> StoredWorkload:
    """A `WorkloadRow` as a frozen dataclass."""
    return StoredWorkload(
        digest=row.digest,
        ref=row.ref,
        options=json.loads(row.options_json),
        param_count=row.param_count,
        param_bytes=row.param_bytes,
        batch=tuple(json.loads(row.batch_json)),
        created_at=as_utc(row.created_at),
    )


def stored_measurement(
    row: MeasurementRow, workload: WorkloadRow | None = None
) -> StoredMeasurement:
    """A `MeasurementRow` (and its workload, if recorded) as a frozen dataclass."""
    return StoredMeasurement(
        id=row.id,
        study_name=row.study_name,
        trial_number=row.trial_number,
        kind=row.kind,
        workload_digest=row.workload_digest,
        spec=TrialSpec.from_json_dict(json.loads(row.spec_json)),
        outcome=_read_outcome(row),
        peak_allocated_bytes=row.peak_allocated_bytes,
        peak_reserved_bytes=row.peak_reserved_bytes,
        peak_device_bytes=row.peak_device_bytes,
        steady_bytes=row.steady_bytes,
        phase_peak_bytes=json.loads(row.phase_peaks_json) if row.phase_peaks_json else {},
        peak_phase=row.peak_phase,
        step_time_ms=row.step_time_ms,
        step_time_p10_ms=row.step_time_p10_ms,
        step_time_p90_ms=row.step_time_p90_ms,
        compile_s=row.compile_s,
        loss=row.loss,
        grad_norm=row.grad_norm,
        host_peak_bytes=row.host_peak_bytes,
        offload_bytes=row.offload_bytes,
        error=row.error,
        device_name=row.device_name,
        torch_version=row.torch_version,
        cuda_version=row.cuda_version or "",
        log_path=row.log_path,
        wall_s=row.wall_s,
        phases_s=_phases(row.phases_json),
        cold_caches=bool(row.cold_caches),
        workload_fingerprint=None if workload is None else stored_workload(workload).fingerprint(),
        created_at=as_utc(row.created_at),
    )


@dataclass(frozen=True)
class StudyLimit:
    """The limit a study searches under, as its ``search`` user attr
    (`user_attrs.SEARCH_ATTR`) records it: the one reading of those keys for `show`, the
    dashboard and the study note."""

    mem_metric: str = "device"
    max_mem_bytes: int = 0
    margin: float = 0.0

    @classmethod
    def of(cls, search: Mapping[str, Any] | None) -> StudyLimit:
        """From a study's ``search`` attr value (missing keys: no limit recorded)."""
        search = search or {}
        return cls(
            mem_metric=str(search.get("mem_metric", "device")),
            max_mem_bytes=int(search.get("max_mem_bytes", 0)),
            margin=float(search.get("margin", 0.0)),
        )
