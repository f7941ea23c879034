"""Moving a database (the README's "Operating" section): every job and every trial arrives
unchanged, in any state, on SQLite and on PostgreSQL; a non-empty destination is refused."""

from __future__ import annotations

import json

import optuna
import pytest
from optuna.trial import TrialState

from autotuner.dbcopy import copy_database, main
from storage import Database, JobStateError, JobStore

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _source(url: str) -> None:
    """A finished job with trials in every state, a queued job, a running one."""
    database = Database(url)
    database.upgrade()
    store = JobStore(database)
    done, _queued, running = (store.create(n, json.dumps({"name": n}), 3) for n in ("a", "b", "c"))
    store.claim(done.id, "host:1")
    store.update_progress(done.id, 2, result_json='{"best": 1}')
    store.finish(done.id, "failed", stop_reason="circuit breaker: x", error="x")
    store.claim(running.id, "host:2")
    study = optuna.create_study(study_name=done.study_name, storage=url, directions=["maximize", "minimize"])
    ok = study.ask()
    ok.suggest_int("micro", 1, 8)
    ok.set_user_attr("config", {"micro": ok.params["micro"]})
    study.tell(ok, [10.0, 1.5])
    failed = study.ask({"micro": optuna.distributions.IntDistribution(1, 8)})
    failed.set_user_attr("status", "error")
    study.tell(failed, state=TrialState.FAIL)
    study.ask().suggest_int("micro", 1, 8)  # left running: interrupted on resume
    study.enqueue_trial({"micro": 4}, user_attrs={"retry_of": 2})
    database.dispose()


def _trials(url: str, name: str) -> list[tuple]:
    study = optuna.load_study(study_name=name, storage=url)
    return [
        (t.number, t.state, t.params, t.values, t.user_attrs, t.system_attrs, t.distributions)
        for t in study.get_trials()
    ]


def test_a_database_is_copied_whole(tmp_path, database_url) -> None:
    source = f"sqlite:///{tmp_path / 'source.db'}"
    _source(source)
    assert copy_database(source, database_url) == (3, 1)

    before = JobStore(Database(source)).list()[0]
    after = JobStore(Database(database_url)).list()[0]
    assert sorted(after, key=lambda j: j.id) == sorted(before, key=lambda j: j.id)
    name = next(j.study_name for j in before if j.name == "a")
    copied = _trials(database_url, name)
    assert copied == _trials(source, name)
    assert [t[1] for t in copied] == [
        TrialState.COMPLETE,
        TrialState.FAIL,
        TrialState.RUNNING,
        TrialState.WAITING,
    ]
    # A second copy into the same database is refused, and changes nothing.
    with pytest.raises(optuna.exceptions.DuplicatedStudyError):
        copy_database(source, database_url)
    assert len(JobStore(Database(database_url)).list()[0]) == 3


def test_jobs_are_never_merged_into_a_database_that_has_some(tmp_path) -> None:
    source, target = (f"sqlite:///{tmp_path / n}.db" for n in ("s", "t"))
    _source(source)
    other = Database(target)
    other.upgrade()
    JobStore(other).create("theirs", "{}", 1)
    with pytest.raises(JobStateError, match="already holds 1 job"):
        copy_database(source, target)
    assert main([source]) == 2  # usage
