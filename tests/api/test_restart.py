"""A server killed mid-job (kill -9), then one stopped cleanly mid-job: each time the next
server on the same database resumes the job; no finished trial is run again, and the trial
that was running is marked ``interrupted`` and its config run again, exactly once."""

from __future__ import annotations

import json
import time

import optuna
import pytest

from .conftest import MEASURED, TOKEN, Server, submit, train_job, trials_of, wait_for


def _measured(trials: list[dict]) -> dict[int, dict]:
    """The trials that count against the budget (a baseline's re-runs do not)."""
    return {t["number"]: t for t in trials if t["measured"]}


def _launched(trial: dict) -> bool:
    """Running with its config written. A proposal reads ``running`` too, from the moment it
    is asked for until it is told it will not run (a duplicate, invalid, known not to fit),
    config included for the instant between that attribute and the tell; a launched trial
    reads so for seconds (``_wait_mid_trial`` looks twice)."""
    return trial["status"] == "running" and bool(trial["config"])


def _wait_mid_trial(server: Server, job_id: str, measured_at_least: int) -> dict[int, dict]:
    """Wait until the job has measured enough trials and runs another; return the trials,
    only those launched in two looks 0.3 s apart reading ``running`` (a proposal seen in the
    instant before it is told is not one)."""
    deadline = time.monotonic() + 180
    before: dict[int, dict] = {}
    with server.client() as api:
        while time.monotonic() < deadline:
            trials = {t["number"]: t for t in trials_of(api, job_id)}
            steady = {n for n, t in trials.items() if _launched(t) and n in before and _launched(before[n])}
            if len(_measured(list(trials.values()))) >= measured_at_least and steady:
                return {n: t for n, t in trials.items() if not _launched(t) or n in steady}
            before = trials
            time.sleep(0.3)
    raise AssertionError(
        f"job {job_id} never had {measured_at_least} trials measured and one running:\n{server.log()}"
    )


@pytest.mark.slow
def test_a_job_survives_kill_9_and_a_clean_shutdown(tmp_path) -> None:
    def new_server(name: str) -> Server:
        return Server(tmp_path / "data", tmp_path / f"{name}.log", AUTOTUNER_API_TOKEN=TOKEN)

    first = new_server("first").start()
    try:
        with first.client() as api:
            job_id = submit(api, train_job(name="survivor", budget={"max_trials": 4, "baseline_runs": 3}))
        seen = _wait_mid_trial(first, job_id, 1)
    finally:
        first.kill()
    killed_running = [n for n, t in seen.items() if _launched(t)]
    measured_before = _measured(list(seen.values()))

    second = new_server("second").start()
    try:
        with second.client() as api:
            # Left running by a dead pid on this host: released, claimed, resumed at once.
            wait_for(api, job_id, lambda j: j["status"] == "running", 60, "running again")
        seen = _wait_mid_trial(second, job_id, len(measured_before) + 1)
        second.stop()  # SIGTERM: the running trial is cancelled, the job requeued
    finally:
        second.kill()
    shutdown_running = [n for n, t in seen.items() if _launched(t) and n not in killed_running]
    assert "job " + job_id + ": service shutting down" in (tmp_path / "second.log").read_text()

    third = new_server("third").start()
    try:
        with third.client() as api:
            job = wait_for(api, job_id, lambda j: j["status"] in ("succeeded", "failed"), 240, "finished")
            trials = trials_of(api, job_id)
    finally:
        third.stop()

    assert job["status"] == "succeeded", (job, trials)
    assert job["trials_done"] == 4 and job["stop_reason"] == "reached max_trials (4)"
    measured = _measured(trials)
    assert len(measured) == 4, trials
    configs = [json.dumps(t["config"], sort_keys=True) for t in measured.values()]
    assert len(set(configs)) == len(configs), "a measured config ran twice"
    for number, before in measured_before.items():  # finished before the kill: untouched
        assert measured[number]["metrics"] == before["metrics"]
        assert measured[number]["config"] == before["config"]
    by_number = {t["number"]: t for t in trials}
    # The trials cut short (by the kill, by the shutdown) are interrupted, not measured;
    # a trial that finished in the instant before the stop is measured instead.
    for number in killed_running + shutdown_running:
        assert by_number[number]["status"] in ("interrupted", *MEASURED), by_number[number]
    interrupted = [n for n in killed_running + shutdown_running if by_number[n]["status"] == "interrupted"]
    assert interrupted
    # Each interrupted trial's config ran again once, later, to an outcome; a retry is a
    # trial of its own (it counts against the budget) and no retry is retried.
    study = optuna.load_study(
        study_name=f"job-{job_id}", storage=f"sqlite:///{tmp_path / 'data' / 'autotuner.db'}"
    )
    retry_of = {t.number: t.user_attrs["retry_of"] for t in study.get_trials() if "retry_of" in t.user_attrs}
    # (every interrupted trial: a proposal not yet launched when the stop came is one too;
    # an interrupted re-run of a baseline is made up by the end's round, not retried)
    every_interrupted = [
        n for n, t in by_number.items() if t["status"] == "interrupted" and t["repeat_of"] is None
    ]
    assert sorted(retry_of.values()) == sorted(every_interrupted), (retry_of, every_interrupted)
    for retry, original in retry_of.items():
        assert retry > original and retry in measured, (retry, by_number[retry])
        assert by_number[retry]["config"] == by_number[original]["config"]
    assert not [t for t in trials if t["status"] in ("running", "queued")]
