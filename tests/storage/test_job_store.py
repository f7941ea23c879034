"""JobStore on SQLite and PostgreSQL: the job lifecycle, one operation at a time."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import optuna
import pytest
from sqlalchemy import update

from storage import (
    Database,
    JobNotFoundError,
    JobNotOwnedError,
    JobRecord,
    JobStateError,
    JobStore,
)
from storage.models import JobRow

SPEC = '{"workload": {"model": "qwen2-0.5b"},  "trials": 8}'  # odd spacing: kept as given


def _running(store: JobStore, name: str = "job", runner_id: str = "runner-1") -> JobRecord:
    job = store.create(name, SPEC, trials_total=8)
    return store.claim(job.id, runner_id)


def _last_heartbeat_ago(database: Database, job_id: str, seconds: float) -> datetime:
    """Set a job's last heartbeat ``seconds`` back, as a runner that stopped long ago left it
    (no test waits for a clock to pass a threshold); return it."""
    when = datetime.now(timezone.utc) - timedelta(seconds=seconds)
    database.run_transaction(
        lambda session: session.execute(update(JobRow).where(JobRow.id == job_id).values(heartbeat_at=when))
    )
    return when


def test_create_then_get_returns_the_stored_job(store: JobStore) -> None:
    before = datetime.now(timezone.utc)

    job = store.create("tune qwen", SPEC, trials_total=8)

    assert store.get(job.id) == job
    assert len(job.id) == 32 and int(job.id, 16) >= 0
    assert (job.name, job.status, job.spec_json) == ("tune qwen", "queued", SPEC)
    assert job.study_name == f"job-{job.id}"
    assert (job.trials_done, job.trials_total, job.cancel_requested) == (0, 8, False)
    assert job.created_at.tzinfo == timezone.utc
    assert before - timedelta(seconds=1) <= job.created_at <= datetime.now(timezone.utc)
    assert (job.started_at, job.finished_at, job.runner_id, job.result_json) == (None,) * 4
    assert not job.is_finished


def test_get_unknown_job_raises_not_found(store: JobStore) -> None:
    with pytest.raises(JobNotFoundError, match="no job with id 'nope'"):
        store.get("nope")


def test_list_pages_newest_first_with_the_total_count(store: JobStore) -> None:
    names = [f"job-{number}" for number in range(5)]
    for name in names:
        store.create(name, SPEC, trials_total=1)

    first_page, count = store.list(limit=2)
    last_page, _ = store.list(offset=4, limit=2)
    everything, _ = store.list()

    assert count == 5
    assert [job.name for job in first_page] == ["job-4", "job-3"]
    assert [job.name for job in last_page] == ["job-0"]
    assert [job.name for job in everything] == names[::-1]
    assert store.list(offset=10) == ([], 5)


def test_list_filters_by_status(store: JobStore) -> None:
    queued = [store.create(f"q{number}", SPEC, trials_total=1) for number in range(3)]
    store.claim(queued[1].id, "runner-1")

    running, running_count = store.list(status="running")
    still_queued, queued_count = store.list(status="queued", limit=1)

    assert ([job.id for job in running], running_count) == ([queued[1].id], 1)
    assert ([job.id for job in still_queued], queued_count) == ([queued[2].id], 2)
    with pytest.raises(ValueError, match="status='paused'"):
        store.list(status="paused")
    with pytest.raises(ValueError):
        store.list(limit=-1)


def test_claim_next_takes_the_oldest_queued_job(store: JobStore) -> None:
    first = store.create("first", SPEC, trials_total=1)
    second = store.create("second", SPEC, trials_total=1)

    claimed = store.claim_next("runner-1", device="NVIDIA H100 80GB HBM3")

    assert claimed is not None and claimed.id == first.id
    assert (claimed.status, claimed.runner_id) == ("running", "runner-1")
    assert claimed.device == "NVIDIA H100 80GB HBM3"
    assert claimed.started_at is not None and claimed.heartbeat_at == claimed.started_at
    assert store.get(first.id) == claimed
    assert store.claim_next("runner-2").id == second.id
    assert store.claim_next("runner-3") is None


def test_claim_of_a_job_that_is_not_queued_is_refused(store: JobStore) -> None:
    job = _running(store)

    with pytest.raises(JobStateError, match="is running, not queued"):
        store.claim(job.id, "runner-2")
    with pytest.raises(JobNotFoundError):
        store.claim("nope", "runner-2")
    assert store.get(job.id).runner_id == "runner-1"


def test_heartbeat_is_accepted_only_from_the_owner(database: Database, store: JobStore) -> None:
    job = _running(store)
    before = _last_heartbeat_ago(database, job.id, 60)

    store.heartbeat(job.id, "runner-1")

    assert store.get(job.id).heartbeat_at > before
    with pytest.raises(JobNotOwnedError, match="owned by 'runner-1', not by 'runner-2'"):
        store.heartbeat(job.id, "runner-2")
    store.finish(job.id, "succeeded")
    with pytest.raises(JobNotOwnedError, match="is succeeded"):
        store.heartbeat(job.id, "runner-1")
    with pytest.raises(JobNotFoundError):
        store.heartbeat("nope", "runner-1")


def test_update_progress_records_trials_and_result(store: JobStore) -> None:
    job = _running(store)
    result = json.dumps({"best_trial": 3, "pareto": [3, 5]})

    store.update_progress(job.id, trials_done=4, result_json=result)
    store.update_progress(job.id, trials_done=5)

    stored = store.get(job.id)
    assert (stored.trials_done, stored.result_json) == (5, result)
    queued = store.create("queued", SPEC, trials_total=1)
    with pytest.raises(JobStateError, match="it is queued, not running"):
        store.update_progress(queued.id, trials_done=1)
    with pytest.raises(ValueError):
        store.update_progress(job.id, trials_done=-1)


def test_finish_records_the_outcome_once(store: JobStore) -> None:
    job = _running(store)
    store.update_progress(job.id, trials_done=8, result_json='{"best_trial": 7}')

    finished = store.finish(job.id, "failed", stop_reason="error", error="CUDA error: boom")

    assert (finished.status, finished.stop_reason, finished.error) == (
        "failed", "error", "CUDA error: boom",
    )  # fmt: skip
    assert finished.result_json == '{"best_trial": 7}'  # kept when no new result is given
    assert finished.finished_at is not None and finished.is_finished
    assert store.get(job.id) == finished
    with pytest.raises(JobStateError, match="already finished as failed"):
        store.finish(job.id, "succeeded")
    with pytest.raises(ValueError, match="status='running'"):
        store.finish(job.id, "running")
    with pytest.raises(JobNotFoundError):
        store.finish("nope", "succeeded")


def test_only_the_owner_ends_or_advances_a_job_it_holds(store: JobStore) -> None:
    job = _running(store, runner_id="runner-1")
    # Requeued as an orphan and claimed by another runner: the first one can no longer end it.
    store.release(job.id, "runner-1")
    store.claim(job.id, "runner-2")
    with pytest.raises(JobNotOwnedError, match="owned by 'runner-2', not by 'runner-1'"):
        store.finish(job.id, "cancelled", runner_id="runner-1")
    with pytest.raises(JobNotOwnedError, match="owned by 'runner-2'"):
        store.update_progress(job.id, 3, runner_id="runner-1")
    assert (store.get(job.id).status, store.get(job.id).trials_done) == ("running", 0)
    store.update_progress(job.id, 2, runner_id="runner-2")
    done = store.finish(job.id, "succeeded", runner_id="runner-2")
    assert (done.status, done.trials_done) == ("succeeded", 2)
    with pytest.raises(JobStateError, match="already finished as succeeded"):
        store.finish(job.id, "failed", runner_id="runner-2")


def test_cancel_of_a_queued_job_takes_effect_at_once(store: JobStore) -> None:
    job = store.create("a", SPEC, trials_total=1)

    cancelled = store.request_cancel(job.id)

    assert (cancelled.status, cancelled.stop_reason) == ("cancelled", "cancelled")
    assert cancelled.finished_at is not None
    assert store.get(job.id) == cancelled
    assert store.claim_next("runner-1") is None


def test_cancel_of_a_running_job_is_a_request_its_runner_sees(store: JobStore) -> None:
    job = _running(store)
    assert store.is_cancel_requested(job.id) is False

    flagged = store.request_cancel(job.id)

    assert (flagged.status, flagged.cancel_requested) == ("running", True)
    assert store.is_cancel_requested(job.id) is True
    store.heartbeat(job.id, "runner-1")  # the runner still owns it until it stops
    finished = store.finish(job.id, "cancelled", stop_reason="cancelled")
    assert store.request_cancel(job.id) == finished  # a finished job is left as it is
    with pytest.raises(JobNotFoundError):
        store.request_cancel("nope")
    with pytest.raises(JobNotFoundError):
        store.is_cancel_requested("nope")


def test_requeue_orphans_returns_jobs_whose_runner_stopped_heartbeating(
    database: Database, store: JobStore
) -> None:
    orphan = _running(store, "orphan", runner_id="dead-runner")
    store.update_progress(orphan.id, trials_done=3)
    alive = _running(store, "alive", runner_id="live-runner")
    cancelled_orphan = _running(store, "cancelled-orphan", runner_id="dead-runner")
    store.request_cancel(cancelled_orphan.id)
    for job in (orphan, cancelled_orphan):  # their runner's last beat: an hour ago
        _last_heartbeat_ago(database, job.id, 3600)
    store.heartbeat(alive.id, "live-runner")

    requeued = store.requeue_orphans(stale_after_s=600)

    assert requeued == [orphan.id]
    assert store.requeue_orphans(stale_after_s=600) == []
    queued = store.get(orphan.id)
    assert (queued.status, queued.runner_id, queued.heartbeat_at) == ("queued", None, None)
    assert store.get(alive.id).status == "running"
    assert store.get(cancelled_orphan.id).status == "cancelled"
    with pytest.raises(JobNotOwnedError):
        store.heartbeat(orphan.id, "dead-runner")
    resumed = store.claim_next("new-runner")
    assert resumed.id == orphan.id
    assert (resumed.trials_done, resumed.started_at) == (3, orphan.started_at)


def test_delete_removes_the_job_and_its_optuna_study(database: Database, store: JobStore) -> None:
    doomed = store.finish(_running(store, "doomed").id, "succeeded")
    kept = store.create("kept", SPEC, trials_total=1)
    for job in (doomed, kept):
        study = optuna.create_study(study_name=job.study_name, storage=database.url)
        study.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=1.0))

    store.delete(doomed.id)

    with pytest.raises(JobNotFoundError):
        store.get(doomed.id)
    assert optuna.get_all_study_names(database.url) == [kept.study_name]
    assert store.list() == ([store.get(kept.id)], 1)
    with pytest.raises(JobNotFoundError):
        store.delete(doomed.id)


def test_delete_of_a_job_without_a_study(store: JobStore) -> None:
    job = store.create("never ran", SPEC, trials_total=1)

    store.delete(job.id)

    assert store.list() == ([], 0)


def test_delete_of_a_running_job_is_refused(database: Database, store: JobStore) -> None:
    job = _running(store)
    optuna.create_study(study_name=job.study_name, storage=database.url)

    with pytest.raises(JobStateError, match="is running: cancel it"):
        store.delete(job.id)

    assert store.get(job.id).status == "running"
    assert optuna.get_all_study_names(database.url) == [job.study_name]
