"""Reading budgettune's measurements back from Optuna trials (their user attrs).

The search writes every measurement into its trial's user attrs (`storage.user_attrs`); the
search, `show` and the dashboard read them back through these functions, each trial as a
`TrialRecord`, so "feasible", "the unconstrained baseline" and "the peak on the study's metric"
mean one thing everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import optuna

from budgettune.pinning import Candidate, fits_limit
from budgettune.storage.user_attrs import (
    BASELINE_ATTR,
    EXCLUDED_ATTR,
    SETTLED_ATTR,
    TrialRecord,
)
from budgettune.trial.results import TrialOutcome
from budgettune.trial.spec import TrialSpec

__all__ = [
    "BASELINE_ATTR",
    "EXCLUDED_ATTR",
    "FULL_AC",
    "OP_SAC",
    "SETTLED_ATTR",
    "UNCONSTRAINED",
    "TrialRecord",
    "baseline_status",
    "baseline_trial",
    "best_feasible_ms",
    "describe_exclusion",
    "describe_settlements",
    "feasible_candidates",
    "is_feasible",
    "metric_peak",
    "record_of",
    "smallest_peak",
    "trial_outcome",
    "unconstrained_baseline",
]

UNCONSTRAINED = "unconstrained"
"""The baseline every slowdown and numerics check refers to (budget 1.0, optimizer as written)."""
FULL_AC = "block-ac-every-1"
"""The baseline a user picks by hand when the unconstrained one does not fit: full block AC."""
OP_SAC = "op-sac"
"""Sharded studies: torchtitan's selective "op" AC on every block, compiled (its hand-set
"selective" mode); the pin reports its slowdown against it where it fits."""


def record_of(trial: optuna.trial.FrozenTrial) -> TrialRecord:
    """The typed record of what ``trial`` stored (`TrialRecord.from_attrs`)."""
    return TrialRecord.from_attrs(trial.user_attrs)


def trial_outcome(attrs: Mapping[str, Any]) -> TrialOutcome | None:
    """The outcome a trial's user attrs record (`TrialRecord.outcome`): None while it has
    none (queued, running, interrupted) or when it names one this budgettune does not know;
    an ``ok`` with a non-finite loss or grad norm reads as ``non_finite``."""
    return TrialRecord.from_attrs(attrs).outcome


def is_feasible(trial: optuna.trial.FrozenTrial) -> bool:
    """Complete, measured ``ok`` and fitting the limit with the margin (constraint ≤ 0).

    The search stores the constraint with `budgettune.pinning.margin_violation_bytes`, so this
    is the same "fits" as the pin's; since the margin-aware search, trials that do not fit are
    PRUNED rather than COMPLETE (Optuna's own "best trial" is then the fastest that fits).
    """
    if trial.state != optuna.trial.TrialState.COMPLETE:
        return False
    record = record_of(trial)
    return record.outcome is TrialOutcome.OK and record.fits()


def metric_peak(record: TrialRecord, mem_metric: str) -> int:
    """The peak on ``mem_metric`` (device, reserved or allocated) of a measured trial.

    Raises:
        KeyError: the trial has no such peak (it was not measured).
    """
    peak = record.peak_bytes(mem_metric)
    if peak is None:
        raise KeyError(f"peak_{mem_metric}_bytes")
    return peak


def unconstrained_baseline(
    trials: Iterable[optuna.trial.FrozenTrial], *, measured: str = "step_time_ms"
) -> TrialRecord | None:
    """The record of the unconstrained baseline, once it has ``measured`` (``step_time_ms``
    or ``loss``; else None); one stored ``ok`` with a non-finite loss (an old database) is no
    reference."""
    for trial in trials:
        record = record_of(trial)
        if (
            record.baseline == UNCONSTRAINED
            and getattr(record, measured) is not None
            and record.outcome is not TrialOutcome.NON_FINITE
        ):
            return record
    return None


def best_feasible_ms(trials: Iterable[optuna.trial.FrozenTrial], rows: int = 0) -> float | None:
    """Fastest median step time among feasible trials, each scaled to ``rows`` rows
    (`TrialSpec.ranked_ms`; 0: as measured)."""
    times = [
        record.spec.ranked_ms(record.step_time_ms, rows)
        for record in (record_of(t) for t in trials if is_feasible(t))
        if record.spec is not None and record.step_time_ms is not None
    ]
    return min(times, default=None)


def feasible_candidates(
    trials: Iterable[optuna.trial.FrozenTrial], mem_metric: str, rows: int = 0
) -> list[Candidate]:
    """Distinct feasible configurations, each from its fastest trial, fastest first (by the
    step time scaled to ``rows`` rows: `TrialSpec.ranked_ms`)."""
    seen: dict[str, Candidate] = {}
    for trial in trials:
        if not is_feasible(trial):
            continue
        record = record_of(trial)
        spec, step_ms = record.spec, record.step_time_ms
        if spec is None or step_ms is None:
            continue
        key = repr(sorted(spec.to_json_dict().items()))
        if key not in seen or step_ms < seen[key].step_time_ms:
            seen[key] = Candidate(
                trial_number=trial.number,
                spec=spec,
                step_time_ms=step_ms,
                peak_bytes=metric_peak(record, mem_metric),
            )
    return sorted(seen.values(), key=lambda c: c.spec.ranked_ms(c.step_time_ms, rows))


def smallest_peak(
    trials: Iterable[optuna.trial.FrozenTrial], mem_metric: str
) -> tuple[int, TrialSpec, str | None] | None:
    """The lowest measured peak, its configuration and the phase that set it."""
    measured = [
        (peak, record)
        for record in map(record_of, trials)
        if (peak := record.peak_bytes(mem_metric)) is not None and record.spec is not None
    ]
    if not measured:
        return None
    peak, record = min(measured, key=lambda item: item[0])
    assert record.spec is not None
    return peak, record.spec, record.peak_phase


def baseline_trial(
    trials: Iterable[optuna.trial.FrozenTrial], label: str
) -> tuple[optuna.trial.FrozenTrial, TrialRecord] | None:
    """The last finished trial of the baseline named ``label`` (e.g. `FULL_AC`) with its
    record, or None."""
    found = None
    for trial in trials:
        record = record_of(trial)
        if record.baseline == label and record.finished:
            found = (trial, record)
    return found


def baseline_status(
    trials: Iterable[optuna.trial.FrozenTrial], *, limit_bytes: int, mem_metric: str, margin: float
) -> str:
    """Whether the unconstrained baseline can run under the limit.

    Returns:
        ``ok``; ``over_limit`` (measured, but its peak does not fit); the outcome that kept it
        from being measured (``oom``, ``crashed``, ...); or ``missing`` (not run yet).
    """
    found = baseline_trial(trials, UNCONSTRAINED)
    if found is None:
        return "missing"
    record = found[1]
    outcome = record.outcome
    if outcome is not TrialOutcome.OK or not record.measured:
        return outcome.value if outcome is not None else str(record.stored_outcome or "missing")
    peak = metric_peak(record, mem_metric)
    return "ok" if fits_limit(peak, limit_bytes=limit_bytes, margin=margin) else "over_limit"


def describe_settlements(attr: Mapping[str, Any] | None) -> tuple[str, ...]:
    """One line per held free choice: ``optimizer_impl='fused' ('fused' 6.1 GB ... )``."""
    return tuple(
        f"{knob}={entry.get('value')!r} ({entry.get('reason', '')})"
        for knob, entry in sorted((attr or {}).items())
    )


def describe_exclusion(entry: Mapping[str, Any]) -> str:
    """One line for an exclusion: what, why, which trials, the error."""
    knob, value = entry.get("knob"), entry.get("value")
    what = "block AC" if knob == "block_ac" else f"{knob}={value}"
    trials = ", ".join(str(n) for n in entry.get("trials", []))
    return (
        f"{what} excluded: {entry.get('reason', 'crashed')} (trial {trials}): "
        f"{entry.get('error', '')}"
    )
