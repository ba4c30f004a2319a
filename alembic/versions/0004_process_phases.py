"""process phases: where each run's wall time went (start, imports, compile, ...), on
bt_measurements (whether its compile caches started empty came later: 0005)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # batch mode: SQLite cannot ALTER much, alembic recreates the table there.
    with op.batch_alter_table("bt_measurements") as batch:
        batch.add_column(sa.Column("phases_json", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("bt_measurements") as batch:
        batch.drop_column("phases_json")
