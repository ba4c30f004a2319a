"""Opening a storage (create at head, or check the revision), upgrading it, asking about it."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import optuna
import sqlalchemy
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from budgettune.errors import ForeignDatabaseError, StorageError
from budgettune.storage import migrations
from budgettune.storage.engine import (
    check_connection,
    create_engine,
    display_url,
    driver_line,
    engine_kwargs,
    normalize_url,
    sqlite_file,
    use_wal,
)
from budgettune.storage.repository import Storage

OPTUNA_STUDIES_TABLE = "studies"
OPTUNA_VERSION_TABLE = "version_info"
_FOREIGN_NAMES_SHOWN = 5


def open_storage(
    url: str | None, *, create: bool = True, heartbeat_interval_s: int | None = None
) -> Storage:
    """Open the study storage at ``url``, creating it at the head revision if it is empty.

    Args:
        url: a SQLAlchemy URL or a SQLite file path; None means ``./budgettune.db``.
        create: create Optuna's and our tables where missing. With False (readers such as
            ``show`` and the dashboard) a storage without studies is an error.
        heartbeat_interval_s: give Optuna's storage this trial heartbeat (grace period twice
            as long) and retry a stale trial once.

    Returns:
        The open `Storage`; close it (or use it as a context manager) when done.

    Raises:
        StorageError: the URL is malformed, the server cannot be reached, or (``create=False``)
            there is nothing there.
        ForeignDatabaseError: (``create``) the database holds tables, none Optuna's or ours.
        SchemaBehindError: our or Optuna's tables are older than this installation.
        SchemaAheadError: they were written by a newer budgettune or Optuna.
    """
    full_url = normalize_url(url)
    shown = display_url(full_url)
    path = sqlite_file(full_url)
    if not create and path is not None and not path.exists():
        raise StorageError(f"no storage at {shown}; run `budgettune search` first")
    engine = create_engine(full_url)
    rdb: optuna.storages.RDBStorage | None = None
    try:
        with _storage_errors(shown):
            check_connection(engine, full_url)
            tables = _table_names(engine)
            # readers too: another program's "studies" table crashed Optuna (issue 48)
            _refuse_foreign(engine, shown)
            if not create and OPTUNA_STUDIES_TABLE not in tables:
                raise StorageError(
                    f"{shown} holds no studies; run "
                    f"`budgettune search --storage-url {shown}` first"
                )
            if create:
                use_wal(engine)
            rdb = _optuna_storage(full_url, heartbeat_interval_s, create=create)
            migrations.check_optuna(rdb, shown)
            ours = {name for name in tables if name.startswith("bt_")}
            if create and not ours and migrations.VERSION_TABLE not in tables:
                with engine.begin() as connection:
                    migrations.upgrade_connection(connection)
            else:
                with engine.connect() as connection:
                    migrations.check_revision(migrations.revision_of(connection), shown)
    except BaseException:
        engine.dispose()
        if rdb is not None:
            rdb.engine.dispose()
        raise
    return Storage(url=full_url, engine=engine, optuna_storage=rdb)


def upgrade(url: str | None) -> tuple[str | None, str]:
    """Bring Optuna's and our tables to the head revision (creating them if missing).

    Idempotent: at head it changes nothing.

    Returns:
        Our revision before (None: no budgettune tables) and after the upgrade.

    Raises:
        StorageError: the server cannot be reached.
        ForeignDatabaseError: the database holds tables, none of them Optuna's or ours.
        SchemaAheadError: the database was written by a newer budgettune or Optuna.
    """
    full_url = normalize_url(url)
    shown = display_url(full_url)
    engine = create_engine(full_url)
    rdb: optuna.storages.RDBStorage | None = None
    try:
        with _storage_errors(shown):
            check_connection(engine, full_url)
            _refuse_foreign(engine, shown)
            use_wal(engine)
            rdb = _optuna_storage(full_url, None, create=True)
            if migrations.optuna_is_behind(rdb, shown):
                rdb.upgrade()
            with engine.begin() as connection:
                before = migrations.revision_of(connection)
                if before is not None and before not in migrations.known_revisions():
                    migrations.check_revision(before, shown)
                migrations.upgrade_connection(connection)
    finally:
        engine.dispose()
        if rdb is not None:
            rdb.engine.dispose()
    return before, migrations.HEAD_REVISION


def current_revision(url: str | None) -> str | None:
    """Our schema revision of the database at ``url`` (None: no budgettune tables yet).

    Raises:
        StorageError: the URL is malformed or the server cannot be reached.
    """
    full_url = normalize_url(url)
    path = sqlite_file(full_url)
    if path is not None and not path.exists():
        return None
    engine = create_engine(full_url)
    try:
        with _storage_errors(display_url(full_url)):
            check_connection(engine, full_url)
            with engine.connect() as connection:
                return migrations.revision_of(connection)
    finally:
        engine.dispose()


def study_names(url: str | None) -> list[str]:
    """Names of the Optuna studies at ``url``, sorted (empty when there is no storage yet).

    Raises:
        StorageError: the URL is malformed or the server cannot be reached.
    """
    full_url = normalize_url(url)
    path = sqlite_file(full_url)
    if path is not None and not path.exists():
        return []
    engine = create_engine(full_url)
    try:
        with _storage_errors(display_url(full_url)):
            check_connection(engine, full_url)
            if OPTUNA_STUDIES_TABLE not in _table_names(engine):
                return []
            rdb = _optuna_storage(full_url, None, create=False)
            try:
                return sorted(optuna.study.get_all_study_names(storage=rdb))
            finally:
                rdb.engine.dispose()
    finally:
        engine.dispose()


@contextmanager
def _storage_errors(shown: str) -> Iterator[None]:
    """Database errors past the connection check, as one-line `StorageError`s."""
    try:
        yield
    except DBAPIError as exc:
        line = driver_line(exc)
        if "file is not a database" in line:  # a user's file given as the storage: nothing
            # of budgettune's may be left beside it either (issue 48's P9-9: a .claim-lock)
            raise ForeignDatabaseError(f"storage {shown}: {line}") from None
        raise StorageError(f"storage {shown}: {line}") from None


def _refuse_foreign(engine: Engine, shown: str) -> None:
    """Add nothing to a database that holds tables or views, none of them Optuna's or ours (a
    file path mistyped, another program's database); an empty one is ours to fill.

    Raises:
        ForeignDatabaseError: naming what it holds.
    """
    with engine.connect() as connection:
        inspector = sqlalchemy.inspect(connection)
        tables = set(inspector.get_table_names())
        names = tables | set(inspector.get_view_names())
        if not names or migrations.VERSION_TABLE in tables or _optuna_layout(inspector, tables):
            return
    found = sorted(names)
    listed = ", ".join(found[:_FOREIGN_NAMES_SHOWN])
    more = (
        f" and {len(found) - _FOREIGN_NAMES_SHOWN} more"
        if len(found) > _FOREIGN_NAMES_SHOWN
        else ""
    )
    raise ForeignDatabaseError(
        f"{shown} is another program's database (it holds {listed}{more}, neither Optuna's "
        "nor budgettune's tables); budgettune adds its tables only to an empty database or "
        "its own: give a new file or an empty database"
    )


_OPTUNA_COLUMNS = {
    OPTUNA_STUDIES_TABLE: {"study_id", "study_name"},
    OPTUNA_VERSION_TABLE: {"schema_version", "library_version"},
}
"""Columns of Optuna's own tables that tell them from another program's ``studies`` or
``version_info`` (common names)."""


def _optuna_layout(inspector: Any, tables: set[str]) -> bool:
    """Whether the database holds Optuna's tables, by name and columns."""
    for table, columns in _OPTUNA_COLUMNS.items():
        if table not in tables:
            return False
        if not columns <= {column["name"] for column in inspector.get_columns(table)}:
            return False
    return True


