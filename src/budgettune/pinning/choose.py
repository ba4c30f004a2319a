"""Choose the winner and build the pin (`PinDocument`, schema v1) from its re-measurements:
the search's side of a pin. One rule of "fits" (peak x (1 + margin) within the limit) for all."""

from __future__ import annotations

import dataclasses
import datetime
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from budgettune.pinning.advice import allocator_advice, phase_advice
from budgettune.pinning.document import (
    SCHEMA_VERSION,
    MemorySplit,
    PinDocument,
    PinFingerprint,
    PinMeasured,
    PinReference,
    RankPeak,
)
from budgettune.pinning.pin_figures import spread_of
from budgettune.trial.ranks import memory_split, per_rank_figures
from budgettune.trial.results import Measurement, TrialResult
from budgettune.trial.spec import TrialSpec

SHARDING = (
    "fsdp2 under torchrun, torchtitan order: block AC, per-block torch.compile(fullgraph=True), "
    "then the workload's parallelize(model, mesh) or fully_shard per block and at the root"
)
"""The pin's ``sharding`` for a study of several ranks per trial (``none`` for one)."""


class StalePinWarning(UserWarning):
    """The running job differs from the one the pin was measured on (torch, GPU, workload)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate:
    """A feasible configuration from the trials, before re-verification."""

    trial_number: int
    """The Optuna trial that measured it (the fastest such trial)."""
    spec: TrialSpec
    """The configuration."""
    step_time_ms: float
    """Median step time in that trial."""
    peak_bytes: int
    """Peak on the search's memory metric in that trial."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ReferenceTrial:
    """A reference configuration's trial (the unconstrained baseline, full block AC, op SAC)
    as the pin reads it."""

    spec: TrialSpec
    """Its configuration."""
    peak_bytes: int
    """Its peak on the search's memory metric."""
    peak_device_bytes: int | None
    """Its device peak."""
    step_time_ms: float
    """Its median step time in the trial."""
    peak_phase: str | None = None
    """Where its peak was set."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PinScope:
    """What the pinned search was for: its study, workload, device, limit and ranks."""

    study_name: str
    """The study."""
    workload: str
    """The workload reference."""
    workload_options: Mapping[str, Any]
    """The workload builder's options."""
    device: str
    """``cpu``, ``cuda`` or ``cuda:N``."""
    limit_bytes: int
    """The memory limit."""
    mem_metric: str
    """The metric the limit is on."""
    margin: float
    """A run fits when its peak x (1 + margin) is within the limit."""
    world_size: int = 1
    """Ranks per trial."""


def margin_violation_bytes(peak_bytes: float, *, limit_bytes: int, margin: float) -> float:
    """How far ``peak × (1 + margin)`` is over the limit (≤ 0: it fits).

    The one notion of "fits": the search's Optuna constraint, the candidates, `show`, the
    dashboard and the pin all use it. The margin absorbs run-to-run variation of the peak, so
    a configuration the search rewards is one the pin will accept.
    """
    return peak_bytes * (1.0 + margin) - limit_bytes


def fits_limit(peak_bytes: float, *, limit_bytes: int, margin: float) -> bool:
    """``peak × (1 + margin) ≤ limit`` (see `margin_violation_bytes`)."""
    return margin_violation_bytes(peak_bytes, limit_bytes=limit_bytes, margin=margin) <= 0


def measured_violation_bytes(
    measurement: Measurement,
    *,
    limit_bytes: int,
    mem_metric: str,
    margin: float,
    host_limit_bytes: int | None,
) -> float:
    """A measured run's `margin_violation_bytes`, or, when its offloaded activations held more
    host memory than ``host_limit_bytes`` (``--max-host-mem``), the larger of that and the
    bytes over the host limit: either way > 0 does not fit."""
    device = margin_violation_bytes(
        measurement.peak_bytes(mem_metric), limit_bytes=limit_bytes, margin=margin
    )
    if host_limit_bytes is not None and measurement.host_peak_bytes > host_limit_bytes:
        return max(device, float(measurement.host_peak_bytes - host_limit_bytes))
    return device


