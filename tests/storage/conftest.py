"""Fixtures for the storage tests: a migrated database of each kind and its job store."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from storage import Database, JobStore


@pytest.fixture
def database(database_url: str) -> Iterator[Database]:
    """A ``Database`` on ``database_url``, migrated to head."""
    database = Database(database_url)
    database.upgrade()
    yield database
    database.dispose()


@pytest.fixture
def store(database: Database) -> JobStore:
    return JobStore(database)
