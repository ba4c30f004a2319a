"""Writing budgettune's views of a study into its optuna-dashboard page.

The views are built by `budgettune.present.dashboard_views`; this is the one place they are
written (as study system attrs, through optuna-dashboard's Python API), after each trial batch.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

import optuna
import optuna_dashboard

from budgettune.errors import PinnedConfigError, StorageError, StudyNotFoundError, one_line
from budgettune.pinning import parse_pin
from budgettune.present.dashboard_views import (
    PLOT_ID,
    memory_time_figure,
    study_note,
    trial_points,
)
from budgettune.storage.records import StudyLimit
from budgettune.storage.trials import record_of
from budgettune.storage.unreadable import stored_object
from budgettune.storage.user_attrs import SEARCH_ATTR
from budgettune.study.opening import name_objective

logger = logging.getLogger(__name__)


class ViewStore(Protocol):
    """What publishing needs of the storage (a `budgettune.storage.Storage`)."""

    @property
    def optuna_storage(self) -> optuna.storages.BaseStorage:
        """Optuna's storage, where the study and its dashboard views live."""
        ...

    @property
    def display_url(self) -> str:
        """The storage URL with its password masked, for messages."""
        ...

    def latest_pin(self, study_name: str) -> Mapping[str, Any] | None:
        """The study's current pin JSON, or None."""
        ...


def publish_views(storage: ViewStore, study_name: str) -> None:
    """Push budgettune's views of a study into its optuna-dashboard page.

    Writes the memory × time scatter (graph object `PLOT_ID`) and the study note; calling it
    again replaces both.

    Args:
        storage: the open study storage.
        study_name: the study.

    Raises:
        StudyNotFoundError: no such study in the storage.
        StorageError: the storage could not be written.
    """
    study, figure, note, count = study_views(storage, study_name)
    if study.metric_names is None:  # a study made before its objective was named
        name_objective(study)
    try:
        optuna_dashboard.save_plotly_graph_object(study, figure, graph_object_id=PLOT_ID)
        optuna_dashboard.save_note(study, note)
    except optuna.exceptions.StorageInternalError as exc:
        raise StorageError(
            f"storage {storage.display_url}: cannot publish the dashboard views of "
            f"{study_name!r}: {exc}"
        ) from exc
    logger.debug("published dashboard views of %s (%d trials)", study_name, count)


def study_views(storage: ViewStore, study_name: str) -> tuple[optuna.Study, Any, str, int]:
    """A study's memory × time figure (plotly) and note, as the dashboard shows them (and
    ``show --plot`` writes), with the study and its number of trials.

    Raises:
        StudyNotFoundError: no such study in the storage.
    """
    try:
        study = optuna.load_study(study_name=study_name, storage=storage.optuna_storage)
    except KeyError:
        raise StudyNotFoundError(f"no study {study_name!r} in {storage.display_url}") from None
    search = stored_object(study.user_attrs, SEARCH_ATTR)
    study_limit = StudyLimit.of(search)
    metric = study_limit.mem_metric
    trials = study.get_trials(deepcopy=False)
    rows = int(search.get("ranking_rows", 0) or 0)  # a study ranked per row (issue 46)
    points = trial_points(trials, metric, rows)
    num_failed = sum(
        (outcome := record_of(t).outcome) is not None and not outcome.tells_fit() for t in trials
    )
    pin = None
    try:  # a corrupt stored row is drawn as no pin, never a traceback (issue 48)
        stored = storage.latest_pin(study_name)
        if stored is not None:
            pin = parse_pin(stored, source=f"study {study_name!r}'s stored pin").pin
    except PinnedConfigError:
        pin = None
    figure = memory_time_figure(
        points, limit_bytes=study_limit.max_mem_bytes, mem_metric=metric, pin=pin, rows=rows
    )
    try:
        optuna_best: int | None = study.best_trial.number
    except ValueError:  # no complete trial yet
        optuna_best = None
    note = study_note(
        study_name=study_name,
        search=search,
        points=points,
        num_failed=num_failed,
        pin=pin,
        optuna_best=optuna_best,
    )
    return study, figure, note, len(trials)


def refresh_views(storage: ViewStore, study_name: str) -> None:
    """`publish_views`, with a failure logged instead of raised: the views are a nicety, and
    the search must go on."""
    try:
        publish_views(storage, study_name)
    except Exception as exc:  # noqa: BLE001 - the views are a nicety; the search must go on
        # One line: a storage outage also stops the search right after, with its own line;
        # the traceback is there for `--debug`.
        logger.warning("could not refresh the dashboard views: %s", one_line(exc))
        logger.debug("dashboard views traceback", exc_info=True)
