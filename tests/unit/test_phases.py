"""Where a trial process's wall time goes (`budgettune.trial.phases`): the clock's laps, the
launcher's exit, sharded merges, what is read back from files and databases, and the table
`show --phases` prints."""

from __future__ import annotations

import json
import time

import pytest

from budgettune.present.phases import (
    UNSPLIT,
    PhaseRow,
    phase_of,
    phase_summary,
    phase_table,
    totals,
)
from budgettune.trial.phases import (
    PHASES,
    PhaseClock,
    check_phases,
    merge_phases,
    with_exit,
)
from budgettune.trial.results import TrialOutcome, TrialResult


def test_laps_close_each_phase_and_a_wait_is_taken_out_of_the_running_one() -> None:
    clock = PhaseClock(time.monotonic() - 1.0)  # the launcher started the child 1 s ago
    clock.lap("start")
    time.sleep(0.05)
    clock.add("gpu_wait", 0.02)  # of the 50 ms since, 20 were a wait for the GPU
    clock.lap("compile")
    seconds = clock.seconds()
    assert list(seconds) == ["start", "compile", "gpu_wait"]
    assert seconds["start"] == pytest.approx(1.0, abs=0.05)
    assert seconds["compile"] == pytest.approx(0.03, abs=0.02)
    assert seconds["gpu_wait"] == 0.02
    clock.lap("compile")  # a phase lapped again adds up
    assert clock.seconds()["compile"] >= seconds["compile"]
    with pytest.raises(ValueError, match="unknown phase 'nap'"):
        clock.lap("nap")


def test_the_launcher_adds_exit_so_the_phases_add_up_to_the_wall_time() -> None:
    phases = with_exit({"start": 1.0, "compile": 5.0}, 6.5)
    assert phases == {"start": 1.0, "compile": 5.0, "exit": 0.5}
    assert sum(phases.values()) == pytest.approx(6.5)
    assert with_exit({}, 3.0) == {}  # a child that wrote nothing (a crash) has no phases
    assert with_exit({"start": 2.0}, 1.0)["exit"] == 0.0


def test_a_sharded_trial_takes_each_phase_of_its_slowest_rank() -> None:
    merged = merge_phases([{"compile": 3.0, "start": 1.0}, {"start": 2.0, "compile": 1.0}])
    assert merged == {"start": 2.0, "compile": 3.0}
    assert list(merged) == [p for p in PHASES if p in merged]


@pytest.mark.parametrize(
    "bad", [{"nap": 1.0}, {"start": -1.0}, {"start": float("inf")}, {"start": True}, [1.0]]
)
def test_phases_read_back_are_checked(bad: object) -> None:
    with pytest.raises(ValueError):
        check_phases(bad)  # type: ignore[arg-type]


def test_a_result_keeps_its_phases_in_order_through_json() -> None:
    result = TrialResult(
        outcome=TrialOutcome.CRASHED, error="x", phases_s={"exit": 0.1, "start": 0.2}
    )
    text = json.dumps(result.to_json_dict(), sort_keys=True)
    back = TrialResult.from_json_dict(json.loads(text))
    assert list(back.phases_s) == ["start", "exit"] and back == result
    old = {k: v for k, v in result.to_json_dict().items() if k not in ("phases_s", "cold_caches")}
    assert TrialResult.from_json_dict(old).phases_s == {}  # a result from before phases


def test_the_phase_table_totals_each_kind_and_splits_old_runs() -> None:
    rows = [
        PhaseRow(kind="trial", trial_number=0, outcome="ok", wall_s=10.0,
                 phases_s={"imports": 4.0, "compile": 6.0}),
        PhaseRow(kind="reverify", trial_number=0, outcome="oom", wall_s=5.0,
                 phases_s={"compile": 3.0, UNSPLIT: 2.0}),
    ]  # fmt: skip
    assert totals(rows) == {"imports": 4.0, "compile": 9.0, UNSPLIT: 2.0}
    from rich.console import Console

    console = Console(width=120, record=True)
    console.print(phase_table(rows, title="t"))
    text = console.export_text()
    assert "reverify 0 (oom)" in text and "2 processes" in text and "60%" in text
    narrow = Console(width=80, record=True)  # what `show --phases` prints fits a terminal
    narrow.print(phase_summary(rows, title="t"))
    summary = narrow.export_text()
    assert "…" not in summary and "1 trial s" in summary and "2 processes s" in summary
    assert "compile" in summary and "60 %" in summary and "100 %" in summary


def test_an_old_run_counts_its_first_step_as_compile_and_the_rest_unsplit() -> None:
    from datetime import datetime, timezone

    from budgettune.storage.records import StoredMeasurement
    from budgettune.trial.spec import TrialSpec

    run = StoredMeasurement(
        id=1, study_name="s", trial_number=3, kind="trial", workload_digest=None,
        spec=TrialSpec(), outcome=TrialOutcome.OK, peak_allocated_bytes=1, compile_s=30.0,
        wall_s=40.0, created_at=datetime.now(timezone.utc),
    )  # fmt: skip
    row = phase_of(run)
    assert row.phases_s == {"compile": 30.0, UNSPLIT: 10.0}


def test_a_worker_says_how_far_into_the_search_it_got_ready(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 44: the time from a 4-GPU search's command to its first trial (9.5-15 s) was
    not explained; each worker now logs its start, imports and readiness against the
    search's start (its process start as a `time.monotonic` reading, handed down)."""
    import subprocess
    import sys

    from budgettune.trial.phases import SEARCH_STARTED_ENV, process_started_at, startup_line

    now = time.monotonic()
    started = process_started_at()
    assert now - 600 < started <= now  # this test process started before now, on one clock
    code = "import time; from budgettune.trial.phases import process_started_at as p; " \
        "print(p() - float(__import__('sys').argv[1]))"  # fmt: skip
    before = time.monotonic()
    age = float(subprocess.check_output([sys.executable, "-c", code, str(before)], text=True))
    assert -0.05 < age < 5.0  # a child started after `before` (within a clock tick)
    monkeypatch.delenv(SEARCH_STARTED_ENV, raising=False)
    assert startup_line("worker on cuda:0", {"ready": now}) is None
    monkeypatch.setenv(SEARCH_STARTED_ENV, str(now - 3.0))
    assert startup_line("worker on cuda:0", {"started": now - 1.5, "ready": now}) == (
        "worker on cuda:0: started 1.5 s, ready 3.0 s after the search command started"
    )
