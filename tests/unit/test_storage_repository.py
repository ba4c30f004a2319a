"""Round trips through a real SQLite file: workloads, measurements, pins, studies."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from storage_samples import FINGERPRINT, SPEC, crashed_result, ok_result

from budgettune.storage import (
    HEAD_REVISION,
    Storage,
    current_revision,
    open_storage,
    study_names,
)
from budgettune.trial.results import TrialOutcome
from budgettune.trial.spec import TrialSpec


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[Storage]:
    with open_storage(str(tmp_path / "budgettune.db")) as opened:
        yield opened


def test_fresh_database_is_created_at_head_with_optuna_tables(tmp_path: Path) -> None:
    url = str(tmp_path / "fresh.db")
    assert current_revision(url) is None
    with open_storage(url) as storage:
        optuna.create_study(study_name="s1", storage=storage.optuna_storage)
    assert current_revision(url) == HEAD_REVISION
    assert study_names(url) == ["s1"]


def test_workload_is_recorded_once(storage: Storage) -> None:
    ref = "builtin:tiny-gpt"
    first = storage.record_workload(ref=ref, options={"b": 4}, fingerprint=FINGERPRINT)
    again = storage.record_workload(ref=ref, options={"b": 4}, fingerprint=FINGERPRINT)
    assert first == again == FINGERPRINT["digest"]
    stored = storage.workload(first)
    assert stored is not None
    assert stored.fingerprint() == FINGERPRINT
    assert stored.options == {"b": 4}
    assert stored.created_at.tzinfo is not None


def test_measurement_round_trip_gives_back_the_trial_result(storage: Storage) -> None:
    digest = storage.record_workload(ref="builtin:tiny-gpt", options={}, fingerprint=FINGERPRINT)
    result = ok_result()
    row_id = storage.record_measurement(
        study_name="s",
        trial_number=3,
        kind="trial",
        workload_digest=digest,
        spec=SPEC,
        result=result,
    )
    [stored] = storage.measurements("s")
    assert stored.id == row_id
    assert (stored.study_name, stored.trial_number, stored.kind) == ("s", 3, "trial")
    assert stored.spec == SPEC
    assert stored.phase_peak_bytes == {"forward": 11_000, "backward": 13_110, "optimizer": 12_000}
    assert stored.to_result() == result


def test_a_runs_phases_and_cold_start_are_stored_and_read_back(storage: Storage) -> None:
    """Revision 0004 (issue 44): where a run's time went, and whether its caches were empty."""
    phases = {"start": 0.1, "imports": 4.2, "compile": 50.0, "measure": 0.4, "exit": 0.2}
    result = ok_result().replace(phases_s=phases, cold_caches=True)
    storage.record_measurement(
        study_name="s", trial_number=1, kind="reverify", workload_digest=None, spec=SPEC,
        result=result,
    )  # fmt: skip
    [stored] = storage.measurements("s")
    assert stored.phases_s == phases and stored.cold_caches
    back = stored.to_result()
    assert back.phases_s == phases and back.cold_caches and list(back.phases_s) == list(phases)


def test_failed_runs_and_kinds(storage: Storage) -> None:
    storage.record_measurement(
        study_name="s",
        trial_number=4,
        kind="trial",
        workload_digest=None,
        spec=TrialSpec(),
        result=crashed_result(),
    )
    storage.record_measurement(
        study_name="s",
        trial_number=None,
        kind="reverify",
        workload_digest=None,
        spec=SPEC,
        result=ok_result(),
    )
    storage.record_measurement(
        study_name="other",
        trial_number=0,
        kind="trial",
        workload_digest=None,
        spec=SPEC,
        result=ok_result(),
    )
    crashed, reverified = storage.measurements("s")
    assert crashed.outcome is TrialOutcome.CRASHED
    assert not crashed.has_measurement
    assert crashed.to_result() == crashed_result()
    assert [m.kind for m in storage.measurements("s", kind="reverify")] == ["reverify"]
    assert reverified.trial_number is None
    with pytest.raises(ValueError, match="unknown measurement kind"):
        storage.record_measurement(
            study_name="s",
            trial_number=0,
            kind="bogus",
            workload_digest=None,
            spec=SPEC,
            result=ok_result(),
        )


def test_nan_loss_comes_back_as_nan(storage: Storage) -> None:
    storage.record_measurement(
        study_name="s",
        trial_number=0,
        kind="trial",
        workload_digest=None,
        spec=SPEC,
        result=ok_result(loss=math.nan),
    )
    result = storage.measurements("s")[0].to_result()
    assert result.measurement is not None and math.isnan(result.measurement.loss)
    # stored `ok` before the non_finite outcome existed: read as what it was, never pinnable
    assert result.outcome is TrialOutcome.NON_FINITE


def test_latest_pin_is_the_newest(storage: Storage) -> None:
    assert storage.latest_pin("s") is None
    common = dict(peak_bytes=10, step_time_ms=60.0, limit_bytes=20, mem_metric="device")
    storage.record_pin(study_name="s", pin={"schema_version": 1, "n": 1}, slowdown=None, **common)
    storage.record_pin(study_name="s", pin={"schema_version": 1, "n": 2}, slowdown=1.1, **common)
    assert storage.latest_pin("s") == {"schema_version": 1, "n": 2}
    assert storage.latest_pin("t") is None


def test_reader_sees_writes_of_another_connection(tmp_path: Path) -> None:
    url = str(tmp_path / "shared.db")
    with open_storage(url) as writer, open_storage(url, create=False) as reader:
        optuna.create_study(study_name="s", storage=writer.optuna_storage)
        writer.record_measurement(
            study_name="s",
            trial_number=0,
            kind="trial",
            workload_digest=None,
            spec=SPEC,
            result=ok_result(),
        )
        assert len(reader.measurements("s")) == 1
        assert reader.study_names() == ["s"]


def test_heartbeat_storage_retries_stale_trials(tmp_path: Path) -> None:
    with open_storage(str(tmp_path / "hb.db"), heartbeat_interval_s=5) as storage:
        rdb = storage.optuna_storage
        assert rdb.heartbeat_interval == 5
        assert rdb.grace_period == 10
        assert rdb.get_heartbeat_stale_trial_callback() is not None
