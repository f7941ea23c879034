"""Turn SQLAlchemy and driver errors into ``storage.errors``, and decide which are worth a retry.

Only this file looks inside driver exceptions (sqlite3 messages, PostgreSQL SQLSTATE codes).
"""

from __future__ import annotations

import re
from typing import Literal

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, make_url

from storage import errors

ErrorKind = Literal["locked", "unavailable", "missing_table", "constraint", "other"]

# PostgreSQL SQLSTATEs that mean "try again": lock not available, deadlock, serialization.
_PG_LOCK_STATES = {"55P03", "40P01", "40001"}
# Server shutting down or starting up; class 08 is "connection exception".
_PG_UNAVAILABLE_STATES = {"57P01", "57P02", "57P03"}
_SQLITE_LOCK_MESSAGES = ("database is locked", "database table is locked", "database schema is")
_SQLITE_UNAVAILABLE_MESSAGES = ("unable to open database file", "disk i/o error")


def mask_url(url: str | URL) -> str:
    """Return the URL as text with its password replaced by ``***``."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except sa_exc.ArgumentError:
        return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", str(url))


def classify(exc: sa_exc.SQLAlchemyError) -> ErrorKind:
    """Name the kind of failure behind a SQLAlchemy error."""
    if isinstance(exc, (sa_exc.DisconnectionError, sa_exc.TimeoutError)):
        return "unavailable"
    if not isinstance(exc, sa_exc.DBAPIError):
        return "other"
    if exc.connection_invalidated:
        return "unavailable"
    message = str(exc.orig).lower()
    state = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
    if state in _PG_LOCK_STATES or message.startswith(_SQLITE_LOCK_MESSAGES):
        return "locked"
    if isinstance(exc, sa_exc.IntegrityError):
        return "constraint"
    if state == "42P01" or message.startswith("no such table"):
        return "missing_table"
    if isinstance(exc, sa_exc.InterfaceError) or message.startswith(_SQLITE_UNAVAILABLE_MESSAGES):
        return "unavailable"
    if isinstance(exc, sa_exc.OperationalError) and _is_pg_connection_state(state, exc):
        return "unavailable"
    return "other"


def _is_pg_connection_state(state: str | None, exc: sa_exc.DBAPIError) -> bool:
    if exc.orig is not None and type(exc.orig).__module__.startswith("sqlite3"):
        return False
    # psycopg reports a failed connect as OperationalError without a SQLSTATE.
    return state is None or state.startswith("08") or state in _PG_UNAVAILABLE_STATES


def is_transient(exc: sa_exc.SQLAlchemyError) -> bool:
    """True when the same transaction may succeed if run again shortly."""
    return classify(exc) in ("locked", "unavailable")


def to_storage_error(
    exc: sa_exc.SQLAlchemyError, url: URL, attempts: int, elapsed_s: float
) -> errors.StorageError:
    """Build the ``StorageError`` subclass for ``exc``, naming ``url`` with its password masked."""
    where = mask_url(url)
    detail = _detail(exc, url)
    tried = f"gave up after {attempts} attempt(s) over {elapsed_s:.1f} s"
    kind = classify(exc)
    if kind == "locked":
        return errors.DatabaseLockedError(
            f"database {where} is locked by another writer ({detail}); {tried}. Wait for the "
            "other writer to finish; with many workers on one SQLite file, use PostgreSQL."
        )
    if kind == "unavailable":
        return errors.DatabaseUnavailableError(
            f"cannot use database {where} ({detail}); {tried}. Check that the server runs and "
            "that the URL's host, port, database name and credentials are right."
        )
    if kind == "missing_table":
        return errors.SchemaNotReadyError(
            f"database {where} lacks a table ({detail}); run Database.upgrade() on it first."
        )
    if kind == "constraint":
        return errors.ConstraintViolationError(f"database {where} refused the write ({detail}).")
    return errors.StorageError(f"database {where} failed ({detail}).")


def _detail(exc: sa_exc.SQLAlchemyError, url: URL) -> str:
    """The driver's own message on one line, without the password."""
    original = exc.orig if isinstance(exc, sa_exc.DBAPIError) and exc.orig is not None else exc
    text = " ".join(str(original).split()) or type(original).__name__
    if url.password:
        text = text.replace(str(url.password), "***")
    return text
