"""What budgettune keeps in Optuna's user attrs: every key, and `TrialRecord`, the typed form of
what one trial stored (`TrialRecord.from_result(...).to_attrs()`, read back by the search,
`show` and the dashboard through `TrialRecord.from_attrs`; any Optuna tool can read them).
Optuna keeps them as JSON; a study written by an older budgettune lacks the keys added since,
and a missing key reads as its default (None: not measured), with no schema change of ours.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from budgettune.storage.records import StoredFigures
from budgettune.trial.phases import check_phases
from budgettune.trial.results import RankFigures, TrialOutcome, TrialResult
from budgettune.trial.spec import TrialSpec

# -- study user attrs -------------------------------------------------------------------------
SEARCH_ATTR = "search"
"""Study user attr: what must stay the same when the study is resumed (`search.study_attrs`)."""
SPEC_ATTR = "search_spec"
"""Study user attr: the whole `SearchSpec` (JSON, no storage URL), read by workers."""
HEARTBEAT_ATTR = "heartbeat_s"
"""Study user attr: the one trial-heartbeat interval of every process that runs its trials
(a worker's stale-trial check must not fail a trial whose process beats more slowly)."""
TARGET_ATTR = "target_trials"
"""Study user attr: the number of counted trials the study's workers run up to."""
LIVE_ATTR = "live_searches"
"""Study user attr: the searches adding trials to it now (`study.live_searches`)."""
SETTLED_ATTR = "settled"
"""Study user attr: ``{knob: {"value": ..., "reason": ...}}``, the free choices the opening
held for the rest of the study (`study.structured`)."""
EXCLUDED_ATTR = "excluded"
"""Study user attr: knob values the search no longer proposes, each a dict with ``knob``,
``value``, ``reason``, ``error`` and ``trials`` (written by `study.crash_memory`)."""

# -- trial attrs ------------------------------------------------------------------------------
BASELINE_ATTR = "baseline"
"""Trial user attr naming an enqueued baseline (``unconstrained``, ``block-ac-every-1``, ...)."""
ENQUEUED_SPEC_ATTR = "enqueued_spec"
"""Trial user attr of a queued trial: the `TrialSpec` it measures exactly (a baseline)."""
WORKER_ATTR = "worker"
"""Trial user attr: ``host:device`` of the worker that ran it (throughput per worker)."""
CONSTRAINT_ATTR = "constraint"
"""Trial user attr: ``[peak x (1 + margin) - limit]``, Optuna's constraint (<= 0 fits)."""
ERROR_ATTR = "error"
"""Trial user attr: one line on why the trial failed."""
RETRY_HISTORY_ATTR = "retry_history"
"""Trial *system* attr written by Optuna's stale-trial retry: the trials this one re-runs."""

_MEASURED = (
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "peak_device_bytes",
    "steady_bytes",
    "phase_peak_bytes",
    "peak_phase",
    "step_time_ms",
    "step_time_p10_ms",
    "step_time_p90_ms",
    "compile_s",
    "loss",
    "grad_norm",
    "host_peak_bytes",
    "offload_bytes",
)
"""The keys of a measured trial's figures (`Measurement`'s fields), in the order written."""
_SINCE_OFFLOAD = ("host_peak_bytes", "offload_bytes")
"""Figures a trial stored before offload was measured lacks (written only when known)."""
_RANK_FIGURES = (*_MEASURED[:4], "peak_phase", "step_time_ms")
"""The figures each rank of a sharded trial keeps (`RankRecord`)."""


def _finite(value: Any) -> bool:
    # SQLite-backed attrs are JSON: a NaN loss may come back as NaN or as null
    return isinstance(value, int | float) and math.isfinite(value)


def _first_step(attrs: Mapping[str, Any], key: str) -> float | None:
    """A first-step figure: None when not stored; NaN when stored but not a finite number
    (NaN, infinity or null), so it reads as non-finite."""
    if key not in attrs:
        return None
    value = attrs[key]
    return float(value) if _finite(value) else math.nan


def _phases(value: Any) -> dict[str, float]:
    """Stored phases; anything that is not phases (written by hand) reads as none."""
    if value is None:
        return {}
    try:
        return check_phases(value)
    except ValueError:
        return {}


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True, kw_only=True, slots=True)
class RankRecord:
    """One rank of a sharded trial as its ``ranks`` user attr holds it."""

    rank: int
    """The global rank."""
    outcome: str
    """How this rank ended (a `TrialOutcome` value)."""
    error: str = ""
    """One line when it did not end ``ok``."""
    peak_allocated_bytes: int | None = None
    """This rank's allocated peak (None: it measured nothing)."""
    peak_reserved_bytes: int | None = None
    """This rank's reserved peak."""
    peak_device_bytes: int | None = None
    """This rank's device peak."""
    steady_bytes: int | None = None
    """This rank's parameters + gradients + optimizer state."""
    peak_phase: str | None = None
    """Where this rank's peak was set."""
    step_time_ms: float | None = None
    """This rank's median step time."""

    def peak_bytes(self, mem_metric: str) -> int | None:
        """The peak on ``mem_metric`` (device, reserved or allocated), None if not measured."""
        return _peak(self, mem_metric)

    @classmethod
    def from_rank(cls, rank: RankFigures) -> RankRecord:
        """The record of one rank's figures."""
        m = rank.measurement
        measured = {} if m is None else {key: getattr(m, key) for key in _RANK_FIGURES}
        return cls(rank=rank.rank, outcome=rank.outcome.value, error=rank.error, **measured)

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON form: the error only when there is one, the figures only when measured."""
        figures: dict[str, Any] = {"rank": self.rank, "outcome": self.outcome}
        if self.error:
            figures["error"] = self.error
        if self.step_time_ms is not None:
            figures.update({key: getattr(self, key) for key in _RANK_FIGURES})
        return figures

    @classmethod
    def from_json_dict(cls, data: Mapping[str, Any]) -> RankRecord:
        """Build from the JSON form (missing figures read as None)."""
        return cls(
            rank=int(data["rank"]),
            outcome=str(data.get("outcome", "")),
            error=str(data.get("error") or ""),
            peak_allocated_bytes=_optional_int(data.get("peak_allocated_bytes")),
            peak_reserved_bytes=_optional_int(data.get("peak_reserved_bytes")),
            peak_device_bytes=_optional_int(data.get("peak_device_bytes")),
            steady_bytes=_optional_int(data.get("steady_bytes")),
            peak_phase=data.get("peak_phase"),
            step_time_ms=_optional_float(data.get("step_time_ms")),
        )


def _peak(record: RankRecord | TrialRecord, mem_metric: str) -> int | None:
    peaks = {
        "device": record.peak_device_bytes,
        "reserved": record.peak_reserved_bytes,
        "allocated": record.peak_allocated_bytes,
    }
    if mem_metric not in peaks:
        raise KeyError(f"peak_{mem_metric}_bytes")
    return peaks[mem_metric]


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialRecord(StoredFigures):
    """What one trial stored in its user attrs: its queue labels, its result and figures (the
    figures' fields are `StoredFigures`').

    A field whose attr is missing (not measured, not yet run, or a study written before the
    attr existed) holds its default; `from_attrs` and `to_attrs` are each other's inverse.
    """

    baseline: str | None = None
    """The baseline this trial measures (`BASELINE_ATTR`), or None for a sampled trial."""
    enqueued_spec: TrialSpec | None = None
    """The configuration a queued trial measures exactly (`ENQUEUED_SPEC_ATTR`)."""
    worker: str | None = None
    """``host:device`` of the worker that ran it (`WORKER_ATTR`)."""
    violation_bytes: float | None = None
    """``peak x (1 + margin) - limit`` (`CONSTRAINT_ATTR`; <= 0 fits), None if not stored."""
    stored_outcome: str | None = None
    """The ``outcome`` attr as stored (None: no result yet); `outcome` reads it."""
    error: str = ""
    """One line on why it failed (empty when it did not)."""
    failed_stage: str | None = None
    """Where it failed (``workload``: before any knob mattered)."""
    spec: TrialSpec | None = None
    """The configuration measured (None before a result)."""
    log_path: str = ""
    """The child's log file."""
    wall_s: float | None = None
    """Seconds the trial took, start to result."""
    device_name: str = ""
    """The device it ran on."""
    torch_version: str = ""
    """The torch version it ran with."""
    world_size: int = 1
    """Ranks per trial (above 1: sharded; the largest rank's peak, the slowest rank's step)."""
    model_changes: tuple[str, ...] = ()
    """What the trial changed in the model besides the knobs (``use_cache=False``)."""
    failed_rank: int | None = None
    """Sharded trials: the rank whose failure ended the trial."""
    ranks: tuple[RankRecord, ...] = ()
    """Sharded trials: each rank's figures, by rank."""
    phases_s: Mapping[str, float] = field(default_factory=dict)
    """Seconds of each phase of the trial's process (`TrialResult.phases_s`; empty when the
    trial was stored before phases were recorded)."""

    # -- reading ----------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        """Whether a result was stored (any outcome, known to this budgettune or not)."""
        return self.stored_outcome is not None

    @property
    def outcome(self) -> TrialOutcome | None:
        """The outcome; None while there is none (queued, running, interrupted) or when it
        names one this budgettune does not know.

        A trial stored ``ok`` with a non-finite first-step loss or grad norm (written before
        ``non_finite`` existed) reads as ``non_finite``: it was never a configuration to pin.
        """
        try:
            outcome = TrialOutcome(self.stored_outcome)
        except ValueError:
            return None
        if outcome is TrialOutcome.OK and any(
            value is not None and not math.isfinite(value) for value in (self.loss, self.grad_norm)
        ):
            return TrialOutcome.NON_FINITE
        return outcome

    @property
    def outcome_label(self) -> str:
        """The outcome as shown: the known one's value, else the stored text, else empty."""
        outcome = self.outcome
        return outcome.value if outcome is not None else self.stored_outcome or ""

    @property
    def measured(self) -> bool:
        """Whether it has a step time (and so the memory figures)."""
        return self.step_time_ms is not None

    def peak_bytes(self, mem_metric: str) -> int | None:
        """The peak on ``mem_metric`` (device, reserved or allocated), None if not measured."""
        return _peak(self, mem_metric)

    def first_step(self) -> dict[str, float] | None:
        """First-step ``loss`` and ``grad_norm`` (the numerics reference), when both are in."""
        if self.loss is None or self.grad_norm is None:
            return None
        return {"loss": self.loss, "grad_norm": self.grad_norm}

    def fits(self) -> bool:
        """Whether its stored constraint says it fits (a trial with none does not)."""
        return self.violation_bytes is not None and self.violation_bytes <= 0

    # -- conversion -------------------------------------------------------------------------
    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> TrialRecord:
        """Read a trial's user attrs; a missing key takes the field's default.

        Raises:
            SpecError: a stored spec this budgettune cannot read.
        """
        spec, enqueued = attrs.get("spec"), attrs.get(ENQUEUED_SPEC_ATTR)
        constraint = attrs.get(CONSTRAINT_ATTR)
        return cls(
            baseline=attrs.get(BASELINE_ATTR),
            enqueued_spec=None if enqueued is None else TrialSpec.from_json_dict(enqueued),
            worker=attrs.get(WORKER_ATTR),
            violation_bytes=float(constraint[0]) if constraint else None,
            stored_outcome=None if attrs.get("outcome") is None else str(attrs["outcome"])[:200],
            error=str(attrs.get(ERROR_ATTR) or ""),
            failed_stage=attrs.get("failed_stage"),
            spec=None if spec is None else TrialSpec.from_json_dict(spec),
            log_path=str(attrs.get("log_path") or ""),
            wall_s=_optional_float(attrs.get("wall_s")),
            device_name=str(attrs.get("device_name") or ""),
            torch_version=str(attrs.get("torch_version") or ""),
            world_size=int(attrs.get("world_size") or 1),
            model_changes=tuple(attrs.get("model_changes") or ()),
            failed_rank=_optional_int(attrs.get("failed_rank")),
            ranks=tuple(RankRecord.from_json_dict(r) for r in attrs.get("ranks") or ()),
            phases_s=_phases(attrs.get("phases_s")),
            peak_allocated_bytes=_optional_int(attrs.get("peak_allocated_bytes")),
            peak_reserved_bytes=_optional_int(attrs.get("peak_reserved_bytes")),
            peak_device_bytes=_optional_int(attrs.get("peak_device_bytes")),
            steady_bytes=_optional_int(attrs.get("steady_bytes")),
            phase_peak_bytes=dict(attrs.get("phase_peak_bytes") or {}),
            peak_phase=None if attrs.get("peak_phase") is None else str(attrs["peak_phase"])[:200],
            step_time_ms=_optional_float(attrs.get("step_time_ms")),
            step_time_p10_ms=_optional_float(attrs.get("step_time_p10_ms")),
            step_time_p90_ms=_optional_float(attrs.get("step_time_p90_ms")),
            compile_s=_optional_float(attrs.get("compile_s")),
            loss=_first_step(attrs, "loss"),
            grad_norm=_first_step(attrs, "grad_norm"),
            host_peak_bytes=_optional_int(attrs.get("host_peak_bytes")),
            offload_bytes=_optional_int(attrs.get("offload_bytes")),
        )

    @classmethod
    def from_result(cls, spec: TrialSpec, result: TrialResult) -> TrialRecord:
        """The record of a finished trial's result (queue labels and constraint not set)."""
        m = result.measurement
        figures: dict[str, Any] = {}
        if m is not None:
            figures = {key: getattr(m, key) for key in _MEASURED}
            figures["phase_peak_bytes"] = dict(m.phase_peak_bytes)
        return cls(
            stored_outcome=result.outcome.value,
            error=result.error,
            failed_stage=result.failed_stage,
            spec=spec,
            log_path=result.log_path,
            wall_s=round(result.wall_s, 3),
            device_name=result.device_name,
            torch_version=result.torch_version,
            world_size=result.world_size,
            model_changes=tuple(result.model_changes),
            failed_rank=result.failed_rank if result.world_size > 1 else None,
            ranks=tuple(RankRecord.from_rank(r) for r in result.ranks)
            if result.world_size > 1
            else (),
            phases_s=dict(result.phases_s),
            **figures,
        )

    def to_attrs(self) -> dict[str, Any]:
        """The user attrs: queue labels and constraint when set; the result once there is one
        (figures when measured, per-rank figures for a sharded trial)."""
        attrs: dict[str, Any] = {}
        if self.baseline is not None:
            attrs[BASELINE_ATTR] = self.baseline
        if self.enqueued_spec is not None:
            attrs[ENQUEUED_SPEC_ATTR] = self.enqueued_spec.to_json_dict()
        if self.worker is not None:
            attrs[WORKER_ATTR] = self.worker
        if self.stored_outcome is not None:
            attrs.update(self._result_attrs())
        if self.violation_bytes is not None:
            attrs[CONSTRAINT_ATTR] = [self.violation_bytes]
        return attrs

    def _result_attrs(self) -> dict[str, Any]:
        attrs: dict[str, Any] = {
            "outcome": self.stored_outcome,
            ERROR_ATTR: self.error,
            "failed_stage": self.failed_stage,
            "spec": None if self.spec is None else self.spec.to_json_dict(),
            "log_path": self.log_path,
            "wall_s": self.wall_s,
            "device_name": self.device_name,
            "torch_version": self.torch_version,
            "world_size": self.world_size,
        }
        if self.model_changes:
            attrs["model_changes"] = list(self.model_changes)
        if self.phases_s:
            attrs["phases_s"] = dict(self.phases_s)
        if self.world_size > 1:
            attrs["failed_rank"] = self.failed_rank
            attrs["ranks"] = [r.to_json_dict() for r in self.ranks]
        if self.step_time_ms is not None:
            attrs.update(
                {
                    key: getattr(self, key)
                    for key in _MEASURED
                    if key not in _SINCE_OFFLOAD or getattr(self, key) is not None
                }
            )
            attrs["phase_peak_bytes"] = dict(self.phase_peak_bytes)
        return attrs


def result_attrs(spec: TrialSpec, result: TrialResult) -> dict[str, Any]:
    """Everything measured, as trial user attrs any Optuna tool can read."""
    return TrialRecord.from_result(spec, result).to_attrs()


def violation_of(attrs: Mapping[str, Any]) -> float:
    """The stored constraint (`CONSTRAINT_ATTR`), infinite when there is none: read alone
    because the sampler asks for it of every trial at every sample."""
    constraint = attrs.get(CONSTRAINT_ATTR)
    return float(constraint[0]) if constraint else math.inf
