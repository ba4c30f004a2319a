"""pins and phases: bt_pins; per-phase peaks and CUDA version on bt_measurements

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "bt_pins",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("study_name", sa.String(512), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("pin_json", sa.Text(), nullable=False),
        sa.Column("peak_bytes", sa.BigInteger(), nullable=False),
        sa.Column("step_time_ms", sa.Float(), nullable=False),
        sa.Column("slowdown", sa.Float(), nullable=True),
        sa.Column("limit_bytes", sa.BigInteger(), nullable=False),
        sa.Column("mem_metric", sa.String(16), nullable=False),
    )
    op.create_index("ix_bt_pins_study_name", "bt_pins", ["study_name"])
    # batch mode: SQLite cannot ALTER much, alembic recreates the table there.
    with op.batch_alter_table("bt_measurements") as batch:
        batch.add_column(sa.Column("phase_peaks_json", sa.Text(), nullable=True))
        batch.add_column(sa.Column("cuda_version", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("bt_measurements") as batch:
        batch.drop_column("cuda_version")
        batch.drop_column("phase_peaks_json")
    op.drop_index("ix_bt_pins_study_name", table_name="bt_pins")
    op.drop_table("bt_pins")
