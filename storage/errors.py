"""Errors the storage layer raises on purpose; the control plane maps them to its own.

Every message names the database URL with its password masked and says what to check.
Caller bugs (an unknown status name, a negative limit) raise ``ValueError`` instead.
"""

from __future__ import annotations


class StorageError(Exception):
    """Root of every error ``storage`` raises on purpose.

    Raised as such when the database rejects a statement for a reason no subclass names.
    """


class InvalidDatabaseUrlError(StorageError):
    """Raised by ``Database(url)`` when the URL cannot be parsed or names no installed driver."""


class DatabaseUnavailableError(StorageError):
    """Raised when the database cannot be reached (server down, wrong host, port or
    credentials, unwritable SQLite file) after the retries are spent."""


class DatabaseLockedError(DatabaseUnavailableError):
    """Raised when another writer holds a SQLite file locked past the busy timeout on
    every retry (or a PostgreSQL lock wait times out every time)."""


class SchemaNotReadyError(StorageError):
    """Raised when a table is missing: ``Database.upgrade()`` has not been run on this URL."""


class MigrationError(StorageError):
    """Raised by ``Database.upgrade()`` when a migration fails; the database is left at
    the last revision that completed (PostgreSQL rolls the whole upgrade back)."""


class ConstraintViolationError(StorageError):
    """Raised when a write breaks a table constraint (a duplicate key, a status outside
    the allowed set, a negative count)."""


class JobNotFoundError(StorageError):
    """Raised when no job has the given id."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        super().__init__(f"no job with id {job_id!r}; list the jobs to see the valid ids")


class JobStateError(StorageError):
    """Raised when a job is not in a state that allows the operation (claiming a job that
    is not queued, finishing a job that already finished, deleting a running job)."""


class JobNotOwnedError(JobStateError):
    """Raised when a runner heartbeats a job it no longer owns: the job was requeued as
    an orphan, claimed by another runner, or finished. The runner must stop working on it."""
