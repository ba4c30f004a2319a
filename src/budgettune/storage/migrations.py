"""Schema revisions: where our alembic scripts live, which revision a database is at, upgrades.

In the spirit of Optuna's RDBStorage (`optuna storage upgrade`): a fresh database is created at
head, an older one is refused with the command that upgrades it, a newer one is refused with
"upgrade budgettune". Our revision lives in ``budgettune_alembic_version``; Optuna keeps its own
in ``alembic_version`` and we only ask Optuna's public RDBStorage API about it.
"""

from __future__ import annotations

import functools
import importlib.resources
import logging
from pathlib import Path

import optuna
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection

from budgettune.errors import SchemaAheadError, SchemaBehindError, StorageError

VERSION_TABLE = "budgettune_alembic_version"
HEAD_REVISION = "0005"
"""The revision this budgettune writes (a unit test checks it against the scripts)."""

_logger = logging.getLogger(__name__)


def script_location() -> Path:
    """The folder holding ``env.py`` and ``versions/``.

    A built wheel ships the repository's top-level ``alembic/`` as ``budgettune/_alembic``. An
    editable install cannot map that folder into the package (setuptools' editable finder needs
    an ``__init__.py``, and one there would shadow the real ``alembic`` library whenever the
    checkout root is on ``sys.path``), so there we use the checkout's ``alembic/`` itself.

    Raises:
        StorageError: when neither is present (a broken installation).
    """
    package = importlib.resources.files("budgettune")
    installed = package / "_alembic"
    if installed.is_dir():
        return Path(str(installed))
    checkout = Path(str(package)).parent.parent / "alembic"
    if (checkout / "env.py").is_file():
        return checkout
    raise StorageError(
        "budgettune's migration scripts are missing from this installation; reinstall budgettune"
    )


def alembic_config(connection: Connection | None = None) -> Config:
    """An in-memory alembic config (no alembic.ini); ``connection`` is used by ``env.py``."""
    config = Config()
    config.set_main_option("script_location", str(script_location()).replace("%", "%%"))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@functools.cache
def _scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


def known_revisions() -> list[str]:
    """Every revision this budgettune knows, newest first."""
    return [script.revision for script in _scripts().walk_revisions()]


def revision_of(connection: Connection) -> str | None:
    """Our revision of the database behind ``connection`` (None: our tables are not there)."""
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


def upgrade_connection(connection: Connection, revision: str = "head") -> None:
    """Run our migrations up to ``revision`` on ``connection`` (inside its transaction)."""
    logging.getLogger("alembic").setLevel(logging.WARNING)
    command.upgrade(alembic_config(connection), revision)


def check_revision(revision: str | None, shown_url: str) -> None:
    """Refuse a database whose revision is not ours.

    Raises:
        SchemaBehindError: older than this budgettune (`budgettune db upgrade` fixes it).
        SchemaAheadError: a revision this budgettune does not know.
    """
    if revision == HEAD_REVISION:
        return
    if revision is None or revision in known_revisions():
        found = "has no budgettune tables" if revision is None else f"is at revision {revision}"
        raise SchemaBehindError(
            f"database {shown_url} {found}, this budgettune needs {HEAD_REVISION}; "
            f"run `budgettune db upgrade --storage-url {shown_url}`"
        )
    raise SchemaAheadError(
        f"database {shown_url} was written by a newer budgettune (revision {revision}); "
        "upgrade budgettune"
    )


def optuna_is_behind(rdb: optuna.storages.RDBStorage, shown_url: str) -> bool:
    """Whether Optuna's tables need `RDBStorage.upgrade()` (False: at Optuna's head).

    Raises:
        SchemaAheadError: Optuna's tables were written by a newer Optuna.
    """
    current = rdb.get_current_version()
    if current == rdb.get_head_version():
        return False
    if current in rdb.get_all_versions():
        return True
    raise SchemaAheadError(
        f"database {shown_url} was written by a newer optuna (revision {current}) than the "
        f"installed {optuna.__version__}; upgrade optuna: `pip install -U optuna`"
    )


def check_optuna(rdb: optuna.storages.RDBStorage, shown_url: str) -> None:
    """Optuna's own compatibility check, as a `StorageError` that says what to run.

    Raises:
        SchemaBehindError: Optuna's tables are older than the installed Optuna.
        SchemaAheadError: they were written by a newer Optuna.
    """
    if optuna_is_behind(rdb, shown_url):
        raise SchemaBehindError(
            f"optuna's tables in {shown_url} are older than the installed optuna "
            f"{optuna.__version__}; run `budgettune db upgrade --storage-url {shown_url}`"
        )
