"""Storage URLs, SQLite settings and connection errors."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from budgettune.errors import StorageError, UsageError
from budgettune.storage import display_url, normalize_url, open_storage


def test_none_is_budgettune_db_in_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert normalize_url(None) == f"sqlite:///{tmp_path.resolve()}/budgettune.db"


def test_plain_and_relative_paths_become_absolute_sqlite_urls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    expected = f"sqlite:///{tmp_path.resolve()}/runs/a.db"
    assert normalize_url("runs/a.db") == expected
    assert normalize_url(str(tmp_path / "runs" / "a.db")) == expected
    assert normalize_url("sqlite:///runs/a.db") == expected


def test_server_urls_pass_through_with_psycopg3() -> None:
    for in_memory in ("sqlite://", "sqlite:///:memory:"):  # issue 48: refused by every command
        with pytest.raises(UsageError, match="in-memory database"):
            normalize_url(in_memory)
    url = "postgresql+psycopg://u:p@h:5432/db"
    assert normalize_url(url) == url
    assert normalize_url("postgresql://u:p@h/db") == "postgresql+psycopg://u:p@h/db"


def test_an_empty_url_is_bad_input() -> None:
    with pytest.raises(UsageError, match="storage URL is empty"):  # exit 2 (issue 48's P6-11)
        normalize_url("  ")


@pytest.mark.parametrize(
    "url", ["postgresql://u:secret@h:notaport/db", "nosuchdb://h/db", "://nohost"]
)
def test_malformed_url_is_one_line_storage_error(url: str) -> None:
    with pytest.raises(StorageError) as info:
        normalize_url(url)
    message = str(info.value)
    assert "\n" not in message
    assert "secret" not in message


def test_display_url_masks_password() -> None:
    shown = display_url("postgresql+psycopg://me:hunter2@db.example:5432/tune")
    assert shown == "postgresql+psycopg://me:***@db.example:5432/tune"


def test_sqlite_runs_in_wal_mode_with_a_long_busy_timeout(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path / "s.db"))
    try:
        with storage._engine.connect() as connection:
            mode = connection.exec_driver_sql("PRAGMA journal_mode").scalar()
            timeout_ms = connection.exec_driver_sql("PRAGMA busy_timeout").scalar()
    finally:
        storage.close()
    assert mode == "wal"
    assert timeout_ms is not None and timeout_ms >= 30_000


def test_unreachable_server_fails_fast_with_masked_url() -> None:
    started = time.monotonic()
    with pytest.raises(StorageError) as info:
        open_storage("postgresql://someone:secret@127.0.0.1:1/nothing")
    assert time.monotonic() - started < 15
    message = str(info.value)
    assert message.startswith("cannot connect to postgresql+psycopg://someone:***@127.0.0.1:1/")
    assert "secret" not in message
    assert "\n" not in message


def test_reader_refuses_a_missing_sqlite_file(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="budgettune search"):
        open_storage(str(tmp_path / "missing.db"), create=False)
    assert not (tmp_path / "missing.db").exists()
