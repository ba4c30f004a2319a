"""initial: bt_workloads and bt_measurements

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "bt_workloads",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("digest", sa.String(128), nullable=False),
        sa.Column("ref", sa.Text(), nullable=False),
        sa.Column("options_json", sa.Text(), nullable=False),
        sa.Column("param_count", sa.BigInteger(), nullable=False),
        sa.Column("param_bytes", sa.BigInteger(), nullable=False),
        sa.Column("batch_json", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("digest", name="uq_bt_workloads_digest"),
    )
    op.create_table(
        "bt_measurements",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("study_name", sa.String(512), nullable=False),
        sa.Column("trial_number", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("workload_digest", sa.String(128), nullable=True),
        sa.Column("spec_json", sa.Text(), nullable=False),
        sa.Column("outcome", sa.String(32), nullable=False),
        sa.Column("peak_allocated_bytes", sa.BigInteger(), nullable=True),
        sa.Column("peak_reserved_bytes", sa.BigInteger(), nullable=True),
        sa.Column("peak_device_bytes", sa.BigInteger(), nullable=True),
        sa.Column("steady_bytes", sa.BigInteger(), nullable=True),
        sa.Column("peak_phase", sa.String(16), nullable=True),
        sa.Column("step_time_ms", sa.Float(), nullable=True),
        sa.Column("step_time_p10_ms", sa.Float(), nullable=True),
        sa.Column("step_time_p90_ms", sa.Float(), nullable=True),
        sa.Column("compile_s", sa.Float(), nullable=True),
        sa.Column("loss", sa.Float(), nullable=True),
        sa.Column("grad_norm", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("device_name", sa.String(256), nullable=False),
        sa.Column("torch_version", sa.String(64), nullable=False),
        sa.Column("log_path", sa.Text(), nullable=False),
        sa.Column("wall_s", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "kind IN ('trial', 'reverify', 'verify')", name="ck_bt_measurements_kind"
        ),
    )
    op.create_index(
        "ix_bt_measurements_study_trial", "bt_measurements", ["study_name", "trial_number"]
    )


def downgrade() -> None:
    op.drop_index("ix_bt_measurements_study_trial", table_name="bt_measurements")
    op.drop_table("bt_measurements")
    op.drop_table("bt_workloads")
