"""cold starts: whether a run's compile caches started empty, on bt_measurements

Revision 0004 was first released with the process phases alone and later also added this
column, so a database at 0004 may have it or not: it is added only where it is missing.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _has_column() -> bool:
    columns = sa.inspect(op.get_bind()).get_columns("bt_measurements")
    return any(column["name"] == "cold_caches" for column in columns)


def upgrade() -> None:
    if _has_column():
        return
    # batch mode: SQLite cannot ALTER much, alembic recreates the table there.
    with op.batch_alter_table("bt_measurements") as batch:
        batch.add_column(sa.Column("cold_caches", sa.Boolean(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("bt_measurements") as batch:
        batch.drop_column("cold_caches")
