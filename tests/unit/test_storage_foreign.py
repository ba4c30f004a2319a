"""Issue 29: budgettune adds its tables to an empty database or its own, never to another
program's (a mistyped path). Real SQLite files in tmp_path, the real CLI."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from budgettune import storage
from budgettune.cli import app
from budgettune.errors import ForeignDatabaseError

runner = CliRunner()


def _foreign(path: Path) -> Path:
    with sqlite3.connect(path) as connection:
        connection.execute("create table contacts (name text, email text)")
        connection.execute("insert into contacts values ('ada', 'ada@example.org')")
        connection.execute("create view names as select name from contacts")
    connection.close()
    return path


@pytest.mark.parametrize(
    "command",
    [
        ["db", "upgrade", "--storage"],
        ["show", "--storage"],  # a reader: it refuses too, and changes nothing either
    ],
)
def test_a_foreign_sqlite_file_is_refused_and_left_byte_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    db = _foreign(tmp_path / "contacts.db")
    before = db.read_bytes()
    result = runner.invoke(app, [*command, str(db)])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.output
    # a reader says so too (it said "holds no studies"; a table named studies crashed it)
    assert result.exit_code == 2, result.output
    assert "another program's database (it holds contacts, names," in lines[0]
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["contacts.db"]  # no -wal, no -shm


def test_an_empty_file_a_new_one_and_an_optuna_database_get_our_tables(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()
    optuna_only = tmp_path / "optuna.db"
    optuna.create_study(study_name="theirs", storage=f"sqlite:///{optuna_only}")
    for path in (empty, tmp_path / "new.db", optuna_only):
        assert storage.upgrade(str(path)) == (None, storage.HEAD_REVISION)
        with sqlite3.connect(path) as connection:
            mode = connection.execute("pragma journal_mode").fetchone()[0]
        connection.close()
        assert mode == "wal"  # set once the file is known to be ours
    assert storage.study_names(str(optuna_only)) == ["theirs"]


def test_a_search_opening_a_foreign_file_refuses_it_unchanged(tmp_path: Path) -> None:
    """`search` (and `worker`) open the storage with ``create``: the same refusal, before any
    trial (the search's CLI path to it first checks the op names in a torch subprocess)."""
    db = _foreign(tmp_path / "contacts.db")
    app_db = tmp_path / "app.db"
    with sqlite3.connect(app_db) as connection:  # another alembic-managed program
        connection.execute("create table alembic_version (version_num varchar(32))")
    connection.close()
    before = {path: path.read_bytes() for path in (db, app_db)}
    with pytest.raises(ForeignDatabaseError, match=r"it holds contacts, names, neither"):
        storage.open_storage(str(db))
    with pytest.raises(ForeignDatabaseError, match=r"it holds alembic_version, neither"):
        storage.open_storage(f"sqlite:///{app_db}", heartbeat_interval_s=10)
    assert {path: path.read_bytes() for path in (db, app_db)} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db", "contacts.db"]


def test_a_foreign_postgresql_database_is_refused_too(pg_url: str) -> None:
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as connection:
        connection.execute("create table invoices (id integer)")
    with pytest.raises(ForeignDatabaseError, match="it holds invoices, neither"):
        storage.upgrade(pg_url)
    with psycopg.connect(pg_url) as connection:
        tables = connection.execute(
            "select table_name from information_schema.tables where table_schema = 'public'"
        ).fetchall()
    assert tables == [("invoices",)]


@pytest.mark.parametrize(
    "create",
    [
        "create table studies (id integer, title text)",  # a common name, not Optuna's table
        "create table version_info (version text)",
        "create table budgettune_alembic_version_not (x text); create table bt_like (x text)",
    ],
)
def test_a_foreign_table_with_optunas_or_our_names_is_still_foreign(
    tmp_path: Path, create: str
) -> None:
    """Optuna's tables are told by their columns, ours by our version table: another
    program's `studies` or `version_info` table is not a reason to add tables to its file."""
    db = tmp_path / "theirs.db"
    with sqlite3.connect(db) as connection:
        connection.executescript(create)
    connection.close()
    before = db.read_bytes()
    with pytest.raises(ForeignDatabaseError, match="another program's database"):
        storage.upgrade(str(db))
    with pytest.raises(ForeignDatabaseError, match="another program's database"):
        storage.open_storage(str(db))
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["theirs.db"]
