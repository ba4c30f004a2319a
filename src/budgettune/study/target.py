"""A study's trial target: which trials count toward it, and whether a worker should start one.

Every ``budgettune search`` sets the study's target to the counted trials that have started
(queued ones excluded) plus its ``--trials``, so it runs exactly that many more; every worker
(the search itself, ``budgettune worker`` on any host, one per GPU for ``--gpus``) runs trials
until the target is met. A trial counts unless it is a heartbeat-stale failure that Optuna
re-queued (`RetryHeartbeatStaleTrialCallback` adds a ``WAITING`` copy whose
``retry_history`` names it): the copy counts instead. So a worker killed mid-trial does not
end the study early, and its trial is re-run once. A crash or a timeout (the objective
raised) is a finished ``FAIL`` that counts, as is a retried copy that went stale again
(``max_retry=1``): the same broken configuration cannot loop forever.

Decisions are taken under the study's claim lock (`budgettune.storage.coordination`), so N
workers with target T end with exactly T counted trials.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

import optuna

from budgettune.storage.user_attrs import RETRY_HISTORY_ATTR, TARGET_ATTR

TrialState = optuna.trial.TrialState

HEARTBEAT_INTERVAL_S = 10
"""Optuna trial heartbeat; a trial silent for twice this is failed and retried once."""

FINISHED_STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


class NextStep(Enum):
    """What a worker does next."""

    RUN = "run"
    """Start (or pick up a queued) trial."""
    WAIT = "wait"
    """The target is claimed but other workers' trials still run: one may die and be retried."""
    STOP = "stop"
    """Every counted trial has finished."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialCount:
    """Where a study stands against its trial target."""

    target: int
    """The study's target (counted trials)."""
    counted: int
    """Trials that count: all but heartbeat-stale failures that were re-queued."""
    finished: int
    """Counted trials that are complete, pruned or failed."""
    waiting: int
    """Counted trials queued to run (baselines, retried copies)."""
    running: int
    """Counted running trials that may still be alive."""

    def next_step(self) -> NextStep:
        """Run while fewer than the target have started; else wait for the running ones.

        Optuna's ``ask`` takes a queued trial before it makes a new one, so a re-queued copy
        runs first; queued trials past the target (``--trials 2`` on a new study with three
        baselines) stay queued for the next search.
        """
        if self.counted - self.waiting < self.target:
            return NextStep.RUN
        if self.running > 0:
            return NextStep.WAIT
        return NextStep.STOP


def retried_numbers(trials: Iterable[optuna.trial.FrozenTrial]) -> set[int]:
    """Numbers of the trials Optuna re-queued as a copy (the copies name them)."""
    numbers: set[int] = set()
    for trial in trials:
        numbers.update(trial.system_attrs.get(RETRY_HISTORY_ATTR, ()))
    return numbers


def count_trials(
    trials: list[optuna.trial.FrozenTrial],
    *,
    target: int,
    alive_after: datetime.datetime | None = None,
) -> TrialCount:
    """Count a study's trials against ``target``.

    Args:
        trials: every trial of the study.
        target: the study's target.
        alive_after: a running trial that started before this cannot still be alive (it is
            past its timeout; e.g. left by a process killed before heartbeats existed), so
            nobody waits for it. None: every running trial may be alive.

    Returns:
        The `TrialCount`.
    """
    retried = retried_numbers(trials)
    counted = [t for t in trials if t.number not in retried]
    running = [t for t in counted if t.state == TrialState.RUNNING]
    if alive_after is not None:
        running = [
            t for t in running if t.datetime_start is None or t.datetime_start >= alive_after
        ]
    return TrialCount(
        target=target,
        counted=len(counted),
        finished=sum(t.state in FINISHED_STATES for t in counted),
        waiting=sum(t.state == TrialState.WAITING for t in counted),
        running=len(running),
    )


def study_count(study: optuna.Study, *, trial_timeout_s: float, heartbeat_s: float) -> TrialCount:
    """Count ``study``'s trials against its stored target (a study made before targets: what
    it has); a trial that started longer ago than its timeout plus twice the stale-trial grace
    (two heartbeats) cannot still be running. Call under the claim lock for a decision."""
    stored = study.user_attrs.get(TARGET_ATTR)
    target = int(stored) if stored is not None else len(study.trials)
    alive_after = datetime.datetime.now() - datetime.timedelta(
        seconds=trial_timeout_s + 2 * (2 * heartbeat_s)
    )
    return count_trials(study.get_trials(deepcopy=False), target=target, alive_after=alive_after)
