"""benchmarks/workers_rate.py: trials/hour and worker cycles from trial timestamps and logs."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from budgettune import storage

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 11, 22, 2, 31, 0)


def _module():
    return importlib.import_module("benchmarks.workers_rate")


def _trial(number: int, start_s: float, end_s: float | None, worker: str | None):
    trial = create_trial(
        state=TrialState.COMPLETE if end_s is not None else TrialState.RUNNING,
        value=1.0 if end_s is not None else None,
        params={"x": 0.5},
        distributions={"x": FloatDistribution(0, 1)},
        user_attrs={} if worker is None else {"worker": worker},
    )
    trial.number = number
    trial.datetime_start = T0 + timedelta(seconds=start_s)
    trial.datetime_complete = None if end_s is None else T0 + timedelta(seconds=end_s)
    return trial


def test_two_workers_rate_and_cycle() -> None:
    rate = _module().rate
    trials = [
        _trial(0, 0, 20, "h:cuda:0"),
        _trial(1, 1, 22, "h:cuda:1"),
        _trial(2, 25, 45, "h:cuda:0"),
        _trial(3, 31, 60, "h:cuda:1"),
    ]
    r = rate(trials)
    assert (r.finished, r.workers, r.span_s) == (4, 2, 60.0)
    assert r.per_hour == pytest.approx(4 * 60)
    assert r.cycle_s == pytest.approx((25 + 30) / 2)


def test_a_study_cut_short_keeps_the_cycle_of_its_running_trial() -> None:
    rate = _module().rate
    r = rate([_trial(0, 0, 22, None), _trial(1, 27.5, None, None)], {0: "w", 1: "w"})
    assert (r.finished, r.workers, r.span_s) == (1, 1, 22.0)
    assert r.cycle_s == pytest.approx(27.5)


def test_without_a_worker_for_every_trial_there_is_no_cycle() -> None:
    rate = _module().rate
    r = rate([_trial(0, 0, 20, "a"), _trial(1, 1, 21, None), _trial(2, 25, 40, "a")])
    assert r.cycle_s is None and r.workers == 0 and r.finished == 3


def test_workers_from_logs_reads_sections(tmp_path: Path) -> None:
    log = tmp_path / "logs.txt"
    log.write_text(
        "==> /tmp/runs/team/workers/cuda0.log <==\n"
        "trial 1: ok 19.01 GB, 188.7 ms\n"
        "team ━━━ 4/8\n"
        "trial 2: ok 19.02 GB, 167.0 ms\n\n"
        "==> /tmp/runs/team/workers/cuda1.log <==\n"
        "trial 0: ok 19.02 GB, 216.8 ms\n"
    )
    assert _module().workers_from_logs([log]) == {"team": {1: "cuda0", 2: "cuda0", 0: "cuda1"}}


def test_main_prints_one_row_per_study(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    with storage.open_storage(url) as store:  # a budgettune storage, as the script reads
        study = optuna.create_study(study_name="solo", storage=store.optuna_storage)
        study.add_trials([_trial(0, 0, 30, "h:cuda"), _trial(1, 36, 66, "h:cuda")])
    assert _module().main([url]) == 0
    row = capsys.readouterr().out.strip().splitlines()[-1]
    assert row == "| solo | 1 | 2 | 66.0 | 109 | 36.0 | 100 |"


def test_main_refuses_a_missing_storage_in_one_line(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.workers_rate", f"sqlite:///{tmp_path}/none.db"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        f"error: no storage at sqlite:///{tmp_path}/none.db; run `budgettune search` first"
    ]
    assert not (tmp_path / "none.db").exists()
