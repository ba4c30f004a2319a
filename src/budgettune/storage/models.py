"""Our tables (``bt_`` prefix) as SQLAlchemy 2.0 declarative models, at the head revision.

Optuna owns its own tables; ours refer to a trial by study name + trial number and have no
foreign keys into Optuna's. The alembic revisions in ``alembic/versions/`` build exactly this
schema (a unit test compares them); these classes never leave `budgettune.storage`.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

MEASUREMENT_KINDS = ("trial", "reverify", "verify")
STUDY_NAME_LENGTH = 512
"""Optuna's own limit on study names."""


def utc_now() -> datetime:
    """Now, timezone-aware in UTC (the value of every ``created_at``)."""
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    """Declarative base holding only budgettune's tables (Optuna's metadata is separate)."""

    metadata = MetaData()


class WorkloadRow(Base):
    """One workload, identified by its fingerprint digest."""

    __tablename__ = "bt_workloads"
    __table_args__ = (UniqueConstraint("digest", name="uq_bt_workloads_digest"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    digest: Mapped[str] = mapped_column(String(128))
    ref: Mapped[str] = mapped_column(Text)
    options_json: Mapped[str] = mapped_column(Text)
    param_count: Mapped[int] = mapped_column(BigInteger)
    param_bytes: Mapped[int] = mapped_column(BigInteger)
    batch_json: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)


class MeasurementRow(Base):
    """One measured (or failed) run of a TrialSpec: a trial, a re-verification or a verify."""

    __tablename__ = "bt_measurements"
    __table_args__ = (
        Index("ix_bt_measurements_study_trial", "study_name", "trial_number"),
        CheckConstraint("kind IN ('trial', 'reverify', 'verify')", name="ck_bt_measurements_kind"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    study_name: Mapped[str] = mapped_column(String(STUDY_NAME_LENGTH))
    trial_number: Mapped[int | None] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))
    workload_digest: Mapped[str | None] = mapped_column(String(128))
    spec_json: Mapped[str] = mapped_column(Text)
    outcome: Mapped[str] = mapped_column(String(32))
    peak_allocated_bytes: Mapped[int | None] = mapped_column(BigInteger)
    peak_reserved_bytes: Mapped[int | None] = mapped_column(BigInteger)
    peak_device_bytes: Mapped[int | None] = mapped_column(BigInteger)
    steady_bytes: Mapped[int | None] = mapped_column(BigInteger)
    peak_phase: Mapped[str | None] = mapped_column(String(16))
    step_time_ms: Mapped[float | None] = mapped_column(Float)
    step_time_p10_ms: Mapped[float | None] = mapped_column(Float)
    step_time_p90_ms: Mapped[float | None] = mapped_column(Float)
    compile_s: Mapped[float | None] = mapped_column(Float)
    loss: Mapped[float | None] = mapped_column(Float)
    grad_norm: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str] = mapped_column(Text, default="")
    device_name: Mapped[str] = mapped_column(String(256), default="")
    torch_version: Mapped[str] = mapped_column(String(64), default="")
    log_path: Mapped[str] = mapped_column(Text, default="")
    wall_s: Mapped[float] = mapped_column(Float, default=0.0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)
    # revision 0002
    phase_peaks_json: Mapped[str | None] = mapped_column(Text)
    cuda_version: Mapped[str | None] = mapped_column(String(64))
    # revision 0003
    host_peak_bytes: Mapped[int | None] = mapped_column(BigInteger)
    offload_bytes: Mapped[int | None] = mapped_column(BigInteger)
    # revision 0004
    phases_json: Mapped[str | None] = mapped_column(Text)
    # revision 0005
    cold_caches: Mapped[bool | None] = mapped_column(Boolean)


class PinRow(Base):
    """One pinned configuration written for a study (the newest one is the current pin)."""

    __tablename__ = "bt_pins"
    __table_args__ = (Index("ix_bt_pins_study_name", "study_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    study_name: Mapped[str] = mapped_column(String(STUDY_NAME_LENGTH))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)
    pin_json: Mapped[str] = mapped_column(Text)
    peak_bytes: Mapped[int] = mapped_column(BigInteger)
    step_time_ms: Mapped[float] = mapped_column(Float)
    slowdown: Mapped[float | None] = mapped_column(Float)
    limit_bytes: Mapped[int] = mapped_column(BigInteger)
    mem_metric: Mapped[str] = mapped_column(String(16))