def _table_names(engine: Engine) -> set[str]:
    with engine.connect() as connection:
        return set(sqlalchemy.inspect(connection).get_table_names())


def _optuna_storage(
    url: str, heartbeat_interval_s: int | None, *, create: bool
) -> optuna.storages.RDBStorage:
    """Optuna's RDBStorage; its version check is ours to do (`migrations.check_optuna`)."""
    kwargs: dict[str, Any] = {}
    with warnings.catch_warnings():
        # heartbeats are "experimental" in Optuna since 2.8; we rely on them knowingly
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if heartbeat_interval_s is not None:
            kwargs["heartbeat_interval"] = heartbeat_interval_s
            kwargs["grace_period"] = 2 * heartbeat_interval_s
            parameters = inspect.signature(optuna.storages.RDBStorage).parameters
            if "heartbeat_stale_trial_callback" in parameters:  # optuna >= 4.9
                kwargs["heartbeat_stale_trial_callback"] = (
                    optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1)
                )
            else:
                kwargs["failed_trial_callback"] = optuna.storages.RetryFailedTrialCallback(
                    max_retry=1
                )
        return optuna.storages.RDBStorage(
            url,
            engine_kwargs=engine_kwargs(url),
            skip_compatibility_check=True,
            skip_table_creation=not create,
            **kwargs,
        )
