"""After a failure outside the configs: interrupted trials run again once; the same error
over and over stops the job naming it; a lost database is told apart from a bug."""

from __future__ import annotations

import sqlite3
import subprocess

import optuna
import pytest
from optuna.trial import TrialState
from sqlalchemy import create_engine, text
from sqlalchemy import exc as sa_exc

from autotuner.jobs import JobContext, execute, runner_id
from autotuner.knobs import R
from autotuner.records import records
from autotuner.recovery import (
    RETRY_OF,
    SAME_ERROR_IN_A_ROW,
    RepeatedErrorBreaker,
    database_unavailable,
    retry_interrupted,
)
from autotuner.settings import Settings
from autotuner.space import SearchSpace
from autotuner.spec import parse_job_spec
from autotuner.study import recover_interrupted
from storage import Database, DatabaseLockedError, DatabaseUnavailableError, JobStore

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _study(tmp_path) -> optuna.Study:
    return optuna.create_study(
        study_name="s", storage=f"sqlite:///{tmp_path / 'o.db'}", directions=["maximize"]
    )


def _cut_off(study: optuna.Study, x: int, **attrs) -> int:
    """A trial that was running (config chosen) when its process died."""
    trial = study.ask()
    trial.suggest_int("x", x, x)
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    return trial.number


def test_an_interrupted_trial_runs_again_exactly_once(tmp_path) -> None:
    study = _study(tmp_path)
    done = study.ask()
    done.suggest_int("x", 1, 1)
    study.tell(done, 1.0)
    first = _cut_off(study, 2, baseline="verl-v0.9-defaults")
    study.ask()  # cut off before its config was chosen: nothing to retry

    assert len(recover_interrupted(study)) == 2
    assert retry_interrupted(study) == [first]
    assert retry_interrupted(study) == []  # a second resume does not enqueue it again

    retry = study.ask()
    assert retry.suggest_int("x", 0, 9) == 2
    assert retry.user_attrs == {RETRY_OF: first, "baseline": "verl-v0.9-defaults"}
    # The retry is cut off too: it is not retried in turn.
    recover_interrupted(study)
    assert retry_interrupted(study) == []
    states = [t.state for t in study.get_trials()]
    assert TrialState.WAITING not in states and TrialState.RUNNING not in states


def _train_space(tmp_path, search: dict) -> SearchSpace:
    """The search space of a train-only tiny job over ``search``."""
    from autotuner.jobs import build_space

    spec = parse_job_spec(
        {
            "name": "cut-off",
            "workload": {
                "model": "tiny",
                "dtype": "float32",
                "phases": "train",
                "prompt_length": {"kind": "fixed", "value": 16},
                "response_length": {"kind": "fixed", "value": 16},
                "max_prompt_length": 16,
                "max_response_length": 16,
                "train_batch_size": 8,
                "n": 1,
                "ppo_mini_batch_size": 4,
            },
            "cluster": {"device": "cpu", "device_memory_gib": 2},
            "search": search,
        }
    )
    return build_space(spec, "cpu", Settings(data_dir=tmp_path))


def test_an_interrupted_trial_whose_config_was_never_written_gets_it_from_its_params(
    tmp_path,
) -> None:
    space = _train_space(tmp_path, {"actor_rollout_ref.actor.use_dynamic_bsz": False})
    study = _study(tmp_path)
    trial = study.ask()
    params = {path: trial.suggest_categorical(path, values) for path, values in space.searched.items()}
    # the database went away here: no config attribute was written
    assert recover_interrupted(study, space) == [trial.number]
    [record] = records(study)
    assert record.status == "interrupted"
    assert record.config == space.full_config(params) and record.config
    assert space.chosen(params)


def test_a_trial_cut_off_while_its_knobs_were_drawn_chose_no_config_and_is_not_retried(tmp_path) -> None:
    space = _train_space(
        tmp_path,
        {
            "actor_rollout_ref.actor.use_dynamic_bsz": False,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": [1, 2],
            "actor_rollout_ref.model.enable_gradient_checkpointing": [True, False],
        },
    )
    first, *rest = space.searched
    assert rest
    study = _study(tmp_path)
    trial = study.ask()
    params = {first: trial.suggest_categorical(first, space.searched[first])}
    # the database went away here, before the other knobs were drawn
    assert not space.chosen(params)
    assert recover_interrupted(study, space) == [trial.number]
    [record] = records(study)
    assert record.status == "interrupted" and record.config == {}
    assert retry_interrupted(study) == []


