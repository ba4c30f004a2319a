"""The storage on the real PostgreSQL server at 127.0.0.1:5432 (one fresh database per test)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import optuna
import psycopg
import pytest
import sqlalchemy
from sqlalchemy.pool import NullPool

from budgettune.errors import SchemaAheadError, SchemaBehindError, StorageError
from budgettune.storage import (
    HEAD_REVISION,
    VERSION_TABLE,
    current_revision,
    open_storage,
    study_names,
    upgrade,
)
from budgettune.storage.coordination import database_errors
from budgettune.storage.engine import normalize_url
from budgettune.trial.results import Measurement, TrialOutcome, TrialResult
from budgettune.trial.spec import TrialSpec

pytestmark = pytest.mark.postgres


def _result() -> TrialResult:
    return TrialResult(
        outcome=TrialOutcome.OK,
        measurement=Measurement(
            peak_allocated_bytes=15_060_000_000,
            peak_reserved_bytes=15_500_000_000,
            peak_device_bytes=16_000_000_000,
            steady_bytes=9_000_000_000,
            phase_peak_bytes={"forward": 1, "backward": 2, "optimizer": 3},
            peak_phase="optimizer",
            step_time_ms=73.5,
            step_time_p10_ms=73.0,
            step_time_p90_ms=74.0,
            compile_s=30.0,
            loss=float("nan"),
            grad_norm=2.0,
        ),
        device_name="NVIDIA H200",
        torch_version="2.11.0",
        cuda_version="12.8",
        log_path="/runs/t.log",
        wall_s=50.0,
    )


def test_empty_database_is_created_at_head_and_round_trips(pg_url: str) -> None:
    assert current_revision(pg_url) is None
    spec = TrialSpec(activation_memory_budget=0.7, optimizer_impl="fused")
    with open_storage(pg_url) as storage:
        optuna.create_study(study_name="team", storage=storage.optuna_storage)
        fingerprint = {"param_count": 5, "param_bytes": 20, "batch": ["f32[1]"], "digest": "d"}
        storage.record_workload(ref="builtin:llama", options={}, fingerprint=fingerprint)
        storage.record_workload(ref="builtin:llama", options={}, fingerprint=fingerprint)
        storage.record_measurement(
            study_name="team",
            trial_number=0,
            kind="trial",
            workload_digest="d",
            spec=spec,
            result=_result(),
        )
        storage.record_pin(
            study_name="team",
            pin={"schema_version": 1},
            peak_bytes=1,
            step_time_ms=2.0,
            slowdown=1.05,
            limit_bytes=3,
            mem_metric="device",
        )
    assert current_revision(pg_url) == HEAD_REVISION
    assert study_names(pg_url) == ["team"]
    with open_storage(pg_url, create=False) as reader:
        [stored] = reader.measurements("team")
        assert stored.spec == spec
        back = stored.to_result()
        assert back.measurement is not None
        assert back.measurement.peak_phase == "optimizer"
        assert back.measurement.phase_peak_bytes == {"forward": 1, "backward": 2, "optimizer": 3}
        assert back.workload_fingerprint == fingerprint
        assert reader.latest_pin("team") == {"schema_version": 1}
    assert upgrade(pg_url) == (HEAD_REVISION, HEAD_REVISION)


def test_migration_from_empty_and_from_revision_0001(pg_url: str) -> None:
    assert upgrade(pg_url) == (None, HEAD_REVISION)
    with psycopg.connect(pg_url) as connection:
        connection.execute("DROP TABLE bt_pins")
        connection.execute("ALTER TABLE bt_measurements DROP COLUMN phase_peaks_json")
        connection.execute("ALTER TABLE bt_measurements DROP COLUMN cuda_version")
        connection.execute("ALTER TABLE bt_measurements DROP COLUMN host_peak_bytes")  # 0003
        connection.execute("ALTER TABLE bt_measurements DROP COLUMN offload_bytes")
        connection.execute("ALTER TABLE bt_measurements DROP COLUMN phases_json")  # 0004
        connection.execute("ALTER TABLE bt_measurements DROP COLUMN cold_caches")  # 0005
        connection.execute(f"UPDATE {VERSION_TABLE} SET version_num = '0001'")
    with pytest.raises(SchemaBehindError, match="budgettune db upgrade"):
        open_storage(pg_url)
    assert upgrade(pg_url) == ("0001", HEAD_REVISION)
    open_storage(pg_url).close()
    with psycopg.connect(pg_url) as connection:
        connection.execute(f"UPDATE {VERSION_TABLE} SET version_num = 'ffff9999'")
    with pytest.raises(SchemaAheadError, match="newer budgettune"):
        open_storage(pg_url)


def _failover(admin: psycopg.Connection, name: str) -> None:
    """The server refuses the database and drops every connection to it."""
    admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
    admin.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
    )


def test_a_dropped_connection_is_reported_in_the_servers_words(pg_url: str) -> None:
    # The worker's one line when the database goes away: a connection cut inside a transaction
    # whose first error was swallowed (as Optuna's storage can) then raises SQLAlchemy's
    # PendingRollbackError, which does not say what happened; the server's refusal does.
    url = normalize_url(pg_url)
    name = pg_url.rsplit("/", 1)[1]
    engine = sqlalchemy.create_engine(url, poolclass=NullPool)
    connection = engine.connect()
    connection.exec_driver_sql("SELECT 1")  # a transaction is open
    admin = psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=test", autocommit=True)
    try:
        _failover(admin, name)
        with contextlib.suppress(sqlalchemy.exc.OperationalError):  # the swallowed one
            connection.exec_driver_sql("SELECT 1")
        with pytest.raises(StorageError) as raised, database_errors(url):
            connection.exec_driver_sql("SELECT 1")
        assert isinstance(raised.value.__context__, sqlalchemy.exc.PendingRollbackError)
        line = str(raised.value)
        assert line.startswith(f"storage postgresql+psycopg://postgres@127.0.0.1:5432/{name}: ")
        assert "is not currently accepting connections" in line, line
        assert "\n" not in line
        # Back up, the same error says no more than SQLAlchemy's words: nothing refused.
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        with (
            pytest.raises(StorageError, match="invalid transaction is rolled back"),
            database_errors(url),
        ):
            connection.exec_driver_sql("SELECT 1")
    finally:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        admin.close()
        with contextlib.suppress(sqlalchemy.exc.SQLAlchemyError):
            connection.close()
        engine.dispose()


def test_the_drivers_error_is_found_behind_optunas_own() -> None:
    # Optuna wraps the driver's error (StorageInternalError from it), and its own error
    # handling can raise again while handling that: the driver's words are reported.
    driver = sqlalchemy.exc.OperationalError(
        "SELECT 1", {}, Exception("server closed the connection")
    )
    try:
        try:
            try:
                raise driver
            except sqlalchemy.exc.OperationalError as exc:
                raise sqlalchemy.exc.PendingRollbackError("Can't reconnect") from exc
        except sqlalchemy.exc.PendingRollbackError:
            raise UnboundLocalError("updated_state")  # noqa: B904 - as Optuna's _run_trial does
    except UnboundLocalError as exc:
        error = exc
    with (
        pytest.raises(StorageError, match="server closed the connection$"),
        database_errors("sqlite:///x.db"),
    ):
        raise error


def test_a_sqlite_file_is_not_probed_for_a_refusal(tmp_path: Path) -> None:
    # No server to ask; connecting would create the missing file: SQLAlchemy's words stay.
    missing = tmp_path / "gone.db"
    with (
        pytest.raises(StorageError, match="Can't reconnect$"),
        database_errors(f"sqlite:///{missing}"),
    ):
        raise sqlalchemy.exc.PendingRollbackError("Can't reconnect")
    assert not missing.exists()
