"""Storage URLs, SQLAlchemy engines and the connection errors users see.

A storage is named by a SQLAlchemy URL (``sqlite:///...``, ``postgresql://...``) or by a plain
file path, which means a SQLite file. SQLite files run in WAL mode (set once they are ours, see
`use_wal`) with a long busy timeout so a dashboard can read while a search writes.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import sqlalchemy
from sqlalchemy import event
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

from budgettune.errors import StorageError, UsageError, one_line

DEFAULT_SQLITE_FILE = "budgettune.db"
SQLITE_BUSY_TIMEOUT_S = 60
"""How long a SQLite writer waits for another writer's lock before giving up."""
CONNECT_TIMEOUT_S = 10
"""How long to wait for a database server to answer a connection attempt."""


def normalize_url(url_or_path: str | None) -> str:
    """The SQLAlchemy URL of a storage given as a URL, a file path, or nothing.

    Args:
        url_or_path: a SQLAlchemy URL, a path to a SQLite file, or None for
            ``./budgettune.db``. Relative SQLite paths are made absolute (against the current
            directory) so that subprocesses and dashboards open the same file.

    Returns:
        The URL as a string. A bare ``postgresql://`` uses the psycopg 3 driver unless
        psycopg2 is installed.

    Raises:
        StorageError: when the URL cannot be parsed or names an unknown database dialect.
        UsageError: an empty URL (issue 48's P6-11: bad input, exit 2).
    """
    if url_or_path is None:
        return _sqlite_url(Path.cwd() / DEFAULT_SQLITE_FILE)
    text = url_or_path.strip()
    if not text:
        raise UsageError("the storage URL is empty; give a SQLAlchemy URL or a file path")
    if "://" not in text:
        return _sqlite_url(Path(text).expanduser())
    url = _parse(text)
    if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
        raise UsageError(  # every command, `db upgrade` too (issue 48)
            f"{_mask_unparsed(text)} is an in-memory database: each trial and worker is a "
            "process of its own, and the study would be gone when this one exits; give a file path"
        )
    if url.drivername == "postgresql" and importlib.util.find_spec("psycopg2") is None:
        url = url.set(drivername="postgresql+psycopg")
    elif url.get_backend_name() == "sqlite":
        database = url.database or ""
        if database.startswith("file:") or url.query.get("uri"):
            # issue 48: a URI filename names its file in a way the output check cannot see
            raise StorageError(
                f"storage {_mask_unparsed(text)}: SQLite URI filenames (file:...) are not "
                "taken; give the database file's path (sqlite:///path/to/study.db)"
            )
        if not Path(database).is_absolute():
            url = url.set(database=str(Path(database).expanduser().resolve()))
    else:
        return text
    return url.render_as_string(hide_password=False)


def _parse(text: str) -> URL:
    try:
        url = make_url(text)
        url.get_dialect()
    except NoSuchModuleError:
        raise StorageError(
            f"unknown database in storage URL {_mask_unparsed(text)}; "
            "use sqlite:///FILE or postgresql://USER@HOST/DB"
        ) from None
    except (ArgumentError, ValueError) as exc:
        raise StorageError(
            f"malformed storage URL {_mask_unparsed(text)}: {one_line(exc)}"
        ) from None
    return url


def _sqlite_url(path: Path) -> str:
    return f"sqlite:///{path.resolve()}"


def _mask_unparsed(text: str) -> str:
    """Mask a password in a URL that SQLAlchemy could not parse (best effort, for messages)."""
    scheme, sep, rest = text.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return text
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{host}"


