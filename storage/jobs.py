"""The jobs queue: create, list, claim, heartbeat, finish, cancel, requeue and delete jobs.

Every state change is one conditional statement (``UPDATE ... WHERE status = 'queued'``), so
several runner processes can share one database without a job being claimed twice.
"""

from __future__ import annotations

import builtins
import logging
import re
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import ColumnElement, Update, func, literal, or_, select, update
from sqlalchemy import delete as sql_delete
from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import Session, aliased

from storage import errors
from storage.db import Database
from storage.models import FINISHED_STATUSES, JOB_STATUSES, JobRow, UTCDateTime
from storage.records import JobRecord

_logger = logging.getLogger(__name__)
JOB_ID = re.compile(r"[0-9a-f]{32}")
CANCELLED_STOP_REASON = "cancelled"


def _now() -> datetime:
    return datetime.now(timezone.utc)


class JobStore:
    """Jobs in the ``jobs`` table of one ``Database``; thread-safe like the Database.

    Lifecycle: ``create`` (queued) -> ``claim_next``/``claim`` (running, owned by a runner
    that calls ``heartbeat`` and ``update_progress`` and polls ``is_cancel_requested``) ->
    ``finish`` (succeeded, failed or cancelled). ``requeue_orphans`` puts running jobs whose
    runner stopped heartbeating back in the queue. Every method may also raise the
    ``Database`` errors (``DatabaseUnavailableError``, ``DatabaseLockedError``,
    ``SchemaNotReadyError`` when ``Database.upgrade()`` was not run).

    Times come from the caller's clock: hosts sharing a database need synchronized clocks.
    """

    def __init__(self, database: Database) -> None:
        self._database = database

    def create(
        self,
        name: str,
        spec_json: str,
        trials_total: int,
        idempotency_key: str | None = None,
        request_sha256: str | None = None,
    ) -> JobRecord:
        """Store a queued job; ``spec_json`` is kept as given. Its study is ``job-<id>``.

        Raises:
            ValueError: ``trials_total`` is negative.
            ConstraintViolationError: a job with this ``idempotency_key`` exists.
        """
        if trials_total < 0:
            raise ValueError(f"trials_total={trials_total}: must be 0 or more")
        job_id = uuid.uuid4().hex

        def work(session: Session) -> JobRecord:
            row = JobRow(
                id=job_id,
                name=name,
                status="queued",
                spec_json=spec_json,
                study_name=f"job-{job_id}",
                created_at=_now(),
                trials_done=0,
                trials_total=trials_total,
                cancel_requested=False,
                idempotency_key=idempotency_key,
                request_sha256=request_sha256,
            )
            session.add(row)
            session.flush()
            return JobRecord.from_row(row)

        return self._database.run_transaction(work)

    def create_once(
        self, name: str, spec_json: str, trials_total: int, idempotency_key: str, request_sha256: str
    ) -> tuple[JobRecord, bool]:
        """``create`` under the client's ``idempotency_key``, or the job an earlier request with
        that key created: (the job, whether this call created it). Two requests racing with
        one key store one job (the key is unique); the loser gets the winner's."""
        try:
            return self.create(name, spec_json, trials_total, idempotency_key, request_sha256), True
        except errors.ConstraintViolationError:
            existing = self.by_idempotency_key(idempotency_key)
            if existing is None:
                raise
            return existing, False

    def by_idempotency_key(self, idempotency_key: str) -> JobRecord | None:
        """The job a request with this ``Idempotency-Key`` created, if any."""

        def work(session: Session) -> JobRecord | None:
            row = session.scalars(select(JobRow).where(JobRow.idempotency_key == idempotency_key)).first()
            return None if row is None else JobRecord.from_row(row)

        return self._database.run_transaction(work)

    def get(self, job_id: str) -> JobRecord:
        """The job with this id.

        Raises:
            JobNotFoundError: no job has this id.
        """
        return self._database.run_transaction(lambda s: JobRecord.from_row(_load(s, job_id)))

    def list(
        self, status: str | None = None, offset: int = 0, limit: int = 50
    ) -> tuple[builtins.list[JobRecord], int]:
        """A page of jobs, newest first, and the count of all jobs matching ``status``.

        Raises:
            ValueError: ``status`` is not a job status, or ``offset``/``limit`` is negative.
        """
        if status is not None and status not in JOB_STATUSES:
            raise ValueError(f"status={status!r}: must be one of {', '.join(JOB_STATUSES)}")
        if offset < 0 or limit < 0:
            raise ValueError(f"offset={offset}, limit={limit}: both must be 0 or more")
        where = [] if status is None else [JobRow.status == status]

        def work(session: Session) -> tuple[builtins.list[JobRecord], int]:
            count = session.scalar(select(func.count()).select_from(JobRow).where(*where))
            page = session.scalars(
                select(JobRow)
                .where(*where)
                .order_by(JobRow.created_at.desc(), JobRow.id.desc())
                .offset(offset)
                .limit(limit)
            )
            return [JobRecord.from_row(row) for row in page], count or 0

        return self._database.run_transaction(work)

    def claim_next(self, runner_id: str, *, device: str | None = None) -> JobRecord | None:
        """Move the oldest queued job to running, owned by ``runner_id``; None if none is queued.

        Exclusive across threads and processes: the claim is one UPDATE of a queued row
        (on PostgreSQL its row is picked with ``FOR UPDATE SKIP LOCKED``).
        """
        queued = aliased(JobRow)
        oldest_queued = (
            select(queued.id)
            .where(queued.status == "queued")
            .order_by(queued.created_at, queued.id)
            .limit(1)
            .with_for_update(skip_locked=True)  # rendered on PostgreSQL, ignored by SQLite
            .scalar_subquery()
        )
        statement = _claim_statement(JobRow.id == oldest_queued, runner_id, device)
        return self._database.run_transaction(lambda s: _returning_one(s, statement.returning(JobRow)))

    def claim(self, job_id: str, runner_id: str, *, device: str | None = None) -> JobRecord:
        """Move this queued job to running, owned by ``runner_id``.

        Raises:
            JobNotFoundError: no job has this id.
            JobStateError: the job is not queued (another runner claimed it, or it finished).
        """
        _known_id(job_id)
        statement = _claim_statement(JobRow.id == job_id, runner_id, device)

        def work(session: Session) -> JobRecord:
            record = _returning_one(session, statement.returning(JobRow))
            if record is None:
                row = _load(session, job_id)
                raise errors.JobStateError(f"job {job_id} is {row.status}, not queued: it cannot be claimed")
            return record

        return self._database.run_transaction(work)

    def heartbeat(self, job_id: str, runner_id: str) -> None:
        """Record that ``runner_id`` still works on this running job.

        Raises:
            JobNotFoundError: no job has this id.
            JobNotOwnedError: the job is not running under ``runner_id`` (requeued as an
                orphan, claimed by another runner, or finished): stop working on it.
        """
        _known_id(job_id)
        statement = (
            update(JobRow)
            .where(JobRow.id == job_id, JobRow.status == "running", JobRow.runner_id == runner_id)
            .values(heartbeat_at=_now())
        )

        def work(session: Session) -> None:
            if _rowcount(session, statement) == 0:
                row = _load(session, job_id)
                raise errors.JobNotOwnedError(
                    f"job {job_id} is {row.status} and owned by {row.runner_id!r}, not by "
                    f"{runner_id!r}: this runner must stop working on it"
                )

        self._database.run_transaction(work)

    def update_progress(
        self, job_id: str, trials_done: int, result_json: str | None = None, runner_id: str | None = None
    ) -> None:
        """Record the trials done so far and, if given, the result summary so far.

        ``runner_id``, when given, must own the job (a runner that lost it records nothing).

        Raises:
            ValueError: ``trials_done`` is negative.
            JobNotFoundError: no job has this id.
            JobStateError: the job is not running (JobNotOwnedError: not under ``runner_id``).
        """
        _known_id(job_id)
        if trials_done < 0:
            raise ValueError(f"trials_done={trials_done}: must be 0 or more")
        values: dict[str, Any] = {"trials_done": trials_done}
        if result_json is not None:
            values["result_json"] = result_json
        where = [JobRow.id == job_id, JobRow.status == "running", *_owned_by(runner_id)]
        statement = update(JobRow).where(*where).values(values)

        def work(session: Session) -> None:
            if _rowcount(session, statement) == 0:
                raise _not_updated(_load(session, job_id), runner_id, "record progress of")

        self._database.run_transaction(work)

    def finish(
        self,
        job_id: str,
        status: str,
        stop_reason: str | None = None,
        error: str | None = None,
        result_json: str | None = None,
        runner_id: str | None = None,
    ) -> JobRecord:
        """Move a queued or running job to ``status`` (succeeded, failed or cancelled).

        ``result_json``, when given, replaces the stored result summary. ``runner_id``, when
        given, must own the job: only its runner may end a running job it holds.

        Raises:
            ValueError: ``status`` is not a finished status.
            JobNotFoundError: no job has this id.
            JobStateError: the job already finished.
            JobNotOwnedError: ``runner_id`` is given and the job is not running under it.
        """
        _known_id(job_id)
        if status not in FINISHED_STATUSES:
            raise ValueError(f"status={status!r}: must be one of {', '.join(FINISHED_STATUSES)}")
        values: dict[str, Any] = {
            "status": status,
            "finished_at": _now(),
            "stop_reason": stop_reason,
            "error": error,
        }
        if result_json is not None:
            values["result_json"] = result_json
        unfinished = (
            JobRow.status.in_(("queued", "running")) if runner_id is None else JobRow.status == "running"
        )
        statement = (
            update(JobRow)
            .where(JobRow.id == job_id, unfinished, *_owned_by(runner_id))
            .values(values)
            .returning(JobRow)
        )

        def work(session: Session) -> JobRecord:
            record = _returning_one(session, statement)
            if record is None:
                raise _not_updated(_load(session, job_id), runner_id, "finish")
            return record

        return self._database.run_transaction(work)

    def release(self, job_id: str, runner_id: str) -> JobRecord:
        """Put a running job owned by ``runner_id`` back in the queue (its runner is known
        to be dead, e.g. a killed CLI process on this host), so it can be claimed again.

        Raises:
            JobNotFoundError: no job has this id.
            JobNotOwnedError: the job is not running under ``runner_id``.
        """
        _known_id(job_id)
        statement = (
            update(JobRow)
            .where(JobRow.id == job_id, JobRow.status == "running", JobRow.runner_id == runner_id)
            .values(status="queued", runner_id=None, heartbeat_at=None)
        )

        def work(session: Session) -> JobRecord:
            if _rowcount(session, statement) == 0:
                row = _load(session, job_id)
                raise errors.JobNotOwnedError(
                    f"job {job_id} is {row.status} and owned by {row.runner_id!r}, "
                    f"not by {runner_id!r}: it cannot be released"
                )
            return JobRecord.from_row(_load(session, job_id))

        return self._database.run_transaction(work)

    def request_cancel(self, job_id: str) -> JobRecord:
        """Cancel a job: a queued one is cancelled at once; a running one is flagged so its
        runner sees ``is_cancel_requested`` and finishes it. A finished job is left as it is.

        Raises:
            JobNotFoundError: no job has this id.
        """
        _known_id(job_id)
        cancel_queued = (
            update(JobRow)
            .where(JobRow.id == job_id, JobRow.status == "queued")
            .values(
                status="cancelled",
                cancel_requested=True,
                finished_at=_now(),
                stop_reason=CANCELLED_STOP_REASON,
            )
            .returning(JobRow)
        )
        flag_running = (
            update(JobRow)
            .where(JobRow.id == job_id, JobRow.status == "running")
            .values(cancel_requested=True)
            .returning(JobRow)
        )

        def work(session: Session) -> JobRecord:
            record = _returning_one(session, cancel_queued) or _returning_one(session, flag_running)
            return record or JobRecord.from_row(_load(session, job_id))

        return self._database.run_transaction(work)

    def is_cancel_requested(self, job_id: str) -> bool:
        """Whether someone asked to cancel this job.

        Raises:
            JobNotFoundError: no job has this id.
        """
        return self._database.run_transaction(lambda s: _load(s, job_id).cancel_requested)

    def requeue_orphans(self, stale_after_s: float) -> builtins.list[str]:
        """Put running jobs whose last heartbeat is older than ``stale_after_s`` back in the
        queue (their runner died), to be resumed; return their ids, oldest job first.

        An orphan whose cancellation was requested is finished as cancelled instead.

        Raises:
            ValueError: ``stale_after_s`` is negative.
        """
        if stale_after_s < 0:
            raise ValueError(f"stale_after_s={stale_after_s}: must be 0 or more")
        now = _now()
        stale = (
            JobRow.status == "running",
            or_(
                JobRow.heartbeat_at.is_(None),
                JobRow.heartbeat_at < now - timedelta(seconds=stale_after_s),
            ),
        )
        cancel = (
            update(JobRow)
            .where(*stale, JobRow.cancel_requested.is_(True))
            .values(status="cancelled", finished_at=now, stop_reason=CANCELLED_STOP_REASON)
        )
        requeue = (
            update(JobRow)
            .where(*stale, JobRow.cancel_requested.is_(False))
            .values(status="queued", runner_id=None, heartbeat_at=None)
            .returning(JobRow.id, JobRow.created_at)
        )

        def work(session: Session) -> builtins.list[str]:
            session.execute(cancel, execution_options={"synchronize_session": False})
            rows = session.execute(requeue, execution_options={"synchronize_session": False})
            return [job_id for job_id, _ in sorted(rows, key=lambda row: (row[1], row[0]))]

        job_ids = self._database.run_transaction(work)
        if job_ids:
            _logger.warning("requeued %d orphaned job(s): %s", len(job_ids), ", ".join(job_ids))
        return job_ids

    def delete(self, job_id: str) -> None:
        """Delete a job that is not running, then its Optuna study (if one was created).

        Raises:
            JobNotFoundError: no job has this id.
            JobStateError: the job is running: cancel it and wait until it finished.
            StorageError: the job is deleted but its study could not be (the message names
                the study so that it can be removed with ``optuna.delete_study``).
        """
        _known_id(job_id)
        statement = (
            sql_delete(JobRow)
            .where(JobRow.id == job_id, JobRow.status != "running")
            .returning(JobRow.study_name)
        )

        def work(session: Session) -> str:
            study_name = session.scalar(statement)
            if study_name is None:
                row = _load(session, job_id)
                raise errors.JobStateError(
                    f"job {job_id} is {row.status}: cancel it and wait until it finished before deleting it"
                )
            return study_name

        study_name = self._database.run_transaction(work)
        self._delete_study(study_name)

    def _delete_study(self, study_name: str) -> None:
        import optuna  # the trial store; imported here so that importing storage stays fast

        storage = None
        try:
            storage = optuna.storages.RDBStorage(self._database.url)
            storage.delete_study(storage.get_study_id_from_name(study_name))
        except KeyError:
            pass  # no trial was ever run: the study was not created
        except (sa_exc.SQLAlchemyError, optuna.exceptions.OptunaError) as exc:
            raise errors.StorageError(
                f"deleted the job but not its Optuna study {study_name!r} in "
                f"{self._database.masked_url} ({exc}); remove it with "
                f"optuna.delete_study(study_name={study_name!r}, storage=<url>)"
            ) from exc
        finally:
            if storage is not None:
                storage.remove_session()
                storage.engine.dispose()


