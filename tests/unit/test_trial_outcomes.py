"""Issue 29, items 4 and 7: a non-finite first-step loss is its own outcome wherever outcomes
are read (show, the dashboard, crash memory, sharded merges, an old database), and exit 4
("no trial could be measured") is told apart from exit 3 ("nothing measured fits")."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import pytest

from budgettune.errors import NoFeasibleConfigError, NothingMeasuredError
from budgettune.present.dashboard_views import trial_points
from budgettune.present.report import study_report
from budgettune.storage import open_storage
from budgettune.storage.trials import BASELINE_ATTR, UNCONSTRAINED, trial_outcome
from budgettune.study.crash_memory import find_exclusions
from budgettune.study.pin import no_feasible_error, nothing_measured_error
from budgettune.trial.ranks import merge_rank_results
from budgettune.trial.results import TrialOutcome, TrialResult
from budgettune.trial.spec import TrialSpec

State = optuna.trial.TrialState
LIMIT = 150_000_000


def _measured(outcome: str, *, peak: int, ms: float, loss: float, **extra: Any) -> dict:
    return {
        "outcome": outcome,
        "error": "",
        "spec": TrialSpec().to_json_dict(),
        "peak_device_bytes": peak,
        "step_time_ms": ms,
        "peak_phase": "backward",
        "loss": loss,
        "grad_norm": 1.0,
        "constraint": [peak * 1.03 - LIMIT],
        **extra,
    }


@pytest.mark.parametrize(
    ("attrs", "expected"),
    [
        ({"outcome": "ok", "loss": 2.0, "grad_norm": 1.0}, TrialOutcome.OK),
        ({"outcome": "ok", "loss": math.nan, "grad_norm": 1.0}, TrialOutcome.NON_FINITE),
        ({"outcome": "ok", "loss": 2.0, "grad_norm": math.inf}, TrialOutcome.NON_FINITE),
        ({"outcome": "ok", "loss": None, "grad_norm": 1.0}, TrialOutcome.NON_FINITE),
        ({"outcome": "non_finite", "error": "first-step loss nan"}, TrialOutcome.NON_FINITE),
        ({"outcome": "oom"}, TrialOutcome.OOM),
        ({"outcome": "from_a_newer_budgettune"}, None),
        ({}, None),  # queued, running or interrupted
    ],
)
def test_trial_outcome_reads_old_and_new_attrs(attrs: dict, expected) -> None:
    assert trial_outcome(attrs) is expected


def test_show_and_the_dashboard_never_count_a_non_finite_trial_as_fitting(tmp_path: Path) -> None:
    url = str(tmp_path / "bt.db")
    with open_storage(url) as store:
        study = optuna.create_study(study_name="s", storage=store.optuna_storage)
        study.set_user_attr(
            "search",
            {"workload": "w.py:build", "max_mem_bytes": LIMIT, "mem_metric": "device"},
        )
        # an old database: the unconstrained baseline stored `ok`, COMPLETE, with a NaN loss,
        # the fastest of all: the "best feasible" that re-verification then failed
        old = _measured("ok", peak=100_000_000, ms=5.0, loss=math.nan)
        study.add_trial(
            optuna.trial.create_trial(value=5.0, user_attrs={**old, BASELINE_ATTR: UNCONSTRAINED})
        )
        new = {"outcome": "non_finite", "error": "first-step loss nan", "constraint": [LIMIT]}
        study.add_trial(optuna.trial.create_trial(state=State.PRUNED, user_attrs=new))
        fine = _measured("ok", peak=120_000_000, ms=9.0, loss=2.0)
        study.add_trial(optuna.trial.create_trial(value=9.0, user_attrs=fine))
        trials = study.get_trials()
    report = study_report(url, "s")
    assert [row.outcome for row in report.rows] == ["non_finite", "non_finite", "ok"]
    assert [row.feasible for row in report.rows] == [False, False, True]
    assert report.best is not None and report.best.number == 2
    assert [row.number for row in report.pareto] == [2]
    assert report.baseline_status == "non_finite"  # no reference to compare slowdowns with
    assert report.rows[2].slowdown is None
    assert [point.number for point in trial_points(trials, "device")] == [2]


def test_a_non_finite_trial_ran_so_crash_memory_does_not_blame_its_values() -> None:
    ac = {"block_ac_every": 2}
    crash = {"outcome": "crashed", "error": "RuntimeError: size (3)", "spec": ac}
    again = {"outcome": "crashed", "error": "RuntimeError: size (9)", "spec": ac}
    [entry] = find_exclusions([(1, crash), (2, again)], [])
    assert (entry["knob"], entry["value"]) == ("block_ac", "on")  # without it, blamed
    ran = {"outcome": "non_finite", "error": "loss nan", "spec": ac}
    assert find_exclusions([(0, ran), (1, crash), (2, again)], []) == []


def test_a_sharded_trial_keeps_its_ranks_non_finite_outcome() -> None:
    non_finite = TrialResult(
        outcome=TrialOutcome.NON_FINITE, error="first-step loss nan", failed_at_s=100.0
    )
    stopped = TrialResult(outcome=TrialOutcome.CRASHED, error="stopped", failed_stage="terminated")
    merged = merge_rank_results({0: stopped, 1: non_finite})
    assert (merged.outcome, merged.failed_rank) == (TrialOutcome.NON_FINITE, 1)
    assert "loss nan" in merged.error


@dataclass
class _Study:
    trials: list[optuna.trial.FrozenTrial]

    def get_trials(self, deepcopy: bool = False) -> list[optuna.trial.FrozenTrial]:
        return self.trials


@dataclass
class _Search:
    study_name: str = "s"
    max_mem_bytes: int = LIMIT
    mem_metric: str = "device"
    margin: float = 0.03


@dataclass
class _Searcher:
    study: _Study
    search: _Search = field(default_factory=_Search)
    runs_dir: str = "runs/s"


def _ended(number: int, outcome: str, **attrs: Any) -> optuna.trial.FrozenTrial:
    state = State.PRUNED if outcome in ("oom", "non_finite") else State.FAIL
    trial = optuna.trial.create_trial(
        state=state,
        user_attrs={"outcome": outcome, "spec": TrialSpec().to_json_dict(), **attrs},
    )
    trial.number = number
    return trial


def test_exit_4_when_no_trial_was_measured_names_the_first_trials_error_and_log() -> None:
    trials = [
        _ended(2, "timeout", error="trial exceeded its 300 s timeout", log_path="/r/2.log"),
        _ended(0, "crashed", error="ValueError: no parameters", log_path="/r/0.log"),
        _ended(1, "non_finite", error="first-step loss nan", log_path="/r/1.log"),
    ]
    error = nothing_measured_error(_Searcher(_Study(trials)))  # type: ignore[arg-type]
    assert isinstance(error, NothingMeasuredError) and error.exit_code == 4
    line = str(error)
    assert "1 crashed, 1 non_finite, 1 timeout" in line
    assert "trial 0, ended crashed: ValueError: no parameters (log: /r/0.log)" in line
    assert "\n" not in line


def test_exit_3_as_soon_as_one_trial_was_measured_or_ran_out_of_memory() -> None:
    crashed = _ended(0, "crashed", error="boom")
    oom = _ended(1, "oom", error="CUDA out of memory")
    searcher = _Searcher(_Study([crashed, oom]))
    assert nothing_measured_error(searcher) is None  # type: ignore[arg-type]
    error = no_feasible_error(searcher)  # type: ignore[arg-type]
    assert isinstance(error, NoFeasibleConfigError) and error.exit_code == 3
    assert "ran out of memory" in str(error)
    over = optuna.trial.create_trial(
        value=9.0, user_attrs=_measured("ok", peak=200_000_000, ms=9.0, loss=2.0)
    )
    assert nothing_measured_error(_Searcher(_Study([crashed, over]))) is None  # type: ignore[arg-type]
    empty = nothing_measured_error(_Searcher(_Study([])))  # type: ignore[arg-type]
    assert isinstance(empty, NothingMeasuredError) and "no finished trial" in str(empty)