def display_url(url: str) -> str:
    """The URL with its password replaced by ``***``, for messages and listings."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return _mask_unparsed(url)


def is_sqlite(url: str) -> bool:
    """Whether the URL names a SQLite database."""
    return make_url(url).get_backend_name() == "sqlite"


def sqlite_file(url: str) -> Path | None:
    """The file of a file-backed SQLite URL, else None (in-memory or not SQLite)."""
    parsed = make_url(url)
    database = parsed.database
    if parsed.get_backend_name() != "sqlite" or database in (None, "", ":memory:"):
        return None
    return Path(database)


def storage_files(url: str | None) -> list[Path]:
    """The files of a SQLite storage (the database and its journals), which no output of
    budgettune may replace (issue 48); none for a server or a URL that does not parse."""
    try:
        database = sqlite_file(normalize_url(url))
    except Exception:  # noqa: BLE001 - a bad URL is refused where it is opened
        return []
    if database is None:
        return []
    suffixes = ("-wal", "-shm", "-journal", ".claim-lock")  # the last: the study's claim lock
    return [database, *(Path(f"{database}{suffix}") for suffix in suffixes)]


def engine_kwargs(url: str) -> dict[str, object]:
    """Keyword arguments for `sqlalchemy.create_engine` (also handed to Optuna's RDBStorage)."""
    backend = make_url(url).get_backend_name()
    if backend == "sqlite":
        return {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}}
    if backend == "postgresql":
        return {"connect_args": {"connect_timeout": CONNECT_TIMEOUT_S}, "pool_pre_ping": True}
    return {"pool_pre_ping": True}


def create_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite connections get a long busy timeout and real transactions
    (`use_wal` puts a file in WAL mode once it is known to be ours).

    Raises:
        StorageError: when the database driver is not installed.
    """
    try:
        engine = sqlalchemy.create_engine(url, **engine_kwargs(url))  # type: ignore[arg-type]
    except ImportError as exc:
        raise StorageError(
            f"cannot open {display_url(url)}: its database driver is not installed ({exc}); "
            "for PostgreSQL run `pip install 'budgettune[postgres]'`"
        ) from None
    if engine.dialect.name == "sqlite":
        _configure_sqlite(engine)
    return engine


def use_wal(engine: Engine) -> None:
    """Put a SQLite file in WAL mode (a setting the file keeps), so a dashboard reads while a
    search writes. Only once the file is known to be ours to write: the switch rewrites its
    header, and connecting must change nothing in someone else's database."""
    if engine.dialect.name != "sqlite" or sqlite_file(engine.url.render_as_string()) is None:
        return
    connection = engine.raw_connection()  # outside any transaction: WAL cannot be set inside
    try:
        cursor = connection.cursor()
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.close()
    finally:
        connection.close()


def _configure_sqlite(engine: Engine) -> None:
    # pysqlite only emits BEGIN before DML, so DDL (migrations) would run outside any
    # transaction; take over transaction control as the SQLAlchemy docs recommend:
    # https://docs.sqlalchemy.org/en/20/dialects/sqlite.html#serializable-isolation-savepoints-transactional-ddl
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: object, _record: object) -> None:
        dbapi_connection.isolation_level = None  # type: ignore[attr-defined]
        cursor = dbapi_connection.cursor()  # type: ignore[attr-defined]
        try:
            cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_S * 1000}")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: sqlalchemy.Connection) -> None:
        connection.exec_driver_sql("BEGIN")


def connect_error(url: str, exc: DBAPIError) -> StorageError:
    """A one-line `StorageError` for a failed connection (password masked)."""
    return StorageError(f"cannot connect to {display_url(url)}: {driver_line(exc)}")


def driver_line(exc: BaseException) -> str:
    """The first line of a database error: the driver's own message, where SQLAlchemy
    wrapped one (`errors.one_line`)."""
    inner = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    return one_line(inner)


def refusal(engine: Engine) -> DBAPIError | None:
    """Open one connection and run ``SELECT 1``: the driver's error if that fails, else None."""
    try:
        with engine.connect() as connection:
            connection.exec_driver_sql("SELECT 1")
    except DBAPIError as exc:
        return exc
    return None


def check_connection(engine: Engine, url: str) -> None:
    """Open one connection and run ``SELECT 1`` (`refusal`).

    Raises:
        StorageError: ``cannot connect to URL: reason`` when the database cannot be reached.
    """
    refused = refusal(engine)
    if refused is not None:
        raise connect_error(url, refused) from None
