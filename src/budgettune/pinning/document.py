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

from budgettune.pinning.pin_figures import (  # noqa: F401 - re-exported
    MemorySplit,
    PinMeasured,
    PinReference,
    RankPeak,
    as_int,
    optional_int,
    spec_of,
)
from budgettune.trial.spec import TrialSpec

SCHEMA_VERSION = 1
"""The pin schema this budgettune writes and reads."""


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
    dropout: tuple[str, ...] | None = None
    """The dropout the measured model drew (empty: none; None: a pin from before issue 45);
    `compile` warns when the job's model draws dropout the pin was measured without."""
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
    no_offload: PinReference | None = None
    """Offloading pins: the fastest configuration without offload that fit in the same study
    (None: the pin does not offload, or nothing without offload fit)."""
    host_limit_bytes: int | None = None
    """Offloading pins: the ``--max-host-mem`` the search held them to."""
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
            **({} if self.dropout is None else {"dropout": list(self.dropout)}),
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
            **self._offload_json(),
        }

    def _offload_json(self) -> dict[str, Any]:
        """The offload keys, only in a pin that offloads (older documents stay as written)."""
        if not self.spec.offloads:
            return {}
        return {
            "no_offload": None if self.no_offload is None else self.no_offload.to_json_dict(),
            "host_limit_bytes": self.host_limit_bytes,
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
            schema_version=as_int(data.get("schema_version"), SCHEMA_VERSION),
            created_at=str(data.get("created_at") or ""),
            study_name=str(data.get("study_name") or ""),
            trial_number=optional_int(data.get("trial_number")),
            trials=optional_int(data.get("trials")),
            workload=str(data.get("workload") or ""),
            workload_options=dict(data.get("workload_options") or {}),
            device=str(data.get("device") or "cpu"),
            spec=spec_of(data.get("spec")),
            model_changes=tuple(data.get("model_changes") or ()),
            dropout=None
            if data.get("dropout") is None
            else tuple(str(item) for item in data["dropout"]),
            limit_bytes=as_int(data.get("limit_bytes")),
            mem_metric=str(data.get("mem_metric") or "device"),
            margin=float(data.get("margin") or 0.0),
            measured=PinMeasured.from_json_dict(data.get("measured") or {}),
            advice=str(data.get("advice") or ""),
            baseline=reference("baseline"),
            baseline_status=str(data.get("baseline_status") or "ok"),
            full_ac=reference("full_ac"),
            op_sac=reference("op_sac"),
            no_offload=reference("no_offload"),
            host_limit_bytes=optional_int(data.get("host_limit_bytes")),
            world_size=as_int(data.get("world_size"), 1),
            sharding=str(data.get("sharding") or "none"),
            fingerprint=PinFingerprint.from_json_dict(data.get("fingerprint") or {}),
        )