def test_the_breaker_counts_identical_errors_in_a_row() -> None:
    from autotuner.records import TrialRecord

    breaker = RepeatedErrorBreaker(limit=3)
    same = TrialRecord(0, "error", error_type="ImportError", error_message="no vllm")
    other = TrialRecord(0, "error", error_type="ImportError", error_message="no sglang")
    for record in (
        same,
        same,
        TrialRecord(0, "ok"),
        same,
        same,
        TrialRecord(0, "infra_error"),
        other,
        same,
        same,
    ):
        breaker.see(record)
        assert not breaker.tripped
    breaker.see(same)
    assert breaker.tripped and "3 trials in a row" in breaker.reason
    assert breaker.reason.endswith("ImportError: no vllm")


def test_every_trial_failing_alike_stops_the_job_as_failed(tmp_path, ray_local) -> None:
    # A broken engine environment: the package is there (the job starts), and every trial
    # fails the same way importing it, a config error each time (not infra).
    broken = tmp_path / "broken-site"
    (broken / "vllm").mkdir(parents=True)
    (broken / "vllm" / "__init__.py").write_text("raise ImportError('this vllm is broken')\n")
    spec = parse_job_spec(
        {
            "name": "broken-engine",
            "workload": {
                "model": "tiny",
                "dtype": "float32",
                "engine": "vllm",
                "phases": "rollout",
                "prompt_length": {"kind": "fixed", "value": 16},
                "response_length": {"kind": "fixed", "value": 16},
                "max_prompt_length": 16,
                "max_response_length": 16,
                "train_batch_size": 8,
                "n": 1,
                "ppo_mini_batch_size": 4,
            },
            "cluster": {"device": "cpu", "device_memory_gib": 2},
            "search": {R + "enforce_eager": True, R + "max_num_seqs": [2, 4, 8, 16, 32, 64]},
            "budget": {"max_trials": 30, "trial_timeout_s": 120},
            "sampler": "random",
            "seed": 0,
        }
    )
    ctx = JobContext.open(
        Settings(data_dir=tmp_path / "data", ray_num_cpus=2, engine_pythonpath={"vllm": str(broken)})
    )
    job = ctx.submit(spec)
    ctx.store.claim(job.id, runner_id())
    summary = execute(ctx, job.id)

    stored = ctx.store.get(job.id)
    assert stored.status == "failed", stored
    assert stored.stop_reason.startswith(
        f"circuit breaker: {SAME_ERROR_IN_A_ROW} trials in a row failed with the same error"
    )
    assert "ImportError: this vllm is broken" in stored.error
    assert summary.stop_reason == stored.stop_reason
    study = optuna.load_study(study_name=job.study_name, storage=ctx.settings.resolved_database_url)
    ran = [r for r in records(study) if r.measured]
    assert [r.status for r in ran] == ["error"] * SAME_ERROR_IN_A_ROW
    ctx.database.dispose()


def test_database_failures_are_told_apart_from_bugs(tmp_path) -> None:
    closed = Database("postgresql+psycopg://u@127.0.0.1:1/db", max_attempts=1)
    with pytest.raises(DatabaseUnavailableError) as ours:
        JobStore(closed).get("0" * 32)
    assert database_unavailable(ours.value)
    # Optuna's storage wraps the driver's error in its own.
    with pytest.raises(Exception) as optunas:
        optuna.load_study(study_name="s", storage="postgresql+psycopg://u@127.0.0.1:1/db")
    assert database_unavailable(optunas.value)

    path = tmp_path / "locked.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN IMMEDIATE")
    engine = create_engine(f"sqlite:///{path}", connect_args={"timeout": 0.05})
    with pytest.raises(sa_exc.OperationalError) as locked, engine.begin() as connection:
        connection.execute(text("INSERT INTO t VALUES (1)"))
    assert database_unavailable(locked.value)
    assert database_unavailable(DatabaseLockedError("locked"))
    holder.execute("ROLLBACK")
    engine.dispose()

    with pytest.raises(sa_exc.IntegrityError) as refused, engine.begin() as connection:
        connection.execute(text("CREATE TABLE u (x PRIMARY KEY)"))
        connection.execute(text("INSERT INTO u VALUES (1), (1)"))
    assert not database_unavailable(refused.value)
    assert not database_unavailable(ValueError("a bug"))
    try:
        raise RuntimeError("raised while handling") from ours.value
    except RuntimeError as chained:
        assert database_unavailable(chained)


