"""What parallel workers need from the storage: a per-study claim lock, and one-line errors.

Several workers (processes, possibly on several hosts) run trials of one study. Deciding
whether the study still needs a trial and then creating it (Optuna's ``ask``) must happen as
one step, or two workers that look at the same moment both start "the last" trial. A
`ClaimLock` serialises that step: a PostgreSQL session advisory lock (released by the server
when the holder's connection dies), or, for a SQLite file, an ``flock`` on a file beside it
(released by the kernel when the holder dies).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import sqlalchemy
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.pool import NullPool

from budgettune.errors import ForeignDatabaseError, StorageError
from budgettune.storage.engine import (
    display_url,
    driver_line,
    engine_kwargs,
    normalize_url,
    refusal,
    sqlite_file,
)

logger = logging.getLogger(__name__)

CLAIM_LOCK_SUFFIX = ".claim-lock"


def _advisory_key(study_name: str) -> int:
    """A stable signed 64-bit key for ``pg_advisory_lock`` (one per study)."""
    digest = hashlib.sha256(f"budgettune-claim:{study_name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class ClaimLock:
    """A cross-process, cross-host lock per study; `acquire` blocks, `release` is idempotent."""

    def __init__(self, url: str, study_name: str) -> None:
        """A lock on ``study_name`` in the storage at ``url`` (a normalised SQLAlchemy URL)."""
        self._url = url
        self._study_name = study_name
        self._file: IO[bytes] | None = None
        self._connection: sqlalchemy.Connection | None = None
        self._engine: sqlalchemy.Engine | None = None
        path = sqlite_file(url)
        self._lock_path = None if path is None else Path(f"{path}{CLAIM_LOCK_SUFFIX}")
        self._postgres = sqlalchemy.make_url(url).get_backend_name() == "postgresql"
        if self._lock_path is None and not self._postgres:
            logger.warning(
                "no claim lock for %s: parallel workers may overshoot the trial target by one",
                display_url(url),
            )

    @property
    def held(self) -> bool:
        """Whether this process holds the lock now."""
        return self._file is not None or self._connection is not None

    def acquire(self) -> None:
        """Block until this process holds the lock.

        Raises:
            StorageError: the database cannot be reached.
        """
        if self.held:
            return
        if self._lock_path is not None:
            handle = open(self._lock_path, "ab")  # noqa: SIM115 - held until release()
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            self._file = handle
        elif self._postgres:
            with database_errors(self._url):
                if self._engine is None:
                    self._engine = sqlalchemy.create_engine(
                        self._url,
                        poolclass=NullPool,
                        **engine_kwargs(self._url),  # type: ignore[arg-type]
                    )
                connection = self._engine.connect()
                try:
                    connection.execute(
                        sqlalchemy.text("SELECT pg_advisory_lock(:key)"),
                        {"key": _advisory_key(self._study_name)},
                    )
                    connection.commit()
                except BaseException:
                    connection.close()
                    raise
                self._connection = connection

    def release(self) -> None:
        """Let the next worker claim (a no-op when not held)."""
        if self._file is not None:
            handle, self._file = self._file, None
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
            handle.close()
        if self._connection is not None:
            connection, self._connection = self._connection, None
            # Closing the connection ends the session, which frees a session advisory lock
            # even if the unlock below fails because the server went away.
            with contextlib.suppress(SQLAlchemyError):
                connection.execute(
                    sqlalchemy.text("SELECT pg_advisory_unlock(:key)"),
                    {"key": _advisory_key(self._study_name)},
                )
            with contextlib.suppress(SQLAlchemyError):
                connection.close()

    def close(self) -> None:
        """Release the lock and its engine."""
        self.release()
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None


@contextlib.contextmanager
def creation_lock(url: str | None) -> Iterator[None]:
    """Hold the storage-wide lock while opening a storage that may be created.

    Two processes creating Optuna's tables in one empty database at once collide (PostgreSQL:
    duplicate ``pg_type`` rows); the second waits here, then finds the tables.

    """
    full_url = normalize_url(url)
    path = sqlite_file(full_url)
    if path is not None and not path.parent.is_dir():
        yield  # open_storage reports the missing folder
        return
    made = path is not None and not Path(f"{path}{CLAIM_LOCK_SUFFIX}").exists()
    lock = ClaimLock(full_url, "")
    try:
        try:
            lock.acquire()
        except StorageError:
            pass  # unreachable: open_storage says so in its own words ("cannot connect to")
        yield
    except ForeignDatabaseError:
        # refused unchanged means nothing left beside it either (issue 48: a .claim-lock stayed
        # next to another program's database); no budgettune process can use that file, so no
        # other holder of the lock file can be fooled by its removal
        if made:
            lock.close()
            with contextlib.suppress(OSError):
                Path(f"{path}{CLAIM_LOCK_SUFFIX}").unlink()
        raise
    finally:
        lock.close()


@contextlib.contextmanager
def database_errors(url: str) -> Iterator[None]:
    """Turn database errors raised by Optuna or SQLAlchemy into one-line `StorageError`s.

    When the database goes away inside ``study.optimize``, Optuna 5.0 can raise an
    ``UnboundLocalError`` from its own error handling (``_run_trial`` reads ``updated_state``
    after ``tell`` and ``get_trial`` both failed); the database error is then in the
    exception's context chain, so the chain is searched, by type, for it.

    The error found may not carry the server's words: Optuna's storage can swallow the first
    error of a dropped connection, and the next use of that connection raises SQLAlchemy's
    own "Can't reconnect until invalid transaction is rolled back". For such an error the
    database is asked once more on a fresh connection, and its refusal, if it refuses, is
    the line reported: "not currently accepting connections" says what happened, the
    pending rollback does not.
    """
    try:
        yield
    except StorageError:
        raise
    except Exception as exc:
        cause = _database_cause(exc)
        if cause is None:
            raise
        if not isinstance(cause, DBAPIError):
            cause = _refusal(url) or cause
        raise StorageError(f"storage {display_url(url)}: {driver_line(cause)}") from None


def _database_cause(exc: BaseException) -> BaseException | None:
    """The driver's error in ``exc``'s cause/context chain, else the first SQLAlchemy error."""
    seen: set[int] = set()
    current: BaseException | None = exc
    found: BaseException | None = None
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DBAPIError):
            return current
        if found is None and isinstance(current, SQLAlchemyError):
            found = current
        current = current.__cause__ or current.__context__
    return found


def _refusal(url: str) -> DBAPIError | None:
    """The driver's error when a fresh connection to the server at ``url`` fails, else None
    (and None for SQLite, where there is no server to refuse, and connecting would create a
    missing file)."""
    if sqlalchemy.make_url(url).get_backend_name() == "sqlite":
        return None
    engine = sqlalchemy.create_engine(
        url,
        poolclass=NullPool,
        **engine_kwargs(url),  # type: ignore[arg-type]
    )
    try:
        return refusal(engine)
    except SQLAlchemyError:
        return None
    finally:
        engine.dispose()
