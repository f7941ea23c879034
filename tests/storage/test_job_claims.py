"""Several runners, each with its own connection pool, claim from one queue at once."""

from __future__ import annotations

import threading
from collections import Counter

from storage import Database, JobStore

RUNNERS = 4
JOBS = 10


def test_every_job_is_claimed_exactly_once(database_url: str, store: JobStore) -> None:
    job_ids = [store.create(f"job-{number}", "{}", trials_total=1).id for number in range(JOBS)]
    claims: dict[str, list[str]] = {f"runner-{number}": [] for number in range(RUNNERS)}
    failures: list[BaseException] = []
    start = threading.Barrier(RUNNERS)

    def run(runner_id: str) -> None:
        database = Database(database_url)
        runner_store = JobStore(database)
        try:
            start.wait()
            while (job := runner_store.claim_next(runner_id)) is not None:
                claims[runner_id].append(job.id)
        except BaseException as error:  # reported by the assertion below
            failures.append(error)
        finally:
            database.dispose()

    threads = [threading.Thread(target=run, args=(runner_id,)) for runner_id in claims]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert failures == []
    claimed = Counter(job_id for runner_claims in claims.values() for job_id in runner_claims)
    assert claimed == Counter(job_ids), "each job must be claimed once and only once"
    for runner_id, runner_claims in claims.items():
        assert all(store.get(job_id).runner_id == runner_id for job_id in runner_claims)
    assert store.list(status="running")[1] == JOBS
