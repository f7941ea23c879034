"""Database: engine set-up, the session helper, error mapping and retries."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest
from sqlalchemy import func, select, text

from storage import (
    ConstraintViolationError,
    Database,
    DatabaseLockedError,
    DatabaseUnavailableError,
    InvalidDatabaseUrlError,
    JobStore,
    MigrationError,
    SchemaNotReadyError,
    default_database_url,
)
from storage.models import JobRow

CLOSED_PORT_URL = "postgresql+psycopg://autotuner:s3cret-pw@127.0.0.1:1/jobs"


def _retry_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]


def test_default_database_url_is_a_sqlite_file_in_the_data_dir(tmp_path: Path) -> None:
    assert default_database_url(tmp_path) == f"sqlite:///{tmp_path}/autotuner.db"


def test_sqlite_parent_directory_is_created(tmp_path: Path) -> None:
    data_dir = tmp_path / "not" / "there"
    database = Database(default_database_url(data_dir))

    database.upgrade()

    assert (data_dir / "autotuner.db").is_file()
    database.dispose()


def test_sqlite_connections_use_wal_busy_timeout_and_foreign_keys(sqlite_url: str) -> None:
    database = Database(sqlite_url, busy_timeout_s=2.5)

    with database.session() as session:
        assert session.scalar(text("PRAGMA journal_mode")) == "wal"
        assert session.scalar(text("PRAGMA busy_timeout")) == 2500
        assert session.scalar(text("PRAGMA foreign_keys")) == 1
    database.dispose()


def test_session_commits_on_success_and_rolls_back_on_error(database: Database) -> None:
    def row(job_id: str) -> JobRow:
        return JobRow(
            id=job_id, name=job_id, status="queued", spec_json="{}", study_name=f"job-{job_id}",
            created_at=datetime.now(timezone.utc), trials_total=1,
        )  # fmt: skip

    with database.session() as session:
        session.add(row("kept"))
    with pytest.raises(RuntimeError), database.session() as session:
        session.add(row("dropped"))
        session.flush()
        raise RuntimeError("boom")
    with pytest.raises(ConstraintViolationError), database.session() as session:
        session.add(row("kept"))

    with database.session() as session:
        assert session.scalars(select(JobRow.id)).all() == ["kept"]


def test_unreachable_postgres_raises_unavailable_with_masked_password() -> None:
    database = Database(CLOSED_PORT_URL, retry_backoff_s=0.01)

    with pytest.raises(DatabaseUnavailableError) as raised:
        JobStore(database).get("0" * 32)

    message = str(raised.value)
    assert "postgresql+psycopg://autotuner:***@127.0.0.1:1/jobs" in message
    assert "s3cret-pw" not in message and "s3cret-pw" not in repr(database)
    assert "gave up after 4 attempt(s)" in message
    assert "Check that the server runs" in message
    with pytest.raises(DatabaseUnavailableError, match="gave up after 4"):
        database.upgrade()
    with pytest.raises(DatabaseUnavailableError), database.session():
        pass


def test_unreachable_database_is_retried_with_backoff(caplog: pytest.LogCaptureFixture) -> None:
    database = Database(CLOSED_PORT_URL, max_attempts=3, retry_backoff_s=0.05)

    started = time.monotonic()
    with caplog.at_level(logging.WARNING, "storage.db"), pytest.raises(DatabaseUnavailableError):
        database.ping()

    assert len(_retry_warnings(caplog)) == 2
    assert time.monotonic() - started >= 0.05 * 0.5 + 0.1 * 0.5  # the jittered backoff
    assert all("s3cret-pw" not in message for message in _retry_warnings(caplog))


@pytest.mark.parametrize("url", ["not a url", "postgresql+nosuchdriver://autotuner:s3cret-pw@localhost/jobs"])
def test_bad_url_raises_invalid_url_without_the_password(url: str) -> None:
    with pytest.raises(InvalidDatabaseUrlError) as raised:
        Database(url)

    assert "s3cret-pw" not in str(raised.value)


def test_missing_tables_say_to_run_upgrade(database_url: str) -> None:
    database = Database(database_url)

    with pytest.raises(SchemaNotReadyError, match=r"run Database\.upgrade\(\)"):
        JobStore(database).list()
    database.dispose()


def test_database_migrated_by_a_newer_version_is_refused(database: Database) -> None:
    with database.session() as session:
        session.execute(text("UPDATE autotuner_alembic_version SET version_num = '9999'"))

    with pytest.raises(MigrationError, match="9999"):
        database.upgrade()


@pytest.fixture
def locked_sqlite(sqlite_url: str) -> Iterator[sqlite3.Connection]:
    """A second writer holding the write lock on the migrated SQLite file."""
    Database(sqlite_url).upgrade()
    writer = sqlite3.connect(
        sqlite_url.removeprefix("sqlite:///"), isolation_level=None, check_same_thread=False
    )
    writer.execute("BEGIN IMMEDIATE")
    yield writer
    if writer.in_transaction:
        writer.execute("ROLLBACK")
    writer.close()


def test_sqlite_locked_by_another_writer_is_retried_then_reported(
    sqlite_url: str, locked_sqlite: sqlite3.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    database = Database(sqlite_url, busy_timeout_s=0.05, max_attempts=3, retry_backoff_s=0.02)

    with (
        caplog.at_level(logging.WARNING, "storage.db"),
        pytest.raises(DatabaseLockedError) as raised,
    ):
        JobStore(database).create("a", "{}", trials_total=1)

    assert len(_retry_warnings(caplog)) == 2
    message = str(raised.value)
    assert "is locked by another writer" in message and "gave up after 3 attempt(s)" in message
    assert isinstance(raised.value, DatabaseUnavailableError)
    database.dispose()


def test_sqlite_lock_released_during_the_retries_lets_the_write_through(
    sqlite_url: str, locked_sqlite: sqlite3.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    database = Database(sqlite_url, busy_timeout_s=0.05, max_attempts=8, retry_backoff_s=0.05)
    release = threading.Timer(0.3, lambda: locked_sqlite.execute("ROLLBACK"))

    release.start()
    with caplog.at_level(logging.WARNING, "storage.db"):
        job = JobStore(database).create("a", "{}", trials_total=1)
    release.join()

    assert _retry_warnings(caplog), "the write should have waited for the lock"
    with database.session() as session:
        assert session.scalar(select(func.count()).select_from(JobRow)) == 1
    assert JobStore(database).get(job.id).name == "a"
    database.dispose()
