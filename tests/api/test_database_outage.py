"""PostgreSQL restarted (a crash: ``pg_ctl stop -m immediate``) under the job store, Optuna
and a running service: clear errors while it is down, retries, and afterwards the same
studies, complete and uncorrupted, with the job finished as if nothing happened.

The server is a private one (``private_postgres``); the shared one on 5432 is not touched.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import optuna
import pytest
from optuna.trial import TrialState

from storage import Database, DatabaseUnavailableError, JobStore

from .conftest import MEASURED, TOKEN, Server, submit, train_job, trials_of
from .private_postgres import PrivatePostgres, binaries

optuna.logging.set_verbosity(optuna.logging.WARNING)
pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def pg() -> Iterator[PrivatePostgres]:
    bin_dir = binaries()
    if bin_dir is None:
        pytest.skip(
            "no PostgreSQL server binaries (initdb, pg_ctl) under /usr/lib/postgresql; "
            "install the postgresql package to run the restart tests"
        )
    server = PrivatePostgres(bin_dir)
    try:
        server.start()
        yield server
    finally:
        server.close()


def _until(condition: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_writes_wait_out_a_restart_and_the_study_survives(pg, caplog) -> None:
    database = Database(pg.url, max_attempts=6, retry_backoff_s=0.25)
    database.upgrade()
    store = JobStore(database)
    before = store.create("before", "{}", trials_total=3)
    storage = optuna.storages.RDBStorage(pg.url, engine_kwargs={"pool_pre_ping": True})
    study = optuna.create_study(study_name="outage", storage=storage, directions=["maximize"])
    for x in (1, 2):
        trial = study.ask()
        trial.suggest_int("x", x, x)
        study.tell(trial, float(x))
    in_flight = study.ask()  # measured across the crash, told after it
    in_flight.suggest_int("x", 3, 3)

    pg.stop("immediate")
    impatient = JobStore(Database(pg.url, max_attempts=2, retry_backoff_s=0.01))
    with pytest.raises(DatabaseUnavailableError) as down:
        impatient.get(before.id)
    message = str(down.value)
    assert f"127.0.0.1:{pg.port}" in message and "gave up after 2 attempt(s)" in message
    assert "Check that the server runs" in message

    # A write begun while the server is down retries until it is back, then succeeds.
    outcome: dict[str, Any] = {}

    def write() -> None:
        try:
            outcome["job"] = store.create("during", "{}", trials_total=1)
        except Exception as exc:  # reported below
            outcome["error"] = exc

    with caplog.at_level(logging.WARNING, "storage.db"):
        writer = threading.Thread(target=write)
        writer.start()
        _until(
            lambda: any("retrying" in r.getMessage() for r in caplog.records), 10, "the write's first retry"
        )
        pg.start()
        writer.join(60)
    assert "error" not in outcome, outcome
    retries = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert retries and all("postgres@127.0.0.1" in m for m in retries), retries

    study.tell(in_flight, 3.0)  # the same storage object reconnects
    reloaded = optuna.load_study(study_name="outage", storage=pg.url)
    trials = reloaded.get_trials()
    assert [(t.state, t.params["x"], t.value) for t in trials] == [
        (TrialState.COMPLETE, x, float(x)) for x in (1, 2, 3)
    ]
    assert {j.name for j in store.list()[0]} == {"before", "during"}
    storage.engine.dispose()
    database.dispose()


def _status(api: httpx.Client, job_id: str) -> tuple[int, dict[str, Any]]:
    response = api.get(f"/v1/jobs/{job_id}")
    return response.status_code, response.json()


@pytest.mark.slow
def test_a_job_outlives_a_database_crash(pg, tmp_path) -> None:
    url = pg.url.rsplit("/", 1)[0] + "/service"
    admin = Database(pg.url)
    with admin.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.exec_driver_sql("CREATE DATABASE service")
    admin.dispose()
    server = Server(
        tmp_path / "data", tmp_path / "server.log", AUTOTUNER_API_TOKEN=TOKEN, AUTOTUNER_DATABASE_URL=url
    ).start()
    try:
        with server.client() as api:
            job_id = submit(api, train_job(name="outage", budget={"max_trials": 3}))
            # The next trial launched: its config chosen and written (a trial is "running"
            # from its proposal on, while its knobs are still drawn).
            _until(
                lambda: (
                    lambda t: (
                        any(x["status"] in MEASURED for x in t)
                        and any(x["status"] == "running" and x["config"] for x in t)
                    )
                )(trials_of(api, job_id)),
                180,
                "a trial measured and the next one running",
            )
            pg.stop("immediate")
            # While it is down: 503 with the reason and Retry-After, never a 500.
            code, body = _status(api, job_id)
            assert code == 503, body
            assert body["detail"].startswith("storage unavailable:") and str(pg.port) in body["detail"]
            health = httpx.get(server.url + "/healthz", timeout=60)
            assert health.status_code == 503 and health.headers["retry-after"] == "5"
            # The running trial ends while the database is down: its result cannot be told,
            # so the job waits for the database to come back to resume.
            _until(
                lambda: "goes back to the queue once it answers" in server.log(),
                120,
                f"the runner to give the job back:\n{server.log()}",
            )
            pg.start()
            job = _until(
                lambda: (
                    lambda c, j: (
                        j if c == 200 and j["status"] in ("succeeded", "failed", "cancelled") else None
                    )
                )(*_status(api, job_id)),
                300,
                "the job's end",
            )
            trials = trials_of(api, job_id)
    finally:
        server.stop()
    log = server.log_path.read_text()
    assert job["status"] == "succeeded", (job, trials, log)
    assert job["trials_done"] == 3 and job["stop_reason"] == "reached max_trials (3)"
    measured = [t for t in trials if t["measured"]]  # a baseline's re-runs do not count
    assert len(measured) == 3
    configs = [json.dumps(t["config"], sort_keys=True) for t in measured]
    assert len(set(configs)) == 3, "a config ran twice"
    # The trial whose result could not be told is interrupted; its config ran again, once.
    interrupted = [t for t in trials if t["status"] == "interrupted"]
    assert len(interrupted) == 1, trials
    assert json.dumps(interrupted[0]["config"], sort_keys=True) in configs
    assert not [t for t in trials if t["status"] == "running"]
    assert "the database answers again; back in the queue" in log
    assert "Traceback" not in log, log
