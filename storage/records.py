"""Plain, immutable job data handed out by ``JobStore`` (never ORM objects)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime

from storage.models import FINISHED_STATUSES, JobRow, JobStatus


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One job as stored. Times are timezone-aware UTC; ``*_json`` fields are JSON text."""

    id: str
    name: str
    status: JobStatus
    spec_json: str
    study_name: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    runner_id: str | None
    heartbeat_at: datetime | None
    trials_done: int
    trials_total: int
    cancel_requested: bool
    stop_reason: str | None
    error: str | None
    result_json: str | None
    device: str | None
    idempotency_key: str | None = None
    request_sha256: str | None = None

    @property
    def is_finished(self) -> bool:
        """True once the job succeeded, failed or was cancelled."""
        return self.status in FINISHED_STATUSES

    @classmethod
    def from_row(cls, row: JobRow) -> JobRecord:
        return cls(**{field.name: getattr(row, field.name) for field in fields(cls)})
