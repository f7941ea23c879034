"""Shared fixtures. ``database_url`` runs a test once on SQLite and once on PostgreSQL."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

POSTGRES_URL_ENV = "AUTOTUNER_TEST_POSTGRES_URL"
DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@pytest.fixture(scope="session")
def postgres_admin_url() -> str:
    """URL of an existing PostgreSQL database whose user may CREATE DATABASE.

    Skips the test when the server is unreachable, except on CI (``CI=true``) where the
    server is part of the setup and its absence fails the test.
    """
    from sqlalchemy import create_engine, exc

    url = os.environ.get(POSTGRES_URL_ENV) or DEFAULT_POSTGRES_URL
    engine = create_engine(url, connect_args={"connect_timeout": 3})
    try:
        with engine.connect():
            pass
    except exc.SQLAlchemyError as error:
        reason = (
            f"PostgreSQL at {engine.url!r} is unreachable "
            f"({' '.join(str(getattr(error, 'orig', error)).split())}); "
            f"set {POSTGRES_URL_ENV} to a server whose user may CREATE DATABASE"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    finally:
        engine.dispose()
    return url


@pytest.fixture
def postgres_url(postgres_admin_url: str) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    from sqlalchemy import create_engine, make_url, pool, text

    admin_url = make_url(postgres_admin_url)
    name = f"autotuner_t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=pool.NullPool)
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield admin_url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": name},
            )
            force = connection.dialect.server_version_info >= (13,)
            connection.execute(
                text(f'DROP DATABASE IF EXISTS "{name}"' + (" WITH (FORCE)" if force else ""))
            )
        admin.dispose()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A SQLite file in the test's temporary directory (not created yet)."""
    return f"sqlite:///{tmp_path / 'autotuner.db'}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest) -> str:
    """An empty database of each supported kind: SQLite file, then PostgreSQL."""
    return request.getfixturevalue(f"{request.param}_url")
