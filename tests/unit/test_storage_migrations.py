"""Schema revisions: the committed rev-0001 database, newer databases, idempotent upgrades."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from storage_samples import SPEC, ok_result

from budgettune.errors import SchemaAheadError, SchemaBehindError
from budgettune.storage import (
    HEAD_REVISION,
    VERSION_TABLE,
    current_revision,
    migrations,
    open_storage,
    study_names,
    upgrade,
)
from budgettune.storage import engine as storage_engine
from budgettune.storage.models import Base
from budgettune.trial.results import TrialOutcome

REV0001_DB = Path(__file__).parents[1] / "data" / "budgettune-rev0001.db"


def test_head_revision_is_the_newest_script() -> None:
    assert migrations.known_revisions() == [HEAD_REVISION, "0004", "0003", "0002", "0001"]


def test_scripts_are_found_through_the_installed_package() -> None:
    location = migrations.script_location()
    assert (location / "env.py").is_file()
    assert (location / "script.py.mako").is_file()
    assert sorted(p.name for p in (location / "versions").glob("*.py")) == [
        "0001_initial.py",
        "0002_pins_and_phases.py",
        "0003_host_figures.py",
        "0004_process_phases.py",
        "0005_cold_caches.py",
    ]


def test_committed_rev0001_database_is_refused_then_upgraded_with_rows_kept(
    tmp_path: Path,
) -> None:
    db = tmp_path / "old.db"
    shutil.copyfile(REV0001_DB, db)
    with pytest.raises(SchemaBehindError, match="budgettune db upgrade --storage-url sqlite:///"):
        open_storage(str(db))
    assert upgrade(str(db)) == ("0001", HEAD_REVISION)
    with open_storage(str(db), create=False) as storage:
        ok, crashed = storage.measurements("old-study")
        assert storage.study_names() == ["old-study"]
        assert ok.spec.activation_memory_budget == 0.5
        result = ok.to_result()
        assert result.measurement is not None
        assert result.measurement.peak_device_bytes == 300
        assert result.measurement.peak_phase == "backward"
        assert ok.workload_fingerprint == {
            "param_count": 1000,
            "param_bytes": 4000,
            "batch": ["float32[4, 64]"],
            "digest": "d1",
        }
        assert ok.cuda_version == "" and ok.phase_peak_bytes == {}
        assert crashed.outcome is TrialOutcome.CRASHED
        assert crashed.error == "device-side assert"
        storage.record_measurement(
            study_name="old-study",
            trial_number=2,
            kind="trial",
            workload_digest="d1",
            spec=SPEC,
            result=ok_result(),
        )
        newest = storage.measurements("old-study")[-1].to_result()
        assert newest == ok_result().replace(workload_fingerprint=ok.workload_fingerprint)


def test_upgrade_is_idempotent_and_creates_an_empty_database(tmp_path: Path) -> None:
    url = str(tmp_path / "new.db")
    assert upgrade(url) == (None, HEAD_REVISION)
    assert upgrade(url) == (HEAD_REVISION, HEAD_REVISION)
    assert current_revision(url) == HEAD_REVISION
    assert study_names(url) == []
    open_storage(url).close()


def test_database_from_a_newer_budgettune_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "newer.db"
    open_storage(str(db)).close()
    with sqlite3.connect(db) as connection:
        connection.execute(f"UPDATE {VERSION_TABLE} SET version_num = 'ffff9999'")
    with pytest.raises(SchemaAheadError, match=r"newer budgettune \(revision ffff9999\)"):
        open_storage(str(db))
    with pytest.raises(SchemaAheadError):
        upgrade(str(db))


def test_optuna_schema_behind_is_a_schema_behind_error(tmp_path: Path) -> None:
    db = tmp_path / "old-optuna.db"
    open_storage(str(db)).close()
    with sqlite3.connect(db) as connection:
        connection.execute("UPDATE alembic_version SET version_num = 'v3.0.0.d'")
    with pytest.raises(SchemaBehindError, match="optuna's tables"):
        open_storage(str(db))


def test_migrations_build_exactly_the_models(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    upgrade(url)
    engine = storage_engine.create_engine(url)
    with engine.connect() as connection:
        context = MigrationContext.configure(
            connection,
            opts={
                "include_name": lambda name, type_, _parents: (
                    type_ != "table" or (name or "").startswith("bt_")
                )
            },
        )
        assert compare_metadata(context, Base.metadata) == []
    engine.dispose()


def test_a_committed_revision_0002_study_upgrades_and_reads_without_host_figures(
    tmp_path: Path,
) -> None:
    """Migration 0003 (issue 33's host figures) on a real study written before it."""
    source = Path(__file__).parents[2] / "benchmarks/results/h100x2-hf-sharded-2026-11-26/hf.db"
    db = tmp_path / "study.db"
    shutil.copyfile(source, db)
    with pytest.raises(SchemaBehindError, match="budgettune db upgrade"):
        open_storage(str(db))
    assert upgrade(str(db)) == ("0002", HEAD_REVISION)
    with open_storage(str(db), create=False) as storage:
        [name, *_] = storage.study_names()
        runs = storage.measurements(name)
        assert runs and all(r.host_peak_bytes is None for r in runs)
        measured = [r.measurement() for r in runs if r.has_measurement]
        assert measured and all(m.host_peak_bytes == 0 for m in measured if m is not None)


def test_a_committed_revision_0003_study_upgrades_and_reads_without_phases(
    tmp_path: Path,
) -> None:
    """Migration 0004 (issue 44's process phases and cold starts) on a real study before it."""
    source = Path(__file__).parents[2] / "benchmarks/results/grid30/grid30-gpt2m-s2.db"
    db = tmp_path / "study.db"
    shutil.copyfile(source, db)
    with pytest.raises(SchemaBehindError, match="budgettune db upgrade"):
        open_storage(str(db))
    assert upgrade(str(db)) == ("0003", HEAD_REVISION)
    with open_storage(str(db), create=False) as storage:
        runs = storage.measurements("grid30-gpt2m-s2")
        assert len(runs) == 27  # 12 trials and 15 re-measurements, as the issue counted
        assert all(r.phases_s == {} and not r.cold_caches for r in runs)
        assert sum(r.wall_s for r in runs) == pytest.approx(992.2, abs=0.1)


@pytest.mark.parametrize(
    ("kept", "study", "cold_runs"),
    [
        # written by revision 0004 as first released (phases, no cold_caches column)
        ("h200x4-fast-search-2026-11-28/l1-before-2gpu.db", "l1-before-2gpu", 0),
        # written by revision 0004 as it was later (both columns)
        ("h200-fast-search-2026-11-28/run2/gpt2m-after.db", "gpt2m-after", 7),
    ],
)
def test_both_kinds_of_revision_0004_database_upgrade_to_0005(
    tmp_path: Path, kept: str, study: str, cold_runs: int
) -> None:
    # the first kind read "no such column: bt_measurements.cold_caches" at 0004
    db = tmp_path / "study.db"
    shutil.copyfile(Path(__file__).parents[2] / "benchmarks/results" / kept, db)
    with pytest.raises(SchemaBehindError, match="budgettune db upgrade"):
        open_storage(str(db))
    assert upgrade(str(db)) == ("0004", HEAD_REVISION)
    with open_storage(str(db), create=False) as storage:
        runs = storage.measurements(study)
        assert runs and all(r.phases_s for r in runs)
        assert sum(bool(r.cold_caches) for r in runs) == cold_runs
