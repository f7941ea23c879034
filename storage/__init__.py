"""Persistence for autotuner: one database URL holds the jobs table and Optuna's studies.

Never imports ``autotuner`` or ``trials``; the control plane maps ``storage.errors``.
"""

from storage.db import Database, default_database_url
from storage.errors import (
    ConstraintViolationError,
    DatabaseLockedError,
    DatabaseUnavailableError,
    InvalidDatabaseUrlError,
    JobNotFoundError,
    JobNotOwnedError,
    JobStateError,
    MigrationError,
    SchemaNotReadyError,
    StorageError,
)
from storage.jobs import JobStore
from storage.models import FINISHED_STATUSES, JOB_STATUSES, JobStatus
from storage.records import JobRecord
from storage.verl_runs import VerlRunRecord, VerlRunStore

__all__ = [
    "FINISHED_STATUSES",
    "JOB_STATUSES",
    "ConstraintViolationError",
    "Database",
    "DatabaseLockedError",
    "DatabaseUnavailableError",
    "InvalidDatabaseUrlError",
    "JobNotFoundError",
    "JobNotOwnedError",
    "JobRecord",
    "JobStateError",
    "JobStatus",
    "JobStore",
    "MigrationError",
    "SchemaNotReadyError",
    "StorageError",
    "VerlRunRecord",
    "VerlRunStore",
    "default_database_url",
]
