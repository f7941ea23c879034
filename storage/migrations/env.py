"""Alembic environment for the autotuner tables.

At run time ``Database.upgrade()`` passes an open connection in
``config.attributes["connection"]``. For development (``alembic revision --autogenerate``)
pass a URL: ``alembic -c storage/alembic.ini -x url=sqlite:///path/autotuner.db ...``.
"""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import create_engine, pool

from storage.migrate import VERSION_TABLE, include_name
from storage.models import Base

config = context.config


def _configure(**kwargs: Any) -> None:
    context.configure(
        target_metadata=Base.metadata,
        # Optuna's RDBStorage owns "alembic_version" in the same database.
        version_table=VERSION_TABLE,
        include_name=include_name,
        render_as_batch=True,  # SQLite cannot ALTER most things; batch mode copies the table.
        **kwargs,
    )


def _url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url")
    url = url or config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database URL: pass -x url=<SQLAlchemy URL> to alembic")
    return url


def run_migrations_offline() -> None:
    _configure(url=_url(), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection=connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as connection:
        _configure(connection=connection)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
