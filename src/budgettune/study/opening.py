"""Open a search's study: create it with its attrs and baselines, or resume it and check that
it was made for the same search (one heartbeat, one "fits"); queue its trials (the baselines,
and a copy of a trial that an interrupt or a file system fault stopped)."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any

import optuna

from budgettune import storage as storage_mod
from budgettune.errors import UsageError
from budgettune.present.dashboard_views import objective_name
from budgettune.storage.trials import FULL_AC, UNCONSTRAINED
from budgettune.storage.user_attrs import (
    BASELINE_ATTR,
    ENQUEUED_SPEC_ATTR,
    HEARTBEAT_ATTR,
    RETRY_HISTORY_ATTR,
    SEARCH_ATTR,
    SPEC_ATTR,
    TrialRecord,
)
from budgettune.study.expressible import keeps
from budgettune.study.space import spec_params
from budgettune.study.spec import SearchSpec
from budgettune.study.study import (
    HIGH_BUDGET,
    HIGH_BUDGET_RETRY,
    baseline_specs,
    high_budget_retry,
    make_sampler,
    study_attrs,
)
from budgettune.study.target import retried_numbers
from budgettune.trial.spec import TrialSpec

logger = logging.getLogger(__name__)


QUEUE_ATTRS = (BASELINE_ATTR, ENQUEUED_SPEC_ATTR)
"""The user attrs a queued trial carries, and a re-queued copy keeps."""


def enqueue_baseline(study: optuna.Study, search: SearchSpec, label: str, spec: TrialSpec) -> None:
    """Queue ``spec`` as the study's next trial, measured exactly so, labelled ``label``; not
    a point the search's target cannot express (`expressible.keeps`), but the references."""
    if label not in (UNCONSTRAINED, FULL_AC) and not keeps(spec, search.target):
        return
    study.enqueue_trial(
        spec_params(spec, search.space),
        user_attrs=TrialRecord(baseline=label, enqueued_spec=spec).to_attrs(),
    )


def retry_high_budget(
    study: optuna.Study, search: SearchSpec, notice: Callable[[str], None]
) -> None:
    """The high-budget probe crashed: queue it at the user's own values (once: the retry
    has a label of its own), so a leanest value the workload cannot take does not cost
    the study its look at the high budgets (`study.high_budget_retry`)."""
    spec = high_budget_retry(search)
    if spec is not None:
        enqueue_baseline(study, search, HIGH_BUDGET_RETRY, spec)
        notice(f"the {HIGH_BUDGET} probe crashed; measuring it again as given ({spec.describe()})")


