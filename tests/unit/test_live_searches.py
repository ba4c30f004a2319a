"""Issue 48 item 8: searches started at once each add their --num-trials; a queued unconstrained
baseline is measured by the next search (`budgettune.study.live_searches`)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from budgettune import storage
from budgettune.storage.user_attrs import LIVE_ATTR, TARGET_ATTR
from budgettune.study import live_searches
from budgettune.study.searcher import Searcher
from budgettune.study.study import SearchObserver
from budgettune.study.study_file import build_search_spec


def test_a_live_search_target_is_added_to_and_a_dead_one_is_not() -> None:
    # a live search set 3 and none started yet: 3 more on top
    assert live_searches.new_target(started=0, current=3, others_live=True, adding=3) == 6
    # it ran past its target already (or the target predates it): from the trials started
    assert live_searches.new_target(started=5, current=3, others_live=True, adding=2) == 7
    # nobody live: a target a killed search left unmet is not this search's to run
    assert live_searches.new_target(started=1, current=20, others_live=False, adding=2) == 3


def _study(tmp_path: Path, entries: dict) -> optuna.Study:
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'live.db'}", study_name="s")
    study.set_user_attr(LIVE_ATTR, entries)
    return study


def test_live_entries_read_a_pid_here_and_a_fresh_write_elsewhere(tmp_path: Path) -> None:
    here = socket.gethostname()
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    now = time.time()
    study = _study(
        tmp_path,
        {
            "me": {"host": here, "pid": os.getpid(), "at": 0},
            "gone": {"host": here, "pid": int(gone.stdout), "at": now},
            "far-fresh": {"host": "elsewhere", "pid": 1, "at": now - 10},
            "far-stale": {"host": "elsewhere", "pid": 1, "at": now - 4000},
            "junk": [1, 2],
        },
    )
    assert sorted(live_searches.live_entries(study, stale_s=1000)) == ["far-fresh", "me"]
    # a stale entry of another host still lives while a trial of that host runs
    trial = study.ask()
    trial.set_user_attr("worker", "elsewhere:cuda:0")
    assert sorted(live_searches.live_entries(study, stale_s=1000)) == [
        "far-fresh",
        "far-stale",
        "me",
    ]


def _spec(url: str, tmp_path: Path, trials: int):
    return build_search_spec(
        {
            "workload": "builtin:tiny-gpt",
            "max_mem": "125MB",
            "num_trials": trials,
            "study_name": "race",
            "storage_url": url,
            "runs_dir": str(tmp_path / "runs"),
            "space": {"compile_backend": "aot_eager_decomp_partition"},
        },
        default_device="cpu",
    )


def _open(url: str, tmp_path: Path, trials: int) -> Searcher:
    return Searcher(_spec(url, tmp_path, trials), storage.open_storage(url))


def test_two_searches_at_once_add_both_and_a_closed_one_leaves_no_entry(tmp_path: Path) -> None:
    # issue 48: two `search --num-trials 3` at once on a new study ended with 3 trials in all
    url = f"sqlite:///{tmp_path / 'race.db'}"
    first = _open(url, tmp_path, 3)
    second = _open(url, tmp_path, 3)
    study = optuna.load_study(study_name="race", storage=url)
    assert study.user_attrs[TARGET_ATTR] == 6
    assert len(study.user_attrs[LIVE_ATTR]) == 2
    first.close()
    second.close()
    assert optuna.load_study(study_name="race", storage=url).user_attrs[LIVE_ATTR] == {}
    # both went without running a trial: the next search counts from what started (none)
    third = _open(url, tmp_path, 2)
    assert optuna.load_study(study_name="race", storage=url).user_attrs[TARGET_ATTR] == 2
    third.close()


def test_a_queued_unconstrained_baseline_is_measured_by_the_next_search(tmp_path: Path) -> None:
    # issue 48: Ctrl-C during trial 0 queued its copy behind the two other baselines, and the
    # next `--num-trials 2` pinned with baseline_status "missing"
    from budgettune.study.opening import requeue

    url = f"sqlite:///{tmp_path / 'race.db'}"
    _open(url, tmp_path, 3).close()
    study = optuna.load_study(study_name="race", storage=url)
    trial = study.ask()  # the search pops trial 0, the unconstrained baseline
    assert trial.number == 0 and trial.user_attrs["baseline"] == "unconstrained"
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    requeue(study, study.trials[0])
    trials = study.get_trials(deepcopy=False)
    position = live_searches.reference_queue_position(trials)
    baselines = [t.user_attrs.get("baseline") for t in trials if t.state.name == "WAITING"]
    assert position == baselines.index("unconstrained") + 1 and position > 2
    started = sum(t.state.name != "WAITING" for t in trials) - 1  # trial 0's copy counts instead
    observer = _Notes()
    Searcher(_spec(url, tmp_path, 2), storage.open_storage(url), observer).close()
    study = optuna.load_study(study_name="race", storage=url)
    assert study.user_attrs[TARGET_ATTR] == started + position  # not started + 2
    [line] = observer.lines
    assert f"runs {position} trials, not 2" in line


class _Notes(SearchObserver):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def notice(self, text: str) -> None:
        self.lines.append(text)


@pytest.mark.parametrize("measured", [True, False])
def test_no_raise_once_the_baseline_is_measured(tmp_path: Path, measured: bool) -> None:
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'q.db'}", study_name="q")
    attrs = {"baseline": "unconstrained"}
    if measured:
        attrs |= {"outcome": "ok", "step_time_ms": 10.0}
        study.add_trial(optuna.trial.create_trial(value=10.0, user_attrs=attrs))
    study.enqueue_trial({}, user_attrs={"baseline": "block-ac-every-1"})
    study.enqueue_trial({}, user_attrs={"baseline": "unconstrained"})
    found = live_searches.reference_queue_position(study.get_trials(deepcopy=False))
    assert found == (None if measured else 2)
