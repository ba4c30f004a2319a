"""The limit against the workload's steady memory (parameters + gradients + optimizer state,
which no recompute setting changes): a limit under it is refused, not searched."""

from __future__ import annotations

import optuna

from budgettune.errors import UsageError
from budgettune.storage.user_attrs import TrialRecord
from budgettune.units import format_bytes


def check_steady(study: optuna.Study, limit: int) -> None:
    """Refuse a limit below the steady memory some earlier trial of ``study`` measured.

    Raises:
        UsageError: the limit is under a measured steady memory.
    """
    for trial in study.get_trials(deepcopy=False):
        steady = TrialRecord.from_attrs(trial.user_attrs).steady_bytes
        error = steady_error(limit, steady, trial=trial.number)
        if error is not None:
            raise error


def steady_error(limit: int, steady: int | None, *, trial: int | None = None) -> UsageError | None:
    """The error for a limit under the workload's steady memory (parameters + gradients +
    optimizer state, which no recompute setting changes); None when the limit is above it."""
    if steady is None or steady < limit:
        return None
    where = "" if trial is None else f", measured in trial {trial}"
    return UsageError(
        f"--max-mem {format_bytes(limit)} is below the workload's steady memory "
        f"{format_bytes(steady)} (parameters + gradients + optimizer state{where}): no "
        "recompute setting can fit; raise the limit"
    )
