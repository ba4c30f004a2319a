"""Open a search's study: create it with its attrs and baselines, or resume it and check that
it was made for the same search (one heartbeat, one "fits")."""

from __future__ import annotations

from typing import Any

import optuna

from budgettune import storage as storage_mod
from budgettune.errors import UsageError
from budgettune.search.space import spec_params
from budgettune.search.spec import SearchSpec
from budgettune.search.study import (
    HEARTBEAT_ATTR,
    SEARCH_ATTR,
    SPEC_ATTR,
    baseline_specs,
    make_sampler,
    study_attrs,
)
from budgettune.storage.trials import BASELINE_ATTR
from budgettune.trial.spec import TrialSpec


def enqueue_baseline(study: optuna.Study, search: SearchSpec, label: str, spec: TrialSpec) -> None:
    """Queue ``spec`` as the study's next trial, measured exactly so, labelled ``label``."""
    study.enqueue_trial(
        spec_params(spec, search.space),
        user_attrs={BASELINE_ATTR: label, "enqueued_spec": spec.to_json_dict()},
    )


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
            f"--trials 0 re-verifies and pins an existing study, and {store.display_url} "
            f"holds no study {search.study_name!r}; give --trials N to start it"
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
            "pass the stored value, or --study NAME to start a new study"
        )
    # Workers read the spec of the newest search that raised the target.
    study.set_user_attr(SPEC_ATTR, search.to_json_dict())
    # Every process of a study beats alike: a study from before the attr gets this one's.
    if HEARTBEAT_ATTR in study.user_attrs:
        store.optuna_storage.heartbeat_interval = int(study.user_attrs[HEARTBEAT_ATTR])
    else:
        study.set_user_attr(HEARTBEAT_ATTR, heartbeat_s)
    return study, False
