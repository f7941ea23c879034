"""Migrations: they create what the models declare, run twice safely, and leave Optuna's
tables (and Optuna's own ``alembic_version``) alone."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import optuna
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, select, text

from storage import ConstraintViolationError, Database, JobStore, migrate
from storage.migrate import VERSION_TABLE, head_revision, include_name
from storage.models import Base, JobRow

JOB_COLUMNS = {
    "id", "name", "status", "spec", "study_name", "created_at", "started_at", "finished_at",
    "runner_id", "heartbeat_at", "trials_done", "trials_total", "cancel_requested",
    "stop_reason", "error", "result", "device", "idempotency_key", "request_sha256",
}  # fmt: skip


def test_upgrade_creates_the_jobs_table(database_url: str) -> None:
    database = Database(database_url)
    assert database.current_revision() is None

    database.upgrade()

    inspector = inspect(database.engine)
    assert {"jobs", VERSION_TABLE} <= set(inspector.get_table_names())
    assert {column["name"] for column in inspector.get_columns("jobs")} == JOB_COLUMNS
    assert inspector.get_pk_constraint("jobs")["constrained_columns"] == ["id"]
    indexes = {index["name"]: index["column_names"] for index in inspector.get_indexes("jobs")}
    assert indexes["ix_jobs_status"] == ["status"]
    assert indexes["ix_jobs_created_at"] == ["created_at"]
    unique = [constraint["column_names"] for constraint in inspector.get_unique_constraints("jobs")]
    assert ["study_name"] in unique and ["idempotency_key"] in unique
    assert database.current_revision() == head_revision() == "0003"
    database.dispose()


def test_upgrade_is_idempotent(database: Database) -> None:
    job = JobStore(database).create("kept", "{}", trials_total=4)

    database.upgrade()
    database.upgrade()

    assert database.current_revision() == head_revision()
    assert JobStore(database).get(job.id) == job


def test_a_database_of_the_first_revision_keeps_its_jobs_and_gains_idempotency_keys(
    database_url: str,
) -> None:
    database = Database(database_url)
    with database.engine.begin() as connection:
        migrate.upgrade(connection, "0001")
        connection.execute(
            text(
                "INSERT INTO jobs (id, name, status, spec, study_name, created_at, trials_done, "
                "trials_total, cancel_requested) VALUES ('a' || :tail, 'old', 'queued', '{}', "
                "'job-old', CURRENT_TIMESTAMP, 0, 3, :no)"
            ),
            {"tail": "0" * 31, "no": False},
        )
    database.upgrade()
    store = JobStore(database)
    old = store.get("a" + "0" * 31)
    assert old.name == "old" and old.idempotency_key is None
    new, created = store.create_once("new", "{}", 1, "key-1", "f" * 64)
    assert created and store.by_idempotency_key("key-1") == new
    again, created = store.create_once("new", "{}", 1, "key-1", "f" * 64)
    assert not created and again == new
    assert store.list()[1] == 2
    database.dispose()


def test_migrations_match_the_models(database: Database) -> None:
    with database.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"include_name": include_name})
        assert compare_metadata(context, Base.metadata) == []


def test_status_outside_the_allowed_set_is_refused(database: Database, store: JobStore) -> None:
    job = store.create("a", "{}", trials_total=1)

    with (
        pytest.raises(ConstraintViolationError, match="refused the write"),
        database.session() as session,
    ):
        session.execute(JobRow.__table__.update().values(status="paused"))

    assert store.get(job.id).status == "queued"


def test_optuna_rdb_storage_shares_the_database(database_url: str) -> None:
    before = optuna.create_study(study_name="made-before", storage=database_url)
    before.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=1.0))
    database = Database(database_url)

    database.upgrade()

    after = optuna.create_study(study_name="made-after", storage=database_url)
    after.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=2.0))
    storage = optuna.storages.RDBStorage(database_url)  # runs Optuna's schema check
    assert storage.get_current_version() == storage.get_head_version()
    assert sorted(optuna.get_all_study_names(database_url)) == ["made-after", "made-before"]
    assert optuna.load_study(study_name="made-before", storage=database_url).best_value == 1.0
    assert database.current_revision() == head_revision()
    with database.engine.connect() as connection:
        optuna_version = connection.scalar(text("SELECT version_num FROM alembic_version"))
        ours = connection.scalar(select(text("version_num")).select_from(text(VERSION_TABLE)))
    assert optuna_version != ours == head_revision()
    job = JobStore(database).create("a", "{}", trials_total=1)
    assert JobStore(database).get(job.id).status == "queued"
    storage.engine.dispose()
    database.dispose()


def test_concurrent_upgrades_in_threads_all_succeed(database_url: str) -> None:
    failures: list[BaseException] = []
    barrier = threading.Barrier(4)

    def upgrade() -> None:
        database = Database(database_url)
        try:
            barrier.wait()
            database.upgrade()
        except BaseException as error:  # reported by the assertion below
            failures.append(error)
        finally:
            database.dispose()

    threads = [threading.Thread(target=upgrade) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert failures == []
    database = Database(database_url)
    assert database.current_revision() == head_revision()
    assert JobStore(database).create("a", "{}", trials_total=1).status == "queued"
    database.dispose()


def test_concurrent_upgrades_in_processes_all_succeed(database_url: str) -> None:
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    script = "import sys; from storage import Database; Database(sys.argv[1]).upgrade()"
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", script, database_url],
            cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for _ in range(4)
    ]  # fmt: skip
    outputs = [process.communicate(timeout=60)[0] for process in processes]

    assert [process.returncode for process in processes] == [0] * 4, outputs
    database = Database(database_url)
    assert database.current_revision() == head_revision()
    database.dispose()
