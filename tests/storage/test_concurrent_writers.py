"""Concurrent writers: several processes write jobs and Optuna trials to one database at
once (as a service and CLI runs sharing the default SQLite file do, or the service replicas
and workers of a cluster sharing PostgreSQL); every write lands, none is lost or doubled,
trial numbers stay unique, and a SQLite file passes its integrity check."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import optuna
from optuna.trial import TrialState

from storage import Database, JobStore

REPO = Path(__file__).resolve().parents[2]
WRITERS = 4
ROUNDS = 15

# One writer: per round a job goes queued -> running -> progress -> succeeded, and a trial
# of the shared study is asked and told.
WRITER = """
import sys
import optuna
from storage import Database, JobStore
optuna.logging.set_verbosity(optuna.logging.WARNING)
url, me, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
store = JobStore(Database(url))
study = optuna.load_study(study_name="shared", storage=url)
for i in range(rounds):
    job = store.create(f"{me}-{i}", "{}", trials_total=1)
    store.claim(job.id, me)
    store.update_progress(job.id, 1)
    store.finish(job.id, "succeeded", stop_reason="done")
    trial = study.ask()
    trial.set_user_attr("writer", me)
    study.tell(trial, float(i))
"""


def test_concurrent_writers_lose_nothing(database_url: str) -> None:
    url = database_url
    database = Database(url)
    database.upgrade()
    optuna.create_study(study_name="shared", storage=url)
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, url, f"w{n}", str(ROUNDS)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for n in range(WRITERS)
    ]
    outputs = [w.communicate(timeout=300)[0] for w in writers]
    assert [w.returncode for w in writers] == [0] * WRITERS, "\n".join(outputs)

    jobs, count = JobStore(database).list(limit=1000)
    assert count == WRITERS * ROUNDS
    assert {j.name for j in jobs} == {f"w{n}-{i}" for n in range(WRITERS) for i in range(ROUNDS)}
    assert {(j.status, j.trials_done) for j in jobs} == {("succeeded", 1)}
    trials = optuna.load_study(study_name="shared", storage=url).get_trials()
    assert len(trials) == WRITERS * ROUNDS
    assert {t.state for t in trials} == {TrialState.COMPLETE}
    assert sorted(t.number for t in trials) == list(range(WRITERS * ROUNDS))
    assert {t.user_attrs["writer"] for t in trials} == {f"w{n}" for n in range(WRITERS)}
    database.dispose()
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as check:
            assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)