def _claim_statement(which: ColumnElement[bool], runner_id: str, device: str | None) -> Update:
    now = _now()
    return (
        update(JobRow)
        .where(which, JobRow.status == "queued")
        .values(
            status="running",
            runner_id=runner_id,
            device=device,
            started_at=func.coalesce(JobRow.started_at, literal(now, UTCDateTime())),
            heartbeat_at=now,
        )
    )


def _load(session: Session, job_id: str) -> JobRow:
    _known_id(job_id)
    row = session.get(JobRow, job_id)
    if row is None:
        raise errors.JobNotFoundError(job_id)
    return row


def _returning_one(session: Session, statement: Any) -> JobRecord | None:
    row = session.scalars(statement, execution_options={"synchronize_session": False}).one_or_none()
    return None if row is None else JobRecord.from_row(row)


def _rowcount(session: Session, statement: Update) -> int:
    result = session.execute(statement, execution_options={"synchronize_session": False})
    return result.rowcount  # type: ignore[attr-defined]


def _known_id(job_id: str) -> None:
    """A job id is ``uuid4().hex``: anything else names no job, and never reaches the
    database (PostgreSQL refuses a NUL byte in a parameter with an error, not a miss)."""
    if not JOB_ID.fullmatch(job_id):
        raise errors.JobNotFoundError(job_id[:100])


def _owned_by(runner_id: str | None) -> list[ColumnElement[bool]]:
    return [] if runner_id is None else [JobRow.runner_id == runner_id]


def _not_updated(row: JobRow, runner_id: str | None, action: str) -> errors.JobStateError:
    """Why a conditional update of ``row`` changed nothing."""
    if row.status in FINISHED_STATUSES:
        return errors.JobStateError(f"cannot {action} job {row.id}: it already finished as {row.status}")
    if runner_id is not None and (row.status != "running" or row.runner_id != runner_id):
        return errors.JobNotOwnedError(
            f"cannot {action} job {row.id}: it is {row.status} and owned by {row.runner_id!r}, "
            f"not by {runner_id!r}"
        )
    return errors.JobStateError(f"cannot {action} job {row.id}: it is {row.status}, not running")
