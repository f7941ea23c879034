"""Table models. ``migrations/versions`` must create exactly these (a test compares them)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Literal

from sqlalchemy import (
    Boolean,
    CheckConstraint,
    DateTime,
    Dialect,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
JOB_STATUSES: tuple[JobStatus, ...] = ("queued", "running", "succeeded", "failed", "cancelled")
FINISHED_STATUSES: tuple[JobStatus, ...] = ("succeeded", "failed", "cancelled")

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_name)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on every backend.

    SQLite has no time zone type: the UTC wall time is stored and UTC is put back on read.
    Binding a naive datetime raises ``ValueError`` (its zone would be a guess).
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware one (UTC)")
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class JobRow(Base):
    """One tuning job. Attribute names match ``JobRecord``; two columns keep short names."""

    __tablename__ = "jobs"
    __table_args__ = (
        CheckConstraint(
            "status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')",
            name="status_known",
        ),
        CheckConstraint("trials_done >= 0 AND trials_total >= 0", name="trials_nonnegative"),
        Index("ix_jobs_status", "status"),
        Index("ix_jobs_created_at", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))
    spec_json: Mapped[str] = mapped_column("spec", Text)
    study_name: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    runner_id: Mapped[str | None] = mapped_column(Text)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    trials_done: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    trials_total: Mapped[int] = mapped_column(Integer)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    stop_reason: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    result_json: Mapped[str | None] = mapped_column("result", Text)
    device: Mapped[str | None] = mapped_column(Text)
    # The client's Idempotency-Key of the submission that created the job, and the SHA-256
    # of that request's body: a retry with the key gets this job back, never a second one.
    idempotency_key: Mapped[str | None] = mapped_column(String(255), unique=True)
    request_sha256: Mapped[str | None] = mapped_column(String(64))


VERL_RUN_STATUSES = ("ok", "oom", "error", "timeout")


class VerlRunRow(Base):
    """One run of a trial's config in verl itself (``trials.verl``), beside the job's trials:
    which trial, which round of the interleaved verification, its status and the runner's
    result (``VerlRunResult`` as JSON). Deleted with its job."""

    __tablename__ = "verl_runs"
    __table_args__ = (
        CheckConstraint(
            "status IN ('ok', 'oom', 'error', 'timeout')",
            name="status_known",
        ),
        CheckConstraint("trial_number >= 0 AND round >= 0", name="numbers_nonnegative"),
        Index("ix_verl_runs_job_id", "job_id", "trial_number"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(32), ForeignKey("jobs.id", ondelete="CASCADE"))
    trial_number: Mapped[int] = mapped_column(Integer)
    round: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))
    result_json: Mapped[str] = mapped_column("result", Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
