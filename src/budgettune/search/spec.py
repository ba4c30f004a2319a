"""`SearchSpec`: one whole search — the workload, the limit, the space, the budget of trials."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from budgettune.errors import SpecError, UsageError
from budgettune.search.space import SearchSpace
from budgettune.trial.spec import (
    DEFAULT_COLLECTIVE_TIMEOUT_S,
    DEVICE_PATTERN,
    TrialRun,
    TrialSpec,
    check_world,
)

MEM_METRIC_CHOICES = ("device", "reserved", "allocated")
MIN_LIMIT_BYTES = 2**20
"""A limit below this (1 MiB) is a number written without its unit (``max_mem = 120``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchSpec:
    """A whole search: the workload, the limit, the space, the budget of trials."""

    workload: str
    """Workload reference (see `TrialRun.workload`)."""
    workload_options: Mapping[str, Any] = field(default_factory=dict)
    """Builder keyword arguments."""
    device: str = "cpu"
    """``cpu``, ``cuda`` or ``cuda:N``."""
    max_mem_bytes: int
    """The memory limit, checked against ``mem_metric``."""
    mem_metric: str = "device"
    """``device`` (what nvidia-smi shows), ``reserved`` or ``allocated``."""
    num_trials: int = 20
    """Trials this invocation adds to the study (baselines included on a new study)."""
    study_name: str
    """The Optuna study; re-running with the same name resumes it."""
    storage_url: str | None = None
    """SQLAlchemy URL or SQLite path; None is ``./budgettune.db``."""
    space: SearchSpace
    """What may vary."""
    base: TrialSpec = field(default_factory=TrialSpec)
    """Seed and step counts, and the values of dimensions the space does not vary."""
    top_k: int = 3
    """Feasible configurations re-measured at the end."""
    reverify_runs: int = 3
    """Fresh processes per re-measured configuration."""
    margin: float = 0.03
    """The pin's worst re-measured peak times (1 + margin) must stay under the limit."""
    trial_timeout_s: float = 900.0
    """Wall-clock limit of one trial process."""
    runs_dir: str = "budgettune-runs"
    """Where trial specs, results, logs and compile caches go."""
    compile_cache: bool = True
    """Reuse compiled code between trials of the same partition variant."""
    sampler_seed: int | None = None
    """Seed of the TPE sampler (reproducible suggestions)."""
    nproc_per_node: int = 1
    """Ranks per trial: above 1 each trial is a sharded (FSDP2) job under torchrun."""
    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S
    """Process-group timeout of each rank of a sharded trial."""

    def __post_init__(self) -> None:
        if not isinstance(self.max_mem_bytes, int) or self.max_mem_bytes <= 0:
            raise UsageError(f"--max-mem must be a positive size, got {self.max_mem_bytes!r}")
        if self.max_mem_bytes < MIN_LIMIT_BYTES:
            raise UsageError(
                f"--max-mem {self.max_mem_bytes} bytes is certainly missing its unit (no "
                f"training step fits in under 1 MiB): write it as {self.max_mem_bytes}GB or "
                f"{self.max_mem_bytes}MB"
            )
        if self.mem_metric not in MEM_METRIC_CHOICES:
            raise UsageError(
                f"--mem-metric: unknown metric {self.mem_metric!r}; "
                f"choose one of {', '.join(MEM_METRIC_CHOICES)}"
            )
        if self.num_trials < 0:
            raise UsageError(f"--trials must be at least 0, got {self.num_trials}")
        if self.top_k < 1 or self.reverify_runs < 1:
            raise UsageError("--top-k and --reverify must be at least 1")
        if not 0.0 <= self.margin < 0.5:
            raise UsageError(f"--margin must be within [0, 0.5), got {self.margin}")
        if not DEVICE_PATTERN.match(self.device):
            raise UsageError(f"--device must be cpu, cuda or cuda:N, got {self.device!r}")
        if not self.study_name or not self.study_name.strip():
            raise UsageError("the study name must not be empty")
        try:
            check_world(self.device, self.nproc_per_node)
        except SpecError as exc:
            raise UsageError(str(exc)) from None
        object.__setattr__(self, "workload_options", dict(self.workload_options))

    @property
    def is_sharded(self) -> bool:
        """Whether each trial runs on several ranks."""
        return self.nproc_per_node > 1

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON form stored with a study, so workers can join it.

        The storage URL is left out (it may hold a password, and every worker names its own).
        """
        data: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            data[f.name] = getattr(self, f.name)
        data["workload_options"] = dict(self.workload_options)
        data["space"] = self.space.to_json_dict()
        data["base"] = self.base.to_json_dict()
        del data["storage_url"]
        return data

    @classmethod
    def from_json_dict(cls, data: Mapping[str, Any], **overrides: Any) -> SearchSpec:
        """Build from the JSON form, with some fields replaced (a worker's device, storage...).

        Raises:
            SpecError: on an unknown key or an invalid value.
            UsageError: on an invalid search-level value.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(f"unknown SearchSpec key(s): {', '.join(unknown)}")
        values = dict(data)
        values["space"] = SearchSpace.from_json_dict(values["space"])
        values["base"] = TrialSpec.from_json_dict(values.get("base", {}))
        values.update(overrides)
        return cls(**values)

    def replace(self, **changes: Any) -> SearchSpec:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def trial_run(self, spec: TrialSpec) -> TrialRun:
        """The `TrialRun` that measures ``spec`` for this search."""
        cache_root = f"{self.runs_dir}/compile-cache" if self.compile_cache else None
        return TrialRun(
            spec=spec,
            workload=self.workload,
            workload_options=self.workload_options,
            device=self.device,
            cache_root=cache_root,
            nproc_per_node=self.nproc_per_node,
            collective_timeout_s=self.collective_timeout_s,
        )