def test_root_cause_names_the_innermost_error() -> None:
    from autotuner.recovery import root_cause

    try:
        try:
            raise ConnectionRefusedError("port 1:\n refused")
        except ConnectionRefusedError as inner:
            raise RuntimeError("an exception is raised during the commit") from inner
    except RuntimeError as outer:
        assert root_cause(outer) == "ConnectionRefusedError: port 1: refused"
    assert root_cause(ValueError("x")) == "ValueError: x"


def test_resume_takes_over_a_job_whose_runner_elsewhere_went_silent(tmp_path) -> None:
    """A database copied from a host that was lost: its running job's runner sends no
    heartbeat any more, so ``autotuner resume`` may claim it; one still heartbeating, or a
    live runner on this host, is refused."""
    from datetime import datetime, timedelta, timezone

    from autotuner.errors import JobBusyError
    from autotuner.jobs import take_over
    from storage.models import JobRow

    settings = Settings(data_dir=tmp_path, orphan_after_s=120)
    ctx = JobContext.open(settings)
    spec = parse_job_spec(
        {
            "name": "moved",
            "workload": {"model": "tiny", "train_batch_size": 8, "n": 1, "ppo_mini_batch_size": 4},
            "cluster": {"device": "cpu"},
        }
    )
    job = ctx.submit(spec)
    ctx.store.claim(job.id, "lost-gpu-host:4242")
    ctx.store.heartbeat(job.id, "lost-gpu-host:4242")
    with pytest.raises(JobBusyError, match="lost-gpu-host:4242.*AUTOTUNER_ORPHAN_AFTER_S=120"):
        take_over(ctx, job.id)

    def silent_for(seconds: float) -> None:
        with ctx.database.session() as session:
            row = session.get(JobRow, job.id)
            row.heartbeat_at = datetime.now(timezone.utc) - timedelta(seconds=seconds)

    silent_for(60)  # within orphan_after_s: presumed alive
    with pytest.raises(JobBusyError):
        take_over(ctx, job.id)
    silent_for(600)
    claimed = take_over(ctx, job.id)
    assert claimed.status == "running" and claimed.runner_id == runner_id()

    # A live runner on this host is never taken over, however old its heartbeat.
    other = ctx.submit(spec)
    live = subprocess.Popen(["sleep", "60"])
    try:
        here = f"{runner_id().rpartition(':')[0]}:{live.pid}"
        ctx.store.claim(other.id, here)
        with ctx.database.session() as session:
            session.get(JobRow, other.id).heartbeat_at = datetime.now(timezone.utc) - timedelta(hours=1)
        with pytest.raises(JobBusyError):
            take_over(ctx, other.id)
    finally:
        live.kill()
        live.wait()


def test_resume_on_a_machine_of_the_same_hostname_takes_over_the_silent_job(tmp_path) -> None:
    """Lent GPU hosts share a hostname and start their processes in the same order, so the
    pid in a copied database's runner id can be alive on the new machine (it can be the
    resuming process itself). The runner id carries the machine's boot id, so such a runner
    counts as elsewhere and is judged by its heartbeat; the process's own pid never counts
    as a live runner."""
    import os
    import socket
    from datetime import datetime, timedelta, timezone

    from autotuner.jobs import take_over, this_host
    from storage.models import JobRow

    assert this_host().startswith(socket.gethostname())
    if os.path.exists("/proc/sys/kernel/random/boot_id"):
        assert this_host() != socket.gethostname()  # the boot id tells machines apart
    ctx = JobContext.open(Settings(data_dir=tmp_path, orphan_after_s=120))
    spec = parse_job_spec(
        {
            "name": "copied",
            "workload": {"model": "tiny", "train_batch_size": 8, "n": 1, "ppo_mini_batch_size": 4},
            "cluster": {"device": "cpu"},
        }
    )
    an_hour_ago = datetime.now(timezone.utc) - timedelta(hours=1)
    # An id as another machine of this hostname wrote it (hostname only), naming a pid that
    # is alive here: this process's parent.
    copied = ctx.submit(spec)
    ctx.store.claim(copied.id, f"{socket.gethostname()}:{os.getppid()}")
    # An id of this very machine naming the resuming process itself.
    own = ctx.submit(spec)
    ctx.store.claim(own.id, f"{this_host()}:{os.getpid()}")
    with ctx.database.session() as session:
        for job_id in (copied.id, own.id):
            session.get(JobRow, job_id).heartbeat_at = an_hour_ago
    for job_id in (copied.id, own.id):
        claimed = take_over(ctx, job_id)
        assert claimed.status == "running" and claimed.runner_id == runner_id()
