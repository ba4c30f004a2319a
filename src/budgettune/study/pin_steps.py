"""What the pin step needs of a search (`PinSteps`, which the `Searcher` has), as Protocols:
the pin step reads these, never the whole searcher."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import optuna

if TYPE_CHECKING:
    from budgettune.study.fresh import FreshJob
    from budgettune.study.spec import SearchSpec
    from budgettune.trial.results import TrialResult


class StudyTrials(Protocol):
    """The study's trials (an `optuna.Study`)."""

    def get_trials(self, deepcopy: bool = ...) -> list[optuna.trial.FrozenTrial]:
        """Every trial of the study."""
        ...


class PinRecorder(Protocol):
    """Where the pin is recorded (a `budgettune.storage.Storage`)."""

    def record_pin(
        self,
        *,
        study_name: str,
        pin: Mapping[str, Any],
        peak_bytes: int,
        step_time_ms: float,
        slowdown: float | None,
        limit_bytes: int,
        mem_metric: str,
    ) -> int:
        """Store the pin's JSON with its headline figures."""
        ...


class Notices(Protocol):
    """Receives one-line notices (a `search.study.SearchObserver`)."""

    def notice(self, text: str) -> None:
        """Something the user should read as it happens."""
        ...


class PinSteps(Protocol):
    """What the pin step needs of a search (the `Searcher` has it): the search's spec, its
    study's trials, fresh re-measurements, somewhere to say what it does and to record the
    pin, and the run folder its errors point to."""

    @property
    def search(self) -> SearchSpec:
        """The search: its limit, metric, margin, ``--top-k``, workload and study name."""
        ...

    @property
    def study(self) -> StudyTrials:
        """The study's trials."""
        ...

    @property
    def store(self) -> PinRecorder:
        """Where the pin is recorded."""
        ...

    @property
    def observer(self) -> Notices:
        """Where notices go."""
        ...

    @property
    def runs_dir(self) -> Path:
        """The study's run folder (trial logs)."""
        ...

    @property
    def fresh_slots(self) -> int:
        """How many fresh runs go out at once (the search's device slots; 1 on one device)."""
        ...

    def fresh_batch(
        self, jobs: Sequence[FreshJob], runs: int | None = None
    ) -> list[list[TrialResult]]:
        """Measure each job ``runs`` times (default ``--reverify``) in fresh processes (the
        runs it has stored count)."""
        ...