def qualified(
    candidates: Sequence[Candidate],
    reverified: Mapping[int, Sequence[TrialResult]],
    *,
    limit_bytes: int,
    mem_metric: str,
    margin: float,
    host_limit_bytes: int | None = None,
    rows: int = 0,
) -> list[tuple[float, Candidate, list[TrialResult]]]:
    """The candidates whose re-measurements qualify, fastest first: (median step time, scaled
    to ``rows`` rows as the search ranks it (`TrialSpec.ranked_ms`; 0: as measured), the
    candidate, its runs). A candidate qualifies when it has runs, every one ended ``ok``, its
    *worst* peak plus the margin fits the limit and every run held at most
    ``host_limit_bytes`` of host memory (when given)."""
    found: list[tuple[float, Candidate, list[TrialResult]]] = []
    for candidate in candidates:
        results = list(reverified.get(candidate.trial_number, ()))
        if not results or not all(r.outcome.is_feasible() and r.measurement for r in results):
            continue
        worst = max(r.measurement.peak_bytes(mem_metric) for r in results if r.measurement)
        if not fits_limit(worst, limit_bytes=limit_bytes, margin=margin):
            continue
        if host_limit_bytes is not None and any(
            r.measurement.host_peak_bytes > host_limit_bytes for r in results if r.measurement
        ):
            continue
        median_ms = statistics.median(r.measurement.step_time_ms for r in results if r.measurement)
        found.append((candidate.spec.ranked_ms(median_ms, rows), candidate, results))
    return sorted(found, key=lambda item: item[0])


def choose_pin(
    candidates: Sequence[Candidate],
    reverified: Mapping[int, Sequence[TrialResult]],
    *,
    limit_bytes: int,
    mem_metric: str,
    margin: float,
    host_limit_bytes: int | None = None,
) -> tuple[Candidate, list[TrialResult]] | None:
    """The fastest candidate that qualifies (`qualified`: every re-measurement ``ok``, the
    worst re-measured peak plus the margin within the limit); speed is the median of the
    re-measured step times.

    Returns:
        The winner and its re-measurements, or None when none qualifies.
    """
    ranked = qualified(
        candidates,
        reverified,
        limit_bytes=limit_bytes,
        mem_metric=mem_metric,
        margin=margin,
        host_limit_bytes=host_limit_bytes,
    )
    if not ranked:
        return None
    _, candidate, results = ranked[0]
    return candidate, results


def _figures(results: Sequence[TrialResult], metric: str, *, sharded: bool) -> PinMeasured:
    measurements = [r.measurement for r in results if r.measurement is not None]
    peaks = [m.peak_bytes(metric) for m in measurements]
    times = [m.step_time_ms for m in measurements]
    last = measurements[-1]
    per_rank = per_rank_figures(results, metric) if sharded else None
    return PinMeasured(
        runs=len(measurements),
        cold_runs=sum(r.cold_caches for r in results if r.measurement is not None),
        peak_median_bytes=int(statistics.median(peaks)),
        peak_worst_bytes=max(peaks),
        peak_device_worst_bytes=max(m.peak_device_bytes for m in measurements),
        peak_reserved_worst_bytes=max(m.peak_reserved_bytes for m in measurements),
        peak_allocated_worst_bytes=max(m.peak_allocated_bytes for m in measurements),
        step_time_ms=statistics.median(times),
        step_time_worst_ms=max(times),
        step_time_range_ms=spread_of(times),
        steady_bytes=last.steady_bytes,
        peak_phase=last.peak_phase,
        phase_peak_bytes=dict(last.phase_peak_bytes),
        per_rank=None if per_rank is None else tuple(map(RankPeak.from_json_dict, per_rank)),
        split=None if per_rank is None else MemorySplit.from_json_dict(memory_split(per_rank)),
        host_peak_worst_bytes=max(m.host_peak_bytes for m in measurements),
        offload_bytes=last.offload_bytes,
    )


def reference_figures(
    trial: ReferenceTrial | None,
    remeasured: Sequence[TrialResult],
    *,
    pin_step_time_ms: float,
    pin_spec: TrialSpec | None = None,
) -> PinReference | None:
    """A reference configuration in the pin (the unconstrained baseline, or full block AC).

    Args:
        trial: the reference's trial (None: it was not measured).
        remeasured: its fresh re-measurements; when some succeeded, its step time is their
            median (``runs`` says how many), like the pin's, and the trial's own figure stays
            as ``trial_step_time_ms``; else the trial's figure is used.
        pin_step_time_ms: the pin's median step time, for ``slowdown``.
        pin_spec: the pin's configuration: where it and the reference step on rows of their
            own (a search over micro-batches), ``slowdown`` compares time per row (samples per
            second, issue 46), not time per step.
    """
    if trial is None:
        return None
    runs = [r.measurement for r in remeasured if r.measurement is not None]
    step_ms = statistics.median(m.step_time_ms for m in runs) if runs else trial.step_time_ms
    return PinReference(
        spec=trial.spec,
        peak_bytes=trial.peak_bytes,
        peak_device_bytes=trial.peak_device_bytes,
        step_time_ms=step_ms,
        runs=len(runs),
        trial_step_time_ms=trial.step_time_ms,
        peak_phase=trial.peak_phase,
        slowdown=_slowdown(pin_step_time_ms, pin_spec, step_ms, trial.spec),
        step_time_range_ms=spread_of([m.step_time_ms for m in runs]),
    )


