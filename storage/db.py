"""One database URL: the engine, transactions that retry transient failures, and migrations."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from os import PathLike
from pathlib import Path
from typing import Any, TypeVar

from alembic.util.exc import CommandError
from sqlalchemy import Engine, create_engine, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session, sessionmaker

from storage import errors, migrate
from storage.driver_errors import is_transient, mask_url, to_storage_error

T = TypeVar("T")
_logger = logging.getLogger(__name__)


def default_database_url(data_dir: str | PathLike[str]) -> str:
    """The embedded default: ``sqlite:///<data_dir>/autotuner.db`` (absolute path)."""
    path = Path(data_dir).expanduser().resolve() / "autotuner.db"
    return f"sqlite:///{path.as_posix()}"


class Database:
    """The engine for one URL, shared by the threads of a process.

    ``run_transaction(work)`` is the way to write: it runs ``work(session)`` in one
    transaction, commits, and runs it again (with backoff) when the database was locked or
    unreachable. ``session()`` gives one transaction without re-running its body.
    Both turn SQLAlchemy and driver errors into ``storage.errors`` that name the URL with its
    password masked. After ``os.fork()`` the child must call ``dispose()`` before use.

    SQLite (the default): the parent directory is created, and each connection gets WAL
    journal mode, ``busy_timeout_s`` and foreign keys. PostgreSQL: connections are pinged
    before use and connecting gives up after ``connect_timeout_s``.

    Raises:
        InvalidDatabaseUrlError: the URL cannot be parsed or its driver is not installed.
        DatabaseUnavailableError: the SQLite file's directory cannot be created.
    """

    def __init__(
        self,
        url: str | URL,
        *,
        max_attempts: int = 4,
        retry_backoff_s: float = 0.1,
        busy_timeout_s: float = 5.0,
        connect_timeout_s: int = 10,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts={max_attempts}: must be at least 1")
        try:
            self._url = make_url(url)
        except sa_exc.ArgumentError as exc:
            raise errors.InvalidDatabaseUrlError(
                f"cannot parse database URL {mask_url(url)!r}: {exc}. Expected a SQLAlchemy "
                "URL like sqlite:////abs/path/autotuner.db or postgresql+psycopg://user@host/db"
            ) from exc
        self._max_attempts = max_attempts
        self._retry_backoff_s = retry_backoff_s
        self._engine = self._create_engine(busy_timeout_s, connect_timeout_s)
        self._sessions = sessionmaker(self._engine, expire_on_commit=False)

    @property
    def url(self) -> str:
        """The full URL, password included: pass it to Optuna's RDBStorage, never log it."""
        return self._url.render_as_string(hide_password=False)

    @property
    def masked_url(self) -> str:
        """The URL with its password replaced by ``***``: safe to log and show."""
        return mask_url(self._url)

    @property
    def dialect(self) -> str:
        """The backend's name: ``sqlite`` or ``postgresql``."""
        return self._engine.dialect.name

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine, for tools (inspection, Alembic); queries belong in storage."""
        return self._engine

    def _create_engine(self, busy_timeout_s: float, connect_timeout_s: int) -> Engine:
        try:
            if self._url.get_backend_name() == "sqlite":
                return _sqlite_engine(self._url, busy_timeout_s)
            connect_args: dict[str, Any] = {}
            if self._url.get_backend_name() == "postgresql" and ("connect_timeout" not in self._url.query):
                connect_args["connect_timeout"] = connect_timeout_s
            return create_engine(self._url, pool_pre_ping=True, connect_args=connect_args)
        except (sa_exc.ArgumentError, sa_exc.NoSuchModuleError, ImportError) as exc:
            raise errors.InvalidDatabaseUrlError(
                f"cannot use database URL {self.masked_url}: {exc}. Check the scheme "
                "(sqlite:///..., postgresql+psycopg://...) and that its driver is installed."
            ) from exc

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One transaction: commits when the block ends, rolls back if it raises.

        Connecting is retried; the block itself is not (use ``run_transaction`` to retry).

        Raises:
            StorageError subclass: the database failed or refused a statement.
        """
        session = self._sessions()
        try:
            self._retrying(session.connection)
            yield session
            session.commit()
        except sa_exc.SQLAlchemyError as exc:
            session.rollback()
            raise to_storage_error(exc, self._url, attempts=1, elapsed_s=0.0) from exc
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    def run_transaction(self, work: Callable[[Session], T]) -> T:
        """Run ``work(session)`` in one transaction and commit; return what it returns.

        When the database is locked or unreachable, the transaction is rolled back and
        ``work`` runs again in a fresh session, up to ``max_attempts`` times with exponential
        backoff. So ``work`` must only touch the session it gets. Return plain data: ORM
        objects are detached once this returns.

        Raises:
            DatabaseLockedError: the database stayed locked on every attempt.
            DatabaseUnavailableError: the database stayed unreachable on every attempt.
            StorageError subclass: the database refused a statement (not retried).
            Whatever ``work`` raises on purpose, unchanged and not retried.
        """

        def attempt() -> T:
            with self._sessions() as session, session.begin():
                return work(session)

        return self._retrying(attempt)

    def upgrade(self) -> None:
        """Migrate our tables to the newest revision; a no-op when already there.

        Safe to call from several processes at once on PostgreSQL (advisory lock).

        Raises:
            MigrationError: a migration failed, or the database is at a revision this code
                does not know (it was migrated by a newer version).
            DatabaseUnavailableError: the database cannot be reached.
        """

        def attempt() -> None:
            with self._engine.begin() as connection:
                migrate.upgrade(connection)

        try:
            self._retrying(attempt, on_failure=errors.MigrationError)
        except CommandError as exc:
            raise errors.MigrationError(
                f"cannot migrate database {self.masked_url}: {exc}. If it was migrated by a "
                "newer version of this program, run that version."
            ) from exc

    def current_revision(self) -> str | None:
        """Our migration revision in the database; None before the first ``upgrade()``."""

        def attempt() -> str | None:
            with self._engine.connect() as connection:
                return migrate.current_revision(connection)

        return self._retrying(attempt)

    def ping(self) -> None:
        """Check that the database answers (for health checks).

        Raises:
            DatabaseUnavailableError: it does not, after the retries.
        """
        self._retrying(lambda: self._engine.connect().close())

    def dispose(self) -> None:
        """Close the pooled connections. The object stays usable (it reconnects)."""
        self._engine.dispose()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.dispose()

    def __repr__(self) -> str:
        return f"Database({self.masked_url!r})"

    def _retrying(
        self,
        attempt: Callable[[], T],
        on_failure: type[errors.StorageError] | None = None,
    ) -> T:
        """Call ``attempt`` until it succeeds, retrying transient database errors.

        A non-transient error becomes ``on_failure`` if given, else its mapped StorageError.
        """
        started = time.monotonic()
        for number in range(1, self._max_attempts + 1):
            try:
                return attempt()
            except sa_exc.SQLAlchemyError as exc:
                elapsed_s = time.monotonic() - started
                transient = is_transient(exc)
                if not transient or number == self._max_attempts:
                    error = to_storage_error(exc, self._url, number, elapsed_s)
                    if on_failure is not None and not transient:
                        error = on_failure(f"migration failed: {error}")
                    raise error from exc
                delay_s = self._retry_backoff_s * 2 ** (number - 1) * random.uniform(0.5, 1.0)
                _logger.warning(
                    "database %s: %s; retrying in %.2f s (attempt %d of %d)",
                    self.masked_url,
                    type(exc.orig if isinstance(exc, sa_exc.DBAPIError) else exc).__name__,
                    delay_s,
                    number,
                    self._max_attempts,
                )
                time.sleep(delay_s)
        raise AssertionError("unreachable")  # the loop returns or raises


def _sqlite_engine(url: URL, busy_timeout_s: float) -> Engine:
    """An engine for a SQLite file (or memory) with WAL, busy timeout and foreign keys."""
    database = url.database or ""
    if database and database != ":memory:" and not database.startswith("file:"):
        directory = Path(database).expanduser().parent
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise errors.DatabaseUnavailableError(
                f"cannot create directory {directory} for database {mask_url(url)}: {exc}. "
                "Choose a writable data directory."
            ) from exc
    engine = create_engine(url)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event emit BEGIN: pysqlite's own transaction handling
        # skips it before SELECTs, so reads would not be part of the transaction.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN")

    return engine
