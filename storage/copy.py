"""Copy the jobs table from one database to another (moving SQLite to PostgreSQL, say)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from storage import errors
from storage.db import Database
from storage.models import JobRow


def copy_jobs(source: Database, destination: Database) -> int:
    """Copy every job row, unchanged, into ``destination``; return how many.

    Both databases are migrated to the current revision first. The destination must hold
    no job (a copy never merges); the copy is one transaction there.

    Raises:
        JobStateError: the destination already holds jobs.
        StorageError subclass: either database failed.
    """
    source.upgrade()
    destination.upgrade()
    table = JobRow.metadata.tables[JobRow.__tablename__]

    def read(session: Session) -> list[dict[str, Any]]:
        return [dict(row._mapping) for row in session.execute(select(table))]

    rows = source.run_transaction(read)

    def write(session: Session) -> int:
        present = session.scalar(select(func.count()).select_from(table)) or 0
        if present:
            raise errors.JobStateError(
                f"database {destination.masked_url} already holds {present} job(s); copy into "
                "an empty database"
            )
        if rows:
            session.execute(insert(table), rows)
        return len(rows)

    return destination.run_transaction(write)
