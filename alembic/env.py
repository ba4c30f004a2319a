"""Alembic environment for budgettune's own tables (``bt_*``).

budgettune runs this programmatically (`budgettune.storage.migrations`): there is no alembic.ini.
The caller hands over an open connection in ``config.attributes["connection"]``; a developer
may instead set the ``sqlalchemy.url`` main option. Optuna's tables and its ``alembic_version``
table are Optuna's: we keep our revision in ``budgettune_alembic_version`` and autogenerate only
looks at ``bt_`` tables.
"""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import Connection, create_engine, pool, text

from budgettune.storage.models import Base

VERSION_TABLE = "budgettune_alembic_version"
# Arbitrary constant: serialises concurrent first-time migrations of one PostgreSQL database.
POSTGRES_LOCK_KEY = 0x6274_6462  # "btdb"

config = context.config


def include_name(name: str | None, type_: str, _parent_names: Any) -> bool:
    """Autogenerate compares only budgettune's tables, never Optuna's."""
    if type_ == "table":
        return name is not None and name.startswith("bt_")
    return True


def run_on(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        include_name=include_name,
        render_as_batch=True,
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            lock = text("SELECT pg_advisory_xact_lock(:key)")
            connection.execute(lock, {"key": POSTGRES_LOCK_KEY})
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        run_on(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("set config.attributes['connection'] or the sqlalchemy.url option")
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        run_on(connection)


if context.is_offline_mode():
    raise RuntimeError("budgettune migrations run online only")
run_migrations_online()
