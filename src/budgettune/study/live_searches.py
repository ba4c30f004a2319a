"""The searches adding trials to a study right now, so that each adds exactly its ``--num-trials``.

A ``search`` sets the study's target to the trials started so far plus its own N. Two
searches started at once on a new study both saw none started and both set the target to N
(issue 48: two ``--num-trials 3`` ended with 3 trials in all). So each search registers
itself in the study (`LIVE_ATTR`, under the claim lock) while it runs, and a search that finds
another one live adds its N to the target that one set; one that finds none (they finished, or
died and left their target unmet) counts from the trials started, as before, so a target a
killed search left behind is not run by the next one.

A registration is live when its process is (same host: the pid exists; another host: it
wrote within the trial timeout plus two stale-trial graces, or a trial of that host runs).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import optuna

from budgettune.storage.coordination import ClaimLock
from budgettune.storage.trials import UNCONSTRAINED, record_of, unconstrained_baseline
from budgettune.storage.user_attrs import HEARTBEAT_ATTR, LIVE_ATTR, TARGET_ATTR, WORKER_ATTR
from budgettune.study.spec import SearchSpec
from budgettune.study.target import (
    HEARTBEAT_INTERVAL_S,
    TrialCount,
    TrialState,
    retried_numbers,
)

logger = logging.getLogger(__name__)


def search_id() -> str:
    """This process's registration key: ``host:pid:start``."""
    return f"{socket.gethostname()}:{os.getpid()}:{time.time():.3f}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    except (OverflowError, ValueError):
        return False
    return True


def _running_hosts(study: optuna.Study) -> set[str]:
    running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    return {
        str(t.user_attrs.get(WORKER_ATTR, "")).split(":", 1)[0]
        for t in running
        if t.user_attrs.get(WORKER_ATTR)
    }


def live_entries(
    study: optuna.Study, *, stale_s: float, now: float | None = None
) -> dict[str, dict[str, Any]]:
    """The study's registered searches that are still live (see the module's docstring)."""
    stored = study.user_attrs.get(LIVE_ATTR)
    if not isinstance(stored, Mapping):
        return {}
    now = time.time() if now is None else now
    here = socket.gethostname()
    hosts: set[str] | None = None
    live: dict[str, dict[str, Any]] = {}
    for key, entry in stored.items():
        if not isinstance(entry, Mapping):
            continue
        host, pid, at = entry.get("host"), entry.get("pid"), entry.get("at")
        if host == here:
            alive = isinstance(pid, int) and _pid_alive(pid)
        else:
            if hosts is None:
                hosts = _running_hosts(study)
            fresh = isinstance(at, int | float) and now - float(at) < stale_s
            alive = fresh or host in hosts
        if alive:
            live[str(key)] = dict(entry)
    return live


def new_target(*, started: int, current: int | None, others_live: bool, adding: int) -> int:
    """The study's target after a search adding ``adding`` trials opens it: on top of the
    target a live search set (it still runs toward it), else on top of the trials started."""
    base = max(started, current) if others_live and current is not None else started
    return base + adding


def add_to_target(
    study: optuna.Study,
    count: TrialCount,
    search: SearchSpec,
    notice: Callable[[str], None],
    *,
    created: bool,
) -> str:
    """Raise the study's target by ``--num-trials`` (`new_target`) and register this search
    as live. Under the claim lock. A new study's baselines are part of its first N; on a
    resumed study, queued ones are not started: --num-trials N runs N, and more only where
    the unconstrained baseline is queued behind more than N (`reference_queue_position`).

    Returns:
        This search's registration key (for `touch` and `leave`).
    """
    heartbeat_s = float(study.user_attrs.get(HEARTBEAT_ATTR) or HEARTBEAT_INTERVAL_S)
    live = live_entries(study, stale_s=search.trial_timeout_s + 4 * heartbeat_s)
    stored = study.user_attrs.get(TARGET_ATTR)
    adding = search.num_trials
    position = None if created else reference_queue_position(study.get_trials(deepcopy=False))
    if position is not None and position > adding:
        notice(
            f"the study's unconstrained baseline (its numerics reference and the pin's "
            f"baseline) is queued behind {position - 1} other trial(s): this search runs "
            f"{position} trials, not {adding}, to measure it"
        )
        adding = position
    target = new_target(
        started=0 if created else count.counted - count.waiting,
        current=None if stored is None else int(stored),
        others_live=bool(live),
        adding=adding,
    )
    study.set_user_attr(TARGET_ATTR, target)
    key = search_id()
    register(study, key, live)
    return key


def reference_queue_position(trials: Sequence[optuna.trial.FrozenTrial]) -> int | None:
    """Where in the queue (1: next) the unconstrained baseline waits, when it is queued and
    not measured (issue 48: Ctrl-C during trial 0 queued its copy behind the other baselines,
    and the next ``--num-trials 2`` pinned with no baseline); None otherwise."""
    if unconstrained_baseline(trials) is not None:
        return None
    retried = retried_numbers(trials)
    waiting = sorted(
        (t for t in trials if t.state == TrialState.WAITING and t.number not in retried),
        key=lambda t: t.number,
    )
    for position, trial in enumerate(waiting, start=1):
        if record_of(trial).baseline == UNCONSTRAINED:
            return position
    return None


def register(study: optuna.Study, key: str, live: Mapping[str, Mapping[str, Any]]) -> None:
    """Write ``live`` (the entries found live) plus this search's entry. Under the claim lock."""
    entries = {k: dict(v) for k, v in live.items()}
    entries[key] = {"host": socket.gethostname(), "pid": os.getpid(), "at": round(time.time(), 3)}
    study.set_user_attr(LIVE_ATTR, entries)


def touch(study: optuna.Study, key: str | None) -> None:
    """Mark this search's entry as written now (another host reads it live). Under the lock.
    None (a worker, or a search adding no trials): nothing."""
    if key is None:
        return
    stored = study.user_attrs.get(LIVE_ATTR)
    if isinstance(stored, Mapping) and isinstance(stored.get(key), Mapping):
        entries = {k: dict(v) for k, v in stored.items() if isinstance(v, Mapping)}
        entries[key]["at"] = round(time.time(), 3)
        study.set_user_attr(LIVE_ATTR, entries)


def leave(study: optuna.Study, claim: ClaimLock, key: str | None) -> None:
    """`unregister` under the claim lock, on the way out: best effort (a failing database
    is the error the user sees, never this; an entry left behind reads as dead once this
    process is gone). None: nothing."""
    if key is None:
        return
    try:
        claim.acquire()
        try:
            unregister(study, key)
        finally:
            claim.release()
    except Exception:  # noqa: BLE001
        logger.debug("could not drop live-search entry %s", key, exc_info=True)


def unregister(study: optuna.Study, key: str) -> None:
    """Drop this search's entry (it adds no more trials). Under the claim lock."""
    stored = study.user_attrs.get(LIVE_ATTR)
    if isinstance(stored, Mapping) and key in stored:
        study.set_user_attr(
            LIVE_ATTR,
            {k: dict(v) for k, v in stored.items() if k != key and isinstance(v, Mapping)},
        )
