"""Runs of trials' configs in verl itself, beside a job's trials: add and read them.

A run is stored as the verl step runner's result, JSON text this package does not read (it
imports neither ``trials`` nor ``autotuner``); ``autotuner.verification`` turns it back into a
``VerlRunResult``. Runs are deleted with their job (``ON DELETE CASCADE``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage.db import Database
from storage.jobs import _load
from storage.models import VERL_RUN_STATUSES, VerlRunRow


@dataclass(frozen=True, slots=True)
class VerlRunRecord:
    """One stored verl run: its trial, its round of the interleaved verification (0 first),
    its status and the runner's result as JSON text."""

    id: int
    job_id: str
    trial_number: int
    round: int
    status: str
    result_json: str
    created_at: datetime


class VerlRunStore:
    """The ``verl_runs`` table of one ``Database``; thread-safe like the Database."""

    def __init__(self, database: Database) -> None:
        self._database = database

    def add(
        self, job_id: str, trial_number: int, round_: int, status: str, result_json: str
    ) -> VerlRunRecord:
        """Store one run of trial ``trial_number`` of job ``job_id``.

        Raises:
            JobNotFoundError: no job has this id.
            ValueError: ``status`` is not a verl run status, or a number is negative.
        """
        if status not in VERL_RUN_STATUSES:
            raise ValueError(f"status={status!r}: must be one of {', '.join(VERL_RUN_STATUSES)}")
        if trial_number < 0 or round_ < 0:
            raise ValueError(f"trial_number={trial_number}, round={round_}: both must be 0 or more")

        def work(session: Session) -> VerlRunRecord:
            _load(session, job_id)
            row = VerlRunRow(
                job_id=job_id,
                trial_number=trial_number,
                round=round_,
                status=status,
                result_json=result_json,
                created_at=datetime.now(timezone.utc),
            )
            session.add(row)
            session.flush()
            return _record(row)

        return self._database.run_transaction(work)

    def list(self, job_id: str) -> list[VerlRunRecord]:
        """The job's runs in the order they were stored (none: an empty list)."""
        statement = select(VerlRunRow).where(VerlRunRow.job_id == job_id).order_by(VerlRunRow.id)
        return self._database.run_transaction(lambda s: [_record(row) for row in s.scalars(statement)])


def _record(row: VerlRunRow) -> VerlRunRecord:
    return VerlRunRecord(
        id=row.id,
        job_id=row.job_id,
        trial_number=row.trial_number,
        round=row.round,
        status=row.status,
        result_json=row.result_json,
        created_at=row.created_at,
    )
