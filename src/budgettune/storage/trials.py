"""Reading budgettune's measurements back from Optuna trials (their user attrs).

The search writes every measurement into its trial's user attrs (`search.result_attrs`); the
search, `show` and the dashboard read them back through these functions, so "feasible", "the
unconstrained baseline" and "the peak on the study's metric" mean one thing everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import optuna

from budgettune.pinning import Candidate, fits_limit
from budgettune.trial.results import TrialOutcome
from budgettune.trial.spec import TrialSpec

BASELINE_ATTR = "baseline"
"""User attr naming an enqueued baseline (``unconstrained``, ``block-ac-every-1``, ...)."""
UNCONSTRAINED = "unconstrained"
"""The baseline every slowdown and numerics check refers to (budget 1.0, optimizer as written)."""
FULL_AC = "block-ac-every-1"
"""The baseline a user picks by hand when the unconstrained one does not fit: full block AC."""
OP_SAC = "op-sac"
"""Sharded studies: torchtitan's selective "op" AC on every block, compiled (its hand-set
"selective" mode); the pin reports its slowdown against it where it fits."""


def trial_outcome(attrs: Mapping[str, Any]) -> TrialOutcome | None:
    """The outcome a trial's user attrs record; None while it has none (queued, running,
    interrupted) or when it names one this budgettune does not know.

    A trial stored ``ok`` with a non-finite first-step loss or grad norm (written before
    ``non_finite`` existed) reads as ``non_finite``: it was never a configuration to pin.
    """
    try:
        outcome = TrialOutcome(attrs.get("outcome"))
    except ValueError:
        return None
    if outcome is TrialOutcome.OK and not all(
        _finite(attrs.get(name, 0.0)) for name in ("loss", "grad_norm")
    ):
        return TrialOutcome.NON_FINITE
    return outcome


def _finite(value: Any) -> bool:
    # SQLite-backed attrs are JSON: a NaN loss may come back as NaN or as null
    return isinstance(value, int | float) and math.isfinite(value)


def is_feasible(trial: optuna.trial.FrozenTrial) -> bool:
    """Complete, measured ``ok`` and fitting the limit with the margin (constraint ≤ 0).

    The search stores the constraint with `budgettune.pinning.margin_violation_bytes`, so this
    is the same "fits" as the pin's; since the margin-aware search, trials that do not fit are
    PRUNED rather than COMPLETE (Optuna's own "best trial" is then the fastest that fits).
    """
    return (
        trial.state == optuna.trial.TrialState.COMPLETE
        and trial_outcome(trial.user_attrs) is TrialOutcome.OK
        and trial.user_attrs.get("constraint", [math.inf])[0] <= 0
    )


def metric_peak(attrs: Mapping[str, Any], mem_metric: str) -> int:
    """The peak on ``mem_metric`` (device, reserved or allocated) of a measured trial."""
    return int(attrs[f"peak_{mem_metric}_bytes"])


def unconstrained_baseline(
    trials: Iterable[optuna.trial.FrozenTrial], *, measured: str = "step_time_ms"
) -> dict[str, Any] | None:
    """User attrs of the unconstrained baseline, once it has ``measured`` (else None); one
    stored ``ok`` with a non-finite loss (an old database) is no reference."""
    for trial in trials:
        attrs = trial.user_attrs
        if (
            attrs.get(BASELINE_ATTR) == UNCONSTRAINED
            and measured in attrs
            and trial_outcome(attrs) is not TrialOutcome.NON_FINITE
        ):
            return dict(attrs)
    return None


def best_feasible_ms(trials: Iterable[optuna.trial.FrozenTrial]) -> float | None:
    """Fastest median step time among feasible trials."""
    times = [t.user_attrs["step_time_ms"] for t in trials if is_feasible(t)]
    return min(times) if times else None


def feasible_candidates(
    trials: Iterable[optuna.trial.FrozenTrial], mem_metric: str
) -> list[Candidate]:
    """Distinct feasible configurations, each from its fastest trial, fastest first."""
    seen: dict[str, Candidate] = {}
    for trial in trials:
        if not is_feasible(trial):
            continue
        attrs = trial.user_attrs
        spec = TrialSpec.from_json_dict(attrs["spec"])
        key = repr(sorted(spec.to_json_dict().items()))
        if key not in seen or attrs["step_time_ms"] < seen[key].step_time_ms:
            seen[key] = Candidate(
                trial_number=trial.number,
                spec=spec,
                step_time_ms=attrs["step_time_ms"],
                peak_bytes=metric_peak(attrs, mem_metric),
            )
    return sorted(seen.values(), key=lambda c: c.step_time_ms)


def smallest_peak(
    trials: Iterable[optuna.trial.FrozenTrial], mem_metric: str
) -> tuple[int, TrialSpec, str | None] | None:
    """The lowest measured peak, its configuration and the phase that set it."""
    measured = [t for t in trials if f"peak_{mem_metric}_bytes" in t.user_attrs]
    if not measured:
        return None
    best = min(measured, key=lambda t: metric_peak(t.user_attrs, mem_metric))
    attrs = best.user_attrs
    return (
        metric_peak(attrs, mem_metric),
        TrialSpec.from_json_dict(attrs["spec"]),
        attrs.get("peak_phase"),
    )


def baseline_trial(
    trials: Iterable[optuna.trial.FrozenTrial], label: str
) -> optuna.trial.FrozenTrial | None:
    """The last finished trial of the baseline named ``label`` (e.g. `FULL_AC`), or None."""
    found = None
    for trial in trials:
        if trial.user_attrs.get(BASELINE_ATTR) == label and "outcome" in trial.user_attrs:
            found = trial
    return found


def baseline_status(
    trials: Iterable[optuna.trial.FrozenTrial], *, limit_bytes: int, mem_metric: str, margin: float
) -> str:
    """Whether the unconstrained baseline can run under the limit.

    Returns:
        ``ok``; ``over_limit`` (measured, but its peak does not fit); the outcome that kept it
        from being measured (``oom``, ``crashed``, ...); or ``missing`` (not run yet).
    """
    trial = baseline_trial(trials, UNCONSTRAINED)
    if trial is None:
        return "missing"
    attrs = trial.user_attrs
    outcome = trial_outcome(attrs)
    if outcome is not TrialOutcome.OK or "step_time_ms" not in attrs:
        return outcome.value if outcome is not None else str(attrs.get("outcome", "missing"))
    peak = metric_peak(attrs, mem_metric)
    return "ok" if fits_limit(peak, limit_bytes=limit_bytes, margin=margin) else "over_limit"


def full_ac_step_ms(trials: Iterable[optuna.trial.FrozenTrial]) -> float | None:
    """The full block AC baseline's step time, when it was measured ``ok``."""
    trial = baseline_trial(trials, FULL_AC)
    if trial is None or trial_outcome(trial.user_attrs) is not TrialOutcome.OK:
        return None
    return trial.user_attrs.get("step_time_ms")


SETTLED_ATTR = "settled"
"""Study user attr: ``{knob: {"value": ..., "reason": ...}}``, the free choices the opening
held for the rest of the study (`search.structured`)."""


def describe_settlements(attr: Mapping[str, Any] | None) -> tuple[str, ...]:
    """One line per held free choice: ``optimizer_impl='fused' ('fused' 6.1 GB ... )``."""
    return tuple(
        f"{knob}={entry.get('value')!r} ({entry.get('reason', '')})"
        for knob, entry in sorted((attr or {}).items())
    )


EXCLUDED_ATTR = "excluded"
"""Study user attr: knob values the search no longer proposes, each a dict with ``knob``,
``value``, ``reason``, ``error`` and ``trials`` (written by `search.crash_memory`)."""


def describe_exclusion(entry: Mapping[str, Any]) -> str:
    """One line for an exclusion: what, why, which trials, the error."""
    knob, value = entry.get("knob"), entry.get("value")
    what = "block AC" if knob == "block_ac" else f"{knob}={value}"
    trials = ", ".join(str(n) for n in entry.get("trials", []))
    return (
        f"{what} excluded: {entry.get('reason', 'crashed')} (trial {trials}): "
        f"{entry.get('error', '')}"
    )
