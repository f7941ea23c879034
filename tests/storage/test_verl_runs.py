"""The verl_runs table on SQLite and PostgreSQL: a job's verl runs are stored beside its
trials, read back in order and intact, refused for an unknown job or status, and deleted
with their job."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import inspect

from storage import Database, JobNotFoundError, JobStore, VerlRunStore

RESULT = {
    "run_id": "r1",
    "status": "ok",
    "measured": {"perf/throughput": 4021.75, "timing_s/gen": 12.5},
    "versions": {"verl": "0.9.1"},
    "log_tail": "step:4 - perf/throughput:np.float64(4021.75)\n" + "x" * 5000,
}


def test_runs_round_trip_in_the_order_they_were_stored(database: Database, store: JobStore) -> None:
    job = store.create("verified", "{}", trials_total=4)
    runs = VerlRunStore(database)
    for round_ in range(2):
        for trial in (3, 0, 7):
            text = json.dumps(RESULT | {"run_id": f"t{trial}-r{round_}"})
            runs.add(job.id, trial, round_, "ok" if trial != 7 else "timeout", text)

    stored = runs.list(job.id)

    assert [(r.trial_number, r.round) for r in stored] == [(3, 0), (0, 0), (7, 0), (3, 1), (0, 1), (7, 1)]
    assert [r.status for r in stored].count("timeout") == 2
    assert json.loads(stored[0].result_json) == RESULT | {"run_id": "t3-r0"}  # all 5000+ chars kept
    assert stored[0].created_at.tzinfo is not None
    assert runs.list(store.create("other", "{}", trials_total=1).id) == []


def test_a_run_of_an_unknown_job_or_status_is_refused(database: Database, store: JobStore) -> None:
    runs = VerlRunStore(database)
    with pytest.raises(JobNotFoundError):
        runs.add("0" * 32, 0, 0, "ok", "{}")
    job = store.create("a", "{}", trials_total=1)
    with pytest.raises(ValueError, match="status='cancelled': must be one of ok, oom, error, timeout"):
        runs.add(job.id, 0, 0, "cancelled", "{}")
    with pytest.raises(ValueError, match="round=-1"):
        runs.add(job.id, 0, -1, "ok", "{}")
    assert runs.list(job.id) == []


def test_runs_are_deleted_with_their_job(database: Database, store: JobStore) -> None:
    kept, deleted = store.create("kept", "{}", trials_total=1), store.create("gone", "{}", trials_total=1)
    runs = VerlRunStore(database)
    runs.add(kept.id, 0, 0, "ok", "{}")
    runs.add(deleted.id, 0, 0, "error", "{}")

    store.delete(deleted.id)

    assert runs.list(deleted.id) == []
    assert [r.job_id for r in runs.list(kept.id)] == [kept.id]
    foreign = inspect(database.engine).get_foreign_keys("verl_runs")
    assert foreign[0]["referred_table"] == "jobs" and foreign[0]["options"].get("ondelete") == "CASCADE"
