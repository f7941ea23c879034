"""Two services share one PostgreSQL database, as a cluster's workers do: jobs submitted to
one are claimed by both, each job runs on exactly one of them, and every trial is recorded
exactly once (none lost, none doubled, numbers without gaps)."""

from __future__ import annotations

from collections import Counter

import optuna
import pytest

from storage import Database, JobStore

from .conftest import TOKEN, Server, submit, train_job, trials_of, wait_for

JOBS = 3
TRIALS = 2

pytestmark = pytest.mark.postgres


@pytest.mark.slow
def test_two_services_on_one_postgres_run_every_job_and_trial_once(tmp_path, postgres_url):
    servers = [
        Server(
            tmp_path / f"data{n}",
            tmp_path / f"server{n}.log",
            AUTOTUNER_API_TOKEN=TOKEN,
            AUTOTUNER_DATABASE_URL=postgres_url,
        )
        for n in range(2)
    ]
    try:
        for server in servers:
            server.start()
        with servers[0].client() as api:
            job_ids = [
                submit(api, train_job(name=f"shared-{n}", budget={"max_trials": TRIALS})) for n in range(JOBS)
            ]
            jobs = [
                wait_for(api, job_id, lambda j: j["status"] in ("succeeded", "failed"), 300, "finished")
                for job_id in job_ids
            ]
            trials = {job_id: trials_of(api, job_id) for job_id in job_ids}
    finally:
        for server in servers:
            server.kill()
    assert {j["status"] for j in jobs} == {"succeeded"}, jobs
    database = Database(postgres_url)
    records = {j.id: j for j in JobStore(database).list(limit=100)[0]}
    database.dispose()
    pids = {str(s.proc.pid) for s in servers if s.proc is not None}
    # Each job ran on one of the two services, and both took their share of the queue.
    runners = Counter(records[job_id].runner_id.rsplit(":", 1)[1] for job_id in job_ids)
    assert set(runners) == pids, (runners, pids)
    for job_id in job_ids:
        seen = trials[job_id]
        assert [t["number"] for t in seen] == list(range(len(seen)))  # no gap, no double
        assert sum(t["measured"] for t in seen) == TRIALS, seen
        study = optuna.load_study(study_name=records[job_id].study_name, storage=postgres_url)
        stored = study.get_trials(deepcopy=False)
        assert sorted(t.number for t in stored) == [t["number"] for t in seen]
        assert len({t.user_attrs.get("trial_id") for t in stored}) == len(stored)
