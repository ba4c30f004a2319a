"""host figures: the host memory an offloading run held and the bytes it moved, on bt_measurements

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # batch mode: SQLite cannot ALTER much, alembic recreates the table there.
    with op.batch_alter_table("bt_measurements") as batch:
        batch.add_column(sa.Column("host_peak_bytes", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("offload_bytes", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("bt_measurements") as batch:
        batch.drop_column("offload_bytes")
        batch.drop_column("host_peak_bytes")