def _slowdown(
    pin_ms: float, pin_spec: TrialSpec | None, ref_ms: float, ref_spec: TrialSpec
) -> float:
    """How much slower the pin is than a reference: per step, or per row where both say their
    rows and they differ."""
    rows = (
        1
        if pin_spec is not None and pin_spec.samples_per_step and ref_spec.samples_per_step
        else 0
    )
    if pin_spec is None or not rows:
        return pin_ms / ref_ms - 1.0
    return pin_spec.ranked_ms(pin_ms, rows) / ref_spec.ranked_ms(ref_ms, rows) - 1.0


def build_pin(
    *,
    scope: PinScope,
    candidate: Candidate,
    reverify_results: Sequence[TrialResult],
    baseline: ReferenceTrial | None,
    trials: int,
    baseline_results: Sequence[TrialResult] = (),
    baseline_status: str = "ok",
    full_ac: ReferenceTrial | None = None,
    full_ac_results: Sequence[TrialResult] = (),
    op_sac: ReferenceTrial | None = None,
    op_sac_results: Sequence[TrialResult] = (),
    no_offload: ReferenceTrial | None = None,
    no_offload_results: Sequence[TrialResult] = (),
    host_limit_bytes: int | None = None,
) -> PinDocument:
    """The pin (schema version 1).

    Args:
        scope: what the search was for (study, workload, device, limit, ranks).
        candidate: the chosen configuration.
        reverify_results: its fresh re-measurements.
        baseline: the unconstrained baseline's trial (None: not measured).
        trials: the study's trials so far.
        baseline_results: fresh re-measurements of that baseline (see `reference_figures`).
        baseline_status: ``ok``, ``over_limit`` (measured, but it does not fit), or the
            outcome that kept it from being measured (``oom``, ``crashed``...).
        full_ac: the full block AC baseline's trial, given when the unconstrained baseline
            cannot be run under the limit: then full AC is the user's real alternative, and
            the pin's slowdown against it is reported as ``full_ac``.
        full_ac_results: its fresh re-measurements.
        op_sac: torchtitan's op SAC baseline's trial (sharded studies), with ``fits``.
        op_sac_results: its fresh re-measurements.
        no_offload: for a pin that offloads, the fastest trial without offload that fit.
        no_offload_results: its fresh re-measurements.
        host_limit_bytes: the search's ``--max-host-mem`` (recorded in a pin that offloads).
    """
    measured = _figures(reverify_results, scope.mem_metric, sharded=scope.world_size > 1)
    first = reverify_results[0]
    pin_ms, pin_spec = measured.step_time_ms, candidate.spec
    op_sac_doc = reference_figures(
        op_sac, op_sac_results, pin_step_time_ms=pin_ms, pin_spec=pin_spec
    )
    if op_sac_doc is not None:
        op_sac_doc = dataclasses.replace(
            op_sac_doc,
            fits=fits_limit(
                op_sac_doc.peak_bytes, limit_bytes=scope.limit_bytes, margin=scope.margin
            ),
        )
    advice = [
        phase_advice(measured.peak_phase),
        allocator_advice(
            peak_allocated_bytes=measured.peak_allocated_worst_bytes,
            peak_reserved_bytes=measured.peak_reserved_worst_bytes,
            mem_metric=scope.mem_metric,
            alloc_conf=candidate.spec.cuda_alloc_conf,
        ),
    ]
    return PinDocument(
        schema_version=SCHEMA_VERSION,
        created_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        study_name=scope.study_name,
        trial_number=candidate.trial_number,
        trials=trials,
        workload=scope.workload,
        workload_options=dict(scope.workload_options),
        device=scope.device,
        spec=candidate.spec,
        # What the trials changed in the model besides the knobs; `compile` does it again.
        model_changes=tuple(first.model_changes),
        dropout=first.dropout,
        limit_bytes=scope.limit_bytes,
        mem_metric=scope.mem_metric,
        margin=scope.margin,
        measured=measured,
        advice="; ".join(a for a in advice if a),
        baseline=reference_figures(
            baseline, baseline_results, pin_step_time_ms=pin_ms, pin_spec=pin_spec
        ),
        baseline_status=baseline_status,
        full_ac=reference_figures(
            full_ac, full_ac_results, pin_step_time_ms=pin_ms, pin_spec=pin_spec
        ),
        op_sac=op_sac_doc,
        no_offload=reference_figures(
            no_offload, no_offload_results, pin_step_time_ms=pin_ms, pin_spec=pin_spec
        ),
        host_limit_bytes=host_limit_bytes if candidate.spec.offloads else None,
        world_size=scope.world_size,
        sharding=SHARDING if scope.world_size > 1 else "none",
        fingerprint=PinFingerprint(
            torch_version=first.torch_version,
            cuda_version=first.cuda_version,
            device_name=first.device_name,
            workload=dict(first.workload_fingerprint or {}),
        ),
    )
