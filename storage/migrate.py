"""Run our Alembic migrations from code: no alembic.ini is needed at run time.

Optuna's RDBStorage keeps its own Alembic history in a table named ``alembic_version``
in the same database, so ours lives in ``autotuner_alembic_version``.
"""

from __future__ import annotations

import threading
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, text

MIGRATIONS_DIR = Path(__file__).resolve().with_name("migrations")
VERSION_TABLE = "autotuner_alembic_version"
# pg_advisory_xact_lock key ("autotune" in ASCII): one upgrade at a time per database.
_UPGRADE_LOCK_KEY = 0x6175746F74756E65
# Alembic's ``context`` is one module-level object: two threads must not run env.py at once.
_ALEMBIC_LOCK = threading.Lock()


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic config for our migrations; ``env.py`` runs them on ``connection``."""
    config = Config()
    # Config values go through configparser interpolation, where "%" is special.
    config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    config.attributes["connection"] = connection
    return config


def upgrade(connection: Connection, revision: str = "head") -> None:
    """Migrate the database behind ``connection`` (inside its open transaction) to ``revision``.

    Threads of one process take turns (Alembic's state is global). On PostgreSQL an advisory
    lock makes upgrades from several processes wait for each other instead of racing on
    ``CREATE TABLE``; on SQLite the loser of that race is retried by ``Database``.
    """
    with _ALEMBIC_LOCK:
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _UPGRADE_LOCK_KEY})
        command.upgrade(alembic_config(connection), revision)


def current_revision(connection: Connection) -> str | None:
    """The revision the database is at, or None before the first upgrade."""
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


def head_revision() -> str | None:
    """The newest revision shipped in ``storage/migrations/versions``."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def include_name(name: str | None, type_: str, parent_names: object) -> bool:
    """Alembic autogenerate filter: compare only our tables (Optuna's share the database)."""
    from storage.models import Base

    if type_ == "table":
        return name in Base.metadata.tables
    return True
