"""The pinned-config document (schema version 1) as frozen dataclasses, to and
from its JSON.

`build_pin` makes a `PinDocument`; `to_json_dict` writes the keys every pin has had since
sharded trials (issue 15). `from_json_dict` reads every pin budgettune wrote before as well
(the first ones lack ``baseline_status``, ``full_ac``, ``op_sac``, ``model_changes``,
``world_size`` and ``sharding``; early references lack ``runs`` and ``trial_step_time_ms``): a
missing key reads as its default. It does not validate: `parse_pin` checks a document read
from a file first (its schema version, spec and `PinFields`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from budgettune.trial.spec import TrialSpec

SCHEMA_VERSION = 1
"""The pin schema this budgettune writes and reads."""


def _int(value: Any, default: int = 0) -> int:
    return default if value is None else int(value)


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _spec(value: Any) -> TrialSpec:
    return TrialSpec.from_json_dict(value or {})


@dataclass(frozen=True, kw_only=True, slots=True)
class RankPeak:
    """One rank of a sharded pin over its fresh runs (a row of ``measured.per_rank``)."""

    rank: int
    """The global rank."""
    peak_worst_bytes: int
    """The worst peak on the pin's metric."""
    peak_allocated_bytes: int | None
    """The worst allocated peak."""
    steady_bytes: int
    """The sharded state (parameters, gradients, optimizer state) on this rank."""
    step_time_ms: float
    """The median step time."""

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "rank": self.rank,
            "peak_worst_bytes": self.peak_worst_bytes,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "steady_bytes": self.steady_bytes,
            "step_time_ms": self.step_time_ms,
        }

    @classmethod
    def from_json_dict(cls, data: Mapping[str, Any]) -> RankPeak:
        """Build from the JSON form."""
        return cls(
            rank=int(data["rank"]),
            peak_worst_bytes=_int(data.get("peak_worst_bytes")),
            peak_allocated_bytes=_optional_int(data.get("peak_allocated_bytes")),
            steady_bytes=_int(data.get("steady_bytes")),
            step_time_ms=float(data.get("step_time_ms") or 0.0),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class MemorySplit:
    """The largest rank's peak split into sharded state and activations (``measured.split``)."""

    sharded_state_bytes: int
    """Parameters, gradients and optimizer state on the rank (they scale with 1/world size)."""
    activation_bytes: int
    """The rest of the peak: activations and temporaries (not sharded)."""
    peak_allocated_bytes: int
    """The rank's allocated peak."""

    def to_json_dict(self) -> dict[str, int]:
        """The JSON form (`trial.ranks.world_size_warning` reads it)."""
        return {
            "sharded_state_bytes": self.sharded_state_bytes,
            "activation_bytes": self.activation_bytes,
            "peak_allocated_bytes": self.peak_allocated_bytes,
        }

    @classmethod
    def from_json_dict(cls, data: Mapping[str, Any]) -> MemorySplit:
        """Build from the JSON form."""
        return cls(
            sharded_state_bytes=_int(data.get("sharded_state_bytes")),
            activation_bytes=_int(data.get("activation_bytes")),
            peak_allocated_bytes=_int(data.get("peak_allocated_bytes")),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class PinMeasured:
    """The pinned configuration's figures over its fresh re-measurements (``measured``)."""

    runs: int | None = None
    """How many fresh runs the figures are of (None: not recorded)."""
    peak_median_bytes: int = 0
    """Median peak on the pin's metric."""
    peak_worst_bytes: int = 0
    """Worst peak on the pin's metric: what is checked against the limit."""
    peak_device_worst_bytes: int = 0
    """Worst device peak."""
    peak_reserved_worst_bytes: int = 0
    """Worst reserved peak."""
    peak_allocated_worst_bytes: int = 0
    """Worst allocated peak."""
    step_time_ms: float = 0.0
    """Median step time."""
    step_time_worst_ms: float = 0.0
    """Slowest run's step time."""
    steady_bytes: int = 0
    """Parameters + gradients + optimizer state (the last run's)."""
    peak_phase: str | None = None
    """Where the peak was set (the last run's)."""
    phase_peak_bytes: Mapping[str, int] = field(default_factory=dict)
    """Each phase's peak (the last run's)."""
    per_rank: tuple[RankPeak, ...] | None = None
    """Sharded pins: each rank's figures (None: not sharded)."""
    split: MemorySplit | None = None
    """Sharded pins: the largest rank's split of its peak."""

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON form (``per_rank`` and ``split`` only for a sharded pin)."""
        data: dict[str, Any] = {
            "runs": self.runs,
            "peak_median_bytes": self.peak_median_bytes,
            "peak_worst_bytes": self.peak_worst_bytes,
            "peak_device_worst_bytes": self.peak_device_worst_bytes,
            "peak_reserved_worst_bytes": self.peak_reserved_worst_bytes,
            "peak_allocated_worst_bytes": self.peak_allocated_worst_bytes,
            "step_time_ms": self.step_time_ms,
            "step_time_worst_ms": self.step_time_worst_ms,
            "steady_bytes": self.steady_bytes,
            "peak_phase": self.peak_phase,
            "phase_peak_bytes": dict(self.phase_peak_bytes),
        }
        if self.per_rank is not None:
            data["per_rank"] = [row.to_json_dict() for row in self.per_rank]
        if self.split is not None:
            data["split"] = self.split.to_json_dict()
        return data

    @classmethod
    def from_json_dict(cls, data: Mapping[str, Any]) -> PinMeasured:
        """Build from the JSON form; a missing figure reads as 0 (None for ``runs``)."""
        per_rank, split = data.get("per_rank"), data.get("split")
        return cls(
            runs=_optional_int(data.get("runs")),
            peak_median_bytes=_int(data.get("peak_median_bytes")),
            peak_worst_bytes=_int(data.get("peak_worst_bytes")),
            peak_device_worst_bytes=_int(data.get("peak_device_worst_bytes")),
            peak_reserved_worst_bytes=_int(data.get("peak_reserved_worst_bytes")),
            peak_allocated_worst_bytes=_int(data.get("peak_allocated_worst_bytes")),
            step_time_ms=float(data.get("step_time_ms") or 0.0),
            step_time_worst_ms=float(data.get("step_time_worst_ms") or 0.0),
            steady_bytes=_int(data.get("steady_bytes")),
            peak_phase=data.get("peak_phase"),
            phase_peak_bytes=dict(data.get("phase_peak_bytes") or {}),
            per_rank=None
            if per_rank is None
            else tuple(RankPeak.from_json_dict(row) for row in per_rank),
            split=None if not split else MemorySplit.from_json_dict(split),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class PinReference:
    """A configuration the pin is compared with (``baseline``, ``full_ac``, ``op_sac``)."""

    spec: TrialSpec
    """Its configuration."""
    peak_bytes: int
    """Its peak on the pin's metric (from its trial)."""
    peak_device_bytes: int | None
    """Its device peak (from its trial)."""
    step_time_ms: float
    """The median of its fresh re-measurements when some succeeded, else its trial's."""
    runs: int | None
    """Fresh re-measurements behind ``step_time_ms`` (0: the trial's figure; None: a pin
    written before references were re-measured)."""
    trial_step_time_ms: float | None
    """Its trial's own step time (None: a pin written before it was recorded)."""
    peak_phase: str | None
    """Where its peak was set."""
    slowdown: float
    """The pin's step time over this one's, minus 1."""
    fits: bool | None = None
    """``op_sac`` only: whether it fits the limit with the margin."""

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON form (``runs``, ``trial_step_time_ms`` and ``fits`` only when known)."""
        data: dict[str, Any] = {
            "spec": self.spec.to_json_dict(),
            "peak_bytes": self.peak_bytes,
            "peak_device_bytes": self.peak_device_bytes,
            "step_time_ms": self.step_time_ms,
        }
        if self.runs is not None:
            data["runs"] = self.runs
        if self.trial_step_time_ms is not None:
            data["trial_step_time_ms"] = self.trial_step_time_ms
        data["peak_phase"] = self.peak_phase
        data["slowdown"] = self.slowdown
        if self.fits is not None:
            data["fits"] = self.fits
        return data

    @classmethod
    def from_json_dict(cls, data: Mapping[str, Any]) -> PinReference:
        """Build from the JSON form."""
        fits = data.get("fits")
        return cls(
            spec=_spec(data.get("spec")),
            peak_bytes=_int(data.get("peak_bytes")),
            peak_device_bytes=_optional_int(data.get("peak_device_bytes")),
            step_time_ms=float(data.get("step_time_ms") or 0.0),
            runs=_optional_int(data.get("runs")),
            trial_step_time_ms=_optional_float(data.get("trial_step_time_ms")),
            peak_phase=data.get("peak_phase"),
            slowdown=float(data.get("slowdown") or 0.0),
            fits=None if fits is None else bool(fits),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class PinFingerprint:
    """What the pin was measured on: torch, CUDA, the GPU, and the workload's fingerprint."""

    torch_version: str = ""
    """torch's version (empty: not recorded)."""
    cuda_version: str | None = None
    """CUDA's version (None: a CPU build)."""
    device_name: str = ""
    """The device's name."""
    workload: Mapping[str, Any] = field(default_factory=dict)
    """``param_count``, ``param_bytes``, ``batch`` and ``digest`` (empty: not recorded)."""

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "torch_version": self.torch_version,
            "cuda_version": self.cuda_version,
            "device_name": self.device_name,
            "workload": dict(self.workload),
        }

    @classmethod
    def from_json_dict(cls, data: Mapping[str, Any]) -> PinFingerprint:
        """Build from the JSON form."""
        return cls(
            torch_version=str(data.get("torch_version") or ""),
            cuda_version=data.get("cuda_version"),
            device_name=str(data.get("device_name") or ""),
            workload=dict(data.get("workload") or {}),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class PinDocument:
    """A pinned configuration with its figures, references and fingerprint (schema v1)."""

    spec: TrialSpec
    """The pinned knobs."""
    workload: str
    """The workload reference it was measured on."""
    limit_bytes: int
    """The memory limit."""
    mem_metric: str
    """The metric the limit is on (device, reserved or allocated)."""
    measured: PinMeasured = field(default_factory=PinMeasured)
    """Its figures over the fresh re-measurements."""
    schema_version: int = SCHEMA_VERSION
    """The document's schema."""
    created_at: str = ""
    """When it was pinned (ISO 8601, UTC)."""
    study_name: str = ""
    """The study it came from."""
    trial_number: int | None = None
    """The trial that measured it first."""
    trials: int | None = None
    """The study's trials when it was pinned."""
    workload_options: Mapping[str, Any] = field(default_factory=dict)
    """The workload builder's options."""
    device: str = "cpu"
    """The device it was searched on (``cpu``, ``cuda``, ``cuda:N``)."""
    model_changes: tuple[str, ...] = ()
    """What the trials changed in the model besides the knobs; `compile` does it again."""
    margin: float = 0.0
    """A run fits when its peak x (1 + margin) is within the limit."""
    advice: str = ""
    """What to say about the figures (the optimizer phase, the allocator's reserve)."""
    baseline: PinReference | None = None
    """The unconstrained baseline (budget 1.0), when measured."""
    baseline_status: str = "ok"
    """``ok``, ``over_limit``, ``missing`` or the outcome that kept the baseline from running."""
    full_ac: PinReference | None = None
    """Full block AC, when the unconstrained baseline cannot run under the limit."""
    op_sac: PinReference | None = None
    """torchtitan's op SAC (sharded studies), with ``fits``."""
    world_size: int = 1
    """Ranks per trial (above 1: measured sharded)."""
    sharding: str = "none"
    """How a sharded pin was applied (`pinning.choose.SHARDING`)."""
    fingerprint: PinFingerprint = field(default_factory=PinFingerprint)
    """What it was measured on."""

    def reference(self) -> PinReference | None:
        """What the pin's headline slowdown is against: the baseline when it fits the limit,
        else full block AC (the user's alternative), else the baseline over the limit."""
        if self.baseline_status == "ok":
            return self.baseline
        return self.full_ac or self.baseline

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON document (its keys in the order `build_pin` has always written them)."""
        return {
            "schema_version": self.schema_version,
            "created_at": self.created_at,
            "study_name": self.study_name,
            "trial_number": self.trial_number,
            "trials": self.trials,
            "workload": self.workload,
            "workload_options": dict(self.workload_options),
            "device": self.device,
            "spec": self.spec.to_json_dict(),
            "model_changes": list(self.model_changes),
            "limit_bytes": self.limit_bytes,
            "mem_metric": self.mem_metric,
            "margin": self.margin,
            "measured": self.measured.to_json_dict(),
            "advice": self.advice,
            "baseline": None if self.baseline is None else self.baseline.to_json_dict(),
            "baseline_status": self.baseline_status,
            "full_ac": None if self.full_ac is None else self.full_ac.to_json_dict(),
            "op_sac": None if self.op_sac is None else self.op_sac.to_json_dict(),
            "world_size": self.world_size,
            "sharding": self.sharding,
            "fingerprint": self.fingerprint.to_json_dict(),
        }

    @classmethod
    def from_json_dict(cls, data: Mapping[str, Any]) -> PinDocument:
        """Read a pin document; a key missing (an older pin) takes its default.

        Raises:
            SpecError: a spec this budgettune cannot read.
        """

        def reference(key: str) -> PinReference | None:
            value = data.get(key)
            return PinReference.from_json_dict(value) if value else None

        return cls(
            schema_version=_int(data.get("schema_version"), SCHEMA_VERSION),
            created_at=str(data.get("created_at") or ""),
            study_name=str(data.get("study_name") or ""),
            trial_number=_optional_int(data.get("trial_number")),
            trials=_optional_int(data.get("trials")),
            workload=str(data.get("workload") or ""),
            workload_options=dict(data.get("workload_options") or {}),
            device=str(data.get("device") or "cpu"),
            spec=_spec(data.get("spec")),
            model_changes=tuple(data.get("model_changes") or ()),
            limit_bytes=_int(data.get("limit_bytes")),
            mem_metric=str(data.get("mem_metric") or "device"),
            margin=float(data.get("margin") or 0.0),
            measured=PinMeasured.from_json_dict(data.get("measured") or {}),
            advice=str(data.get("advice") or ""),
            baseline=reference("baseline"),
            baseline_status=str(data.get("baseline_status") or "ok"),
            full_ac=reference("full_ac"),
            op_sac=reference("op_sac"),
            world_size=_int(data.get("world_size"), 1),
            sharding=str(data.get("sharding") or "none"),
            fingerprint=PinFingerprint.from_json_dict(data.get("fingerprint") or {}),
        )
