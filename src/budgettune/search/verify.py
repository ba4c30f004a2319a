"""`budgettune verify`: re-measure a pinned config in fresh processes against its limit."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from budgettune.errors import PinNoLongerFitsError
from budgettune.pinning import load_pinned
from budgettune.trial.launcher import check_device_available, launch_trial
from budgettune.trial.results import TrialResult
from budgettune.trial.spec import TrialRun
from budgettune.units import format_bytes


@dataclass(frozen=True, kw_only=True, slots=True)
class VerifyReport:
    """The re-measurements of one pin."""

    path: str
    """The pinned JSON."""
    limit_bytes: int
    """Its limit."""
    mem_metric: str
    """The metric the limit applies to."""
    results: tuple[TrialResult, ...]
    """One per fresh run."""

    @property
    def failed(self) -> list[TrialResult]:
        """Runs that did not end ``ok``."""
        return [r for r in self.results if not r.outcome.is_feasible()]

    @property
    def worst_peak_bytes(self) -> int | None:
        """Worst peak on the pin's metric over the ok runs."""
        peaks = [r.measurement.peak_bytes(self.mem_metric) for r in self.results if r.measurement]
        return max(peaks) if peaks else None

    @property
    def step_time_ms(self) -> float:
        """Median step time over the ok runs (NaN when none)."""
        times = [r.measurement.step_time_ms for r in self.results if r.measurement]
        return statistics.median(times) if times else float("nan")

    def raise_if_over(self) -> None:
        """Raises `PinNoLongerFitsError` when a run failed or the worst peak is over the limit."""
        if self.failed:
            first = self.failed[0]
            raise PinNoLongerFitsError(
                f"{self.path}: {len(self.failed)} of {len(self.results)} runs ended "
                f"{first.outcome.value} ({first.error}; log {first.log_path})"
            )
        worst = self.worst_peak_bytes
        if worst is not None and worst > self.limit_bytes:
            raise PinNoLongerFitsError(
                f"{self.path}: worst re-measured peak {format_bytes(worst)} is over the limit "
                f"{format_bytes(self.limit_bytes)} ({self.mem_metric}); re-run budgettune search"
            )

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "path": self.path,
            "limit_bytes": self.limit_bytes,
            "mem_metric": self.mem_metric,
            "worst_peak_bytes": self.worst_peak_bytes,
            "step_time_ms": self.step_time_ms,
            "fits": not self.failed and (self.worst_peak_bytes or 0) <= self.limit_bytes,
            "results": [r.to_json_dict() for r in self.results],
        }


def verify_pin(
    path: str | Path,
    *,
    runs: int,
    device: str | None,
    timeout_s: float,
    run_dir: Path,
    on_run: Callable[[int, TrialResult], None] | None = None,
) -> VerifyReport:
    """Re-measure the pin at ``path`` ``runs`` times, each in a fresh process.

    Raises:
        PinnedConfigError: the file is missing, corrupt or of another schema.
        DeviceUnavailableError: the device is not here.
    """
    pinned = load_pinned(path, warn=False, apply_allocator=False)  # the trial child sets it
    doc = pinned.document
    run = TrialRun(
        spec=pinned.spec,
        workload=doc["workload"],
        workload_options=doc.get("workload_options", {}),
        device=device or doc.get("device", "cpu"),
        cache_root=None,
        # a sharded pin is re-measured as it was measured: the same number of ranks
        nproc_per_node=int(doc.get("world_size", 1)),
    )
    check_device_available(run.device)
    results = []
    for index in range(runs):
        result = launch_trial(run, run_dir=run_dir / f"run-{index}", timeout_s=timeout_s)
        results.append(result)
        if on_run is not None:
            on_run(index, result)
    return VerifyReport(
        path=str(path),
        limit_bytes=int(doc["limit_bytes"]),
        mem_metric=doc["mem_metric"],
        results=tuple(results),
    )