def requeue(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
    """Queue a copy of a failed trial that its configuration did not fail (interrupted by
    SIGINT or SIGTERM, or its run folder or disk failed), to be measured by the next
    ``search`` or ``worker`` as Optuna re-runs a dead worker's trial.

    The copy carries the bookkeeping of Optuna's `RetryHeartbeatStaleTrialCallback`
    (``failed_trial``, ``retry_history`` in its system attrs, so `target.count_trials`
    counts the copy instead of the original), the trial's params (and an enqueued trial's
    ``fixed_params``), and only the queue's user attrs: a baseline stays that baseline. Unlike
    a heartbeat retry there is no limit: an interrupt says nothing about the configuration.
    """
    system_attrs = {"failed_trial": trial.number, **trial.system_attrs}
    system_attrs[RETRY_HISTORY_ATTR] = [
        *trial.system_attrs.get(RETRY_HISTORY_ATTR, ()),
        trial.number,
    ]
    study.add_trial(
        optuna.trial.create_trial(
            state=optuna.trial.TrialState.WAITING,
            params=trial.params,
            distributions=trial.distributions,
            user_attrs={k: v for k, v in trial.user_attrs.items() if k in QUEUE_ATTRS},
            system_attrs=system_attrs,
        )
    )


def stored_trial(
    study: optuna.Study, storage: optuna.storages.BaseStorage, number: int
) -> optuna.trial.FrozenTrial:
    """Trial ``number`` of ``study`` as the storage holds it now (not the study's cache)."""
    return storage.get_trial(_trial_id(study, storage, number))


def _trial_id(study: optuna.Study, storage: optuna.storages.BaseStorage, number: int) -> int:
    """The storage's id of trial ``number``, through the storage's public lookups (Optuna
    keeps the id private on its trial objects)."""
    study_id = storage.get_study_id_from_name(study.study_name)
    return storage.get_trial_id_from_study_id_trial_number(study_id, number)


def requeue_unfinished(
    study: optuna.Study, storage: optuna.storages.BaseStorage, number: int
) -> bool:
    """`requeue` the trial this process was running when an interrupt or a file system fault
    stopped it before its result was in.

    Optuna has failed it already when the interrupt came inside the objective; one that came
    around it (while the heartbeat stopped) is failed here. A trial with an outcome (its
    result was in) or re-queued already (by another worker's stale-trial check) is left.

    Returns:
        Whether a copy was queued.
    """
    trial_id = _trial_id(study, storage, number)
    trial = storage.get_trial(trial_id)
    if trial.state == optuna.trial.TrialState.RUNNING:
        storage.set_trial_state_values(trial_id, state=optuna.trial.TrialState.FAIL)
        trial = storage.get_trial(trial_id)
    if (
        trial.state != optuna.trial.TrialState.FAIL
        or TrialRecord.from_attrs(trial.user_attrs).finished
    ):
        return False
    if trial.number in retried_numbers(study.get_trials(deepcopy=False)):
        return False
    requeue(study, trial)
    logger.info("trial %d did not finish; queued to run again", trial.number)
    return True


def name_objective(study: optuna.Study, rows: int = 0) -> None:
    """Name the study's objective for the dashboard (not "Objective 0"; when it is made, older
    studies on their next publish)."""
    name = objective_name(rows)
    if study.metric_names != [name]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([name])


def open_study(
    search: SearchSpec, store: storage_mod.Storage, *, create: bool, heartbeat_s: int
) -> tuple[optuna.Study, bool]:
    """Create the study (attrs, baselines) or load it; called under the claim lock.

    Only the process whose ``create_study`` succeeds enqueues the baselines, so two
    searches racing to create one study queue them once.
    """
    common: dict[str, Any] = dict(
        study_name=search.study_name,
        storage=store.optuna_storage,
        sampler=make_sampler(search),
    )
    if create and search.num_trials > 0:
        try:
            study = optuna.create_study(direction="minimize", load_if_exists=False, **common)
        except optuna.exceptions.DuplicatedStudyError:
            pass
        else:
            name_objective(study, search.ranking_rows)
            study.set_user_attr(SEARCH_ATTR, study_attrs(search))
            study.set_user_attr(SPEC_ATTR, search.to_json_dict())
            study.set_user_attr(HEARTBEAT_ATTR, heartbeat_s)
            for label, spec in baseline_specs(search):
                enqueue_baseline(study, search, label, spec)
            return study, True
    try:
        study = optuna.load_study(**common)
    except KeyError:
        if not create:
            raise
        # --trials 0 re-verifies and pins what a study holds: it makes none
        raise UsageError(
            f"--num-trials 0 re-verifies and pins an existing study, and {store.display_url} "
            f"holds no study {search.study_name!r}; give --num-trials N to start it"
        ) from None
    if not create:
        return study, False
    wanted = study_attrs(search)
    stored = study.user_attrs.get(SEARCH_ATTR)
    if stored is not None and "margin" not in stored:
        # A study from before the margin was part of "fits": it takes this search's.
        stored = {**stored, "margin": wanted["margin"]}
        study.set_user_attr(SEARCH_ATTR, stored)
    if stored is None:
        study.set_user_attr(SEARCH_ATTR, wanted)
    elif stored != wanted:
        diff = ", ".join(
            f"{k}: stored {stored.get(k)!r} vs given {wanted.get(k)!r}"
            for k in sorted(set(stored) | set(wanted))
            if stored.get(k) != wanted.get(k)
        )
        raise UsageError(
            f"study {search.study_name!r} was made for another search ({diff}); "
            "pass the stored value, or --study-name NAME to start a new study"
        )
    # Workers read the spec of the newest search that raised the target.
    study.set_user_attr(SPEC_ATTR, search.to_json_dict())
    # Every process of a study beats alike: a study from before the attr gets this one's.
    if HEARTBEAT_ATTR in study.user_attrs:
        store.optuna_storage.heartbeat_interval = int(study.user_attrs[HEARTBEAT_ATTR])
    else:
        study.set_user_attr(HEARTBEAT_ATTR, heartbeat_s)
    return study, False
