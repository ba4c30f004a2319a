"""`budgettune verify`: re-measure a pinned config in fresh processes against its limit.

A pin is a file anyone may hand over, and its ``workload`` is code that runs: `verify_pin`
says which code it will import before running anything, and refuses a pin whose re-measured
workload is not the one it was measured on (its fingerprint digest differs), unless told to.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from budgettune.errors import (
    PinNoLongerFitsError,
    WorkloadError,
    WorkloadFailedError,
    WorkloadMismatchError,
)
from budgettune.pinning import PinnedConfig, load_pinned
from budgettune.trial.devices import check_device_available
from budgettune.trial.launcher import check_ops_exist, launch_trial, trial_servers
from budgettune.trial.results import TrialOutcome, TrialResult
from budgettune.trial.trial_run import TrialRun
from budgettune.units import format_bytes
from budgettune.workload import check_reference, reference_origin

ALLOW_OTHER_WORKLOAD_FLAG = "--allow-other-workload"
"""The CLI flag that lets `verify` measure a workload other than the pinned one."""


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
    workload_mismatch: str = ""
    """How the measured workload differs from the pinned one (allowed by the caller), or
    empty when it is the same."""

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
        """Raises `PinNoLongerFitsError` (exit 3) when a run ran out of memory or the worst
        peak is over the limit; `WorkloadFailedError` (exit 1) when a run failed otherwise (a
        crash, a timeout, a bad option: issue 48, it said "no longer fits")."""
        other = [r for r in self.failed if r.outcome is not TrialOutcome.OOM]
        if other:
            first = other[0]
            raise WorkloadFailedError(
                f"{self.path}: {len(other)} of {len(self.results)} runs ended "
                f"{first.outcome.value}, which says nothing of its fit ({first.error}; log "
                f"{first.log_path})"
            )
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
            "workload_mismatch": self.workload_mismatch,
            "results": [r.to_json_dict() for r in self.results],
        }


def verify_pin(
    path: str | Path,
    *,
    runs: int,
    device: str | None,
    timeout_s: float,
    run_dir: Path,
    allow_other_workload: bool = False,
    on_start: Callable[[str], None] | None = None,
    on_run: Callable[[int, TrialResult], None] | None = None,
) -> VerifyReport:
    """Re-measure the pin at ``path`` ``runs`` times, each in a fresh process.

    Args:
        allow_other_workload: measure on when the workload's fingerprint differs from the pin's
            (or the pin records none); the report says how it differs.
        on_start: called once, before anything runs, with one line naming the code the
            trials will import.
        on_run: called after each run with its index and result.

    Raises:
        PinnedConfigError: the file is missing, corrupt or of another schema.
        WorkloadError: the pin's workload does not resolve (e.g. its file does not exist).
        WorkloadMismatchError: without ``allow_other_workload``, the pin records no workload
            fingerprint (before running), or the first run's workload has another one (then
            the other runs do not start).
        DeviceUnavailableError: the device is not here.
    """
    pinned = load_pinned(path, warn=False, apply_allocator=False)  # the trial child sets it
    pin = pinned.pin
    reference = pin.workload
    try:
        check_reference(reference, pin.workload_options)  # a built-in's options too (P6-10)
    except WorkloadError as exc:
        file_part = reference.rsplit(":", 1)[0]
        if file_part.endswith(".py") and not Path(file_part).is_absolute():
            # issue 47: a pin names its builder file as the search was given it, relative to
            # the folder the search ran in
            raise WorkloadError(
                f"{exc}: the pin names its workload file relative to the folder the search ran "
                f"in; run verify from that folder (this is {Path.cwd()})"
            ) from None
        raise
    if not pinned_digest(pinned) and not allow_other_workload:
        raise WorkloadMismatchError(
            f"{path} records no workload fingerprint to check {reference} against; pass "
            f"{ALLOW_OTHER_WORKLOAD_FLAG} to measure it anyway"
        )
    run = TrialRun(
        spec=pinned.spec,
        workload=reference,
        workload_options=pin.workload_options,
        device=pin.device if device is None else device,  # "" is refused, not the default
        cache_root=None,
        # a sharded pin is re-measured as it was measured: the same number of ranks
        nproc_per_node=pin.world_size,
    )
    check_device_available(run.device)
    spec = pinned.spec  # an op this torch lacks is bad input, refused before a run (P9-5)
    check_ops_exist(
        spec.recompute_ops_removed + spec.recompute_ops_added,
        compiled_offload=spec.compiled_offload,
    )
    if on_start is not None:
        on_start(f"verify: importing the workload {reference_origin(reference)}, as {path} says")
    results = []
    mismatch = ""
    servers = trial_servers(run, run_dir / "servers") if runs > 1 else None
    try:
        for index in range(runs):
            result = launch_trial(
                run, run_dir=run_dir / f"run-{index}", timeout_s=timeout_s, servers=servers
            )
            results.append(result)
            if on_run is not None:
                on_run(index, result)
            mismatch = mismatch or workload_mismatch(pinned, result)
            if mismatch and not allow_other_workload:
                raise WorkloadMismatchError(
                    f"{path}: {reference} is not the workload this pin was measured on: "
                    f"{mismatch}; pass {ALLOW_OTHER_WORKLOAD_FLAG} to verify it anyway (log "
                    f"{result.log_path})"
                )
    finally:
        if servers is not None:
            servers.close()
    return VerifyReport(
        path=str(path),
        limit_bytes=pin.limit_bytes,
        mem_metric=pin.mem_metric,
        results=tuple(results),
        workload_mismatch=mismatch,
    )


def pinned_digest(pinned: PinnedConfig) -> str:
    """The pinned workload's fingerprint digest (empty when the pin records none)."""
    return str(pinned.fingerprint.workload.get("digest") or "")


def workload_mismatch(pinned: PinnedConfig, result: TrialResult) -> str:
    """How the workload a run built differs from the pinned one; empty when the digests agree
    or the run built none (it failed before: its outcome says so)."""
    measured = result.workload_fingerprint
    if measured is None:
        return ""
    if not pinned_digest(pinned):
        return "the pin records no workload fingerprint"
    reasons = pinned.check_workload(measured)
    return reasons[0] if reasons else ""
