"""The figures of a pinned-config document (`document.PinDocument`): the pin's own
(`PinMeasured`, with each rank's `RankPeak` and the `MemorySplit` of a sharded pin) and those
of the configurations it is compared with (`PinReference`). Frozen dataclasses, to and from
their JSON; a key missing (an older pin) reads as its default."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from budgettune.trial.spec import TrialSpec


def as_int(value: Any, default: int = 0) -> int:
    """A stored integer, ``default`` when missing."""
    return default if value is None else int(value)


def optional_int(value: Any) -> int | None:
    """A stored integer, None when missing."""
    return None if value is None else int(value)


def optional_float(value: Any) -> float | None:
    """A stored number, None when missing."""
    return None if value is None else float(value)


def spec_of(value: Any) -> TrialSpec:
    """A stored spec (an empty one: the defaults)."""
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
            peak_worst_bytes=as_int(data.get("peak_worst_bytes")),
            peak_allocated_bytes=optional_int(data.get("peak_allocated_bytes")),
            steady_bytes=as_int(data.get("steady_bytes")),
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
            sharded_state_bytes=as_int(data.get("sharded_state_bytes")),
            activation_bytes=as_int(data.get("activation_bytes")),
            peak_allocated_bytes=as_int(data.get("peak_allocated_bytes")),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class PinMeasured:
    """The pinned configuration's figures over its fresh re-measurements (``measured``)."""

    runs: int | None = None
    """How many fresh runs the figures are of (None: not recorded)."""
    cold_runs: int | None = None
    """How many of them started with empty compile caches, as a job on a fresh host does
    (their peaks are among those the worst is taken of; None: not recorded)."""
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
    step_time_range_ms: tuple[float, float] | None = None
    """The fastest and the slowest run's step time: the spread beside the median (None: a
    pin written before issue 45)."""
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
    host_peak_worst_bytes: int = 0
    """Offloading pins: the most host memory a run's offloaded activations held (all ranks)."""
    offload_bytes: int = 0
    """Offloading pins: bytes a step copies to host memory, and back (the last run's; the
    largest rank's)."""

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON form (``per_rank`` and ``split`` only for a sharded pin, the host figures
        only for one that offloads)."""
        data: dict[str, Any] = {
            "runs": self.runs,
            "cold_runs": self.cold_runs,
            "peak_median_bytes": self.peak_median_bytes,
            "peak_worst_bytes": self.peak_worst_bytes,
            "peak_device_worst_bytes": self.peak_device_worst_bytes,
            "peak_reserved_worst_bytes": self.peak_reserved_worst_bytes,
            "peak_allocated_worst_bytes": self.peak_allocated_worst_bytes,
            "step_time_ms": self.step_time_ms,
            "step_time_worst_ms": self.step_time_worst_ms,
            **_range_json(self.step_time_range_ms),
            "steady_bytes": self.steady_bytes,
            "peak_phase": self.peak_phase,
            "phase_peak_bytes": dict(self.phase_peak_bytes),
        }
        if self.per_rank is not None:
            data["per_rank"] = [row.to_json_dict() for row in self.per_rank]
        if self.split is not None:
            data["split"] = self.split.to_json_dict()
        if self.offload_bytes or self.host_peak_worst_bytes:
            data["host_peak_worst_bytes"] = self.host_peak_worst_bytes
            data["offload_bytes"] = self.offload_bytes
        return data

    @classmethod
    def from_json_dict(cls, data: Mapping[str, Any]) -> PinMeasured:
        """Build from the JSON form; a missing figure reads as 0 (None for ``runs``)."""
        per_rank, split = data.get("per_rank"), data.get("split")
        return cls(
            runs=optional_int(data.get("runs")),
            cold_runs=optional_int(data.get("cold_runs")),
            peak_median_bytes=as_int(data.get("peak_median_bytes")),
            peak_worst_bytes=as_int(data.get("peak_worst_bytes")),
            peak_device_worst_bytes=as_int(data.get("peak_device_worst_bytes")),
            peak_reserved_worst_bytes=as_int(data.get("peak_reserved_worst_bytes")),
            peak_allocated_worst_bytes=as_int(data.get("peak_allocated_worst_bytes")),
            step_time_ms=float(data.get("step_time_ms") or 0.0),
            step_time_worst_ms=float(data.get("step_time_worst_ms") or 0.0),
            step_time_range_ms=_range_of(data.get("step_time_range_ms")),
            steady_bytes=as_int(data.get("steady_bytes")),
            peak_phase=data.get("peak_phase"),
            phase_peak_bytes=dict(data.get("phase_peak_bytes") or {}),
            per_rank=None
            if per_rank is None
            else tuple(RankPeak.from_json_dict(row) for row in per_rank),
            split=None if not split else MemorySplit.from_json_dict(split),
            host_peak_worst_bytes=as_int(data.get("host_peak_worst_bytes")),
            offload_bytes=as_int(data.get("offload_bytes")),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class PinReference:
    """A configuration the pin is compared with (``baseline``, ``full_ac``, ``op_sac``,
    ``no_offload``)."""

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
    step_time_range_ms: tuple[float, float] | None = None
    """The fastest and the slowest of its fresh runs (None: none, or a pin written before
    issue 45)."""

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
        data.update(_range_json(self.step_time_range_ms))
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
            spec=spec_of(data.get("spec")),
            peak_bytes=as_int(data.get("peak_bytes")),
            peak_device_bytes=optional_int(data.get("peak_device_bytes")),
            step_time_ms=float(data.get("step_time_ms") or 0.0),
            runs=optional_int(data.get("runs")),
            trial_step_time_ms=optional_float(data.get("trial_step_time_ms")),
            peak_phase=data.get("peak_phase"),
            slowdown=float(data.get("slowdown") or 0.0),
            fits=None if fits is None else bool(fits),
            step_time_range_ms=_range_of(data.get("step_time_range_ms")),
        )


def spread_of(times: Sequence[float]) -> tuple[float, float] | None:
    """The fastest and the slowest of ``times`` (None: no times)."""
    return (min(times), max(times)) if times else None


def _range_json(value: tuple[float, float] | None) -> dict[str, Any]:
    return {} if value is None else {"step_time_range_ms": [value[0], value[1]]}


def _range_of(value: Any) -> tuple[float, float] | None:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        return None
    return (float(value[0]), float(value[1]))
