"""Run one stored job end to end: build its space, open its study, drive the trials.

Used by the CLI (a job run in the foreground) and by the service's job runner. The job
row tracks status and progress; the Optuna study on the same database holds the trials,
so a job whose process died resumes where it stopped.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Literal

import optuna
import ray

from autotuner import hardware
from autotuner.capacity import check_device, host_memory_gib
from autotuner.errors import AutotunerError, EngineUnavailableError, JobBusyError
from autotuner.executor import RayExecutor, cluster_resources, ensure_ray
from autotuner.ownership import Ownership
from autotuner.proposals import SearchState
from autotuner.records import TrialRecord, records
from autotuner.recovery import database_unavailable, retry_interrupted
from autotuner.settings import Settings
from autotuner.space import SearchSpace
from autotuner.spec import JobSpec, parse_job_spec
from autotuner.stop import StopKind, job_outcome
from autotuner.study import RunHooks, RunSummary, StudyRunner, open_study, recover_interrupted
from autotuner.summary import JobSummary, summarize
from autotuner.verification import (
    DEFAULT_VERIFIED,
    VERIFY_IN_VERL,
    Launch,
    job_verification,
    resolve_verify_in_verl,
    stored_verdicts,
    verl_cut_env,
    verl_environment,
)
from storage import (
    Database,
    DatabaseUnavailableError,
    JobNotOwnedError,
    JobRecord,
    JobStore,
    VerlRunStore,
)
from trials.launcher import engine_fix, engine_importable
from trials.types import TrialResult
from trials.verl.launch import launch_verl

log = logging.getLogger(__name__)


@functools.cache
def this_host() -> str:
    """The host part of a runner id: the hostname and, where the kernel tells it, its boot id
    (read once: runners claim and heartbeat with it in their loops). Lent machines and
    containers often share a hostname; a pid is only meaningful on the machine (and boot)
    that issued it."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f"{socket.gethostname()}@{f.read().strip()[:8]}"
    except OSError:
        return socket.gethostname()


def runner_id() -> str:
    return f"{this_host()}:{os.getpid()}"


def resolve_device(spec: JobSpec) -> Literal["cuda", "cpu"]:
    if spec.cluster.device != "auto":
        return spec.cluster.device
    return "cuda" if hardware.detect_device() == "cuda" else "cpu"


def memory_cap_gib(spec: JobSpec, device: str, settings: Settings) -> float | None:
    """One device's memory: the job's own figure, else the GPU's, else (on a CPU) the
    service's default; a CPU's never more than the machine has."""
    if device == "cpu":
        return min(spec.cluster.device_memory_gib or settings.cpu_device_memory_gib, host_memory_gib())
    if spec.cluster.device_memory_gib is not None:
        return spec.cluster.device_memory_gib
    gpus = hardware.gpus()
    return min(g.memory_gib for g in gpus) if gpus else None


def cluster_gpus(settings: Settings) -> float | None:
    """The GPUs the trials can have: the Ray cluster's when Ray is up, this host's when the
    trials will run on a local Ray, None (unknown) for a cluster not joined yet."""
    if ray.is_initialized():
        return cluster_resources().get("GPU", 0.0)
    if settings.ray_address:
        return None
    return float(len(hardware.gpus()))


def check_capacity(spec: JobSpec, space: SearchSpace, settings: Settings) -> None:
    """Refuse a job none of whose trials could run on its device (``capacity.check_device``)."""
    check_device(spec, space.arch, space.device, settings.cpu_device_memory_gib, cluster_gpus(settings))


@dataclass
class JobContext:
    settings: Settings
    database: Database
    store: JobStore

    @classmethod
    def open(cls, settings: Settings) -> JobContext:
        database = Database(settings.resolved_database_url)
        database.upgrade()
        # Create Optuna's tables now, once, before any thread opens a study: two threads
        # creating them at once on a fresh database collide on alembic_version.
        optuna.storages.RDBStorage(settings.resolved_database_url).engine.dispose()
        return cls(settings, database, JobStore(database))

    def submit(self, spec: JobSpec) -> JobRecord:
        return self.store.create(spec.name, spec.model_dump_json(), spec.budget.max_trials)

    def submit_once(self, spec: JobSpec, idempotency_key: str, request_sha256: str) -> tuple[JobRecord, bool]:
        """``submit`` under a client's idempotency key (``JobStore.create_once``)."""
        return self.store.create_once(
            spec.name, spec.model_dump_json(), spec.budget.max_trials, idempotency_key, request_sha256
        )

    def spec_of(self, job: JobRecord) -> JobSpec:
        return parse_job_spec(json.loads(job.spec_json))


def build_space(spec: JobSpec, device: Literal["cuda", "cpu"], settings: Settings) -> SearchSpace:
    arch = spec.validate_model(settings.models_dir)
    return SearchSpace.build(spec, arch, device)


def engine_device_problem(spec: JobSpec, device: str) -> str | None:
    """Why the job's rollout engine cannot run on ``device`` (the fix included), or None."""
    if spec.workload.measures_rollout and spec.workload.engine == "sglang" and device != "cuda":
        return (
            f"sglang runs on CUDA GPUs only, and this job's trials run on {device}; use engine "
            "vllm there, or run the job where NVML sees a GPU"
        )
    return None


def check_engine_environment(spec: JobSpec, device: str, settings: Settings) -> None:
    """Refuse, before any trial, a job whose trials could not run its rollout engine.

    Checked where the trials run: on this host when Ray is local (the trials' Python finds
    the engine's package; nothing is imported here); on a Ray cluster each trial's launcher
    checks on its node instead (``TrialLaunchError``, an infrastructure failure).
    """
    engine = spec.workload.engine
    if not spec.workload.measures_rollout:
        return
    wrong_device = engine_device_problem(spec, device)
    if wrong_device is not None:
        raise EngineUnavailableError(f"workload.engine: {wrong_device}")
    if settings.ray_address:
        return
    python = settings.python_for(engine) or sys.executable
    missing = engine_importable(engine, python, settings.trial_env_for(engine))
    if missing is not None:
        raise EngineUnavailableError(f"workload.engine: {missing}; {engine_fix(engine)}")


SHUTDOWN_STOP_REASON = "shutdown"


class _StoppableExecutor(RayExecutor):
    """A RayExecutor whose ``cancel_all`` during a shutdown records nothing: the cancelled
    trials stay RUNNING in the study, so the next runner marks them ``interrupted`` (not
    measured, not counted against the budget) exactly as after a crash."""

    def __init__(
        self,
        shutdown: Callable[[], bool],
        trial_python: str | None = None,
        trial_env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(trial_python=trial_python, trial_env=dict(trial_env or {}))
        self._shutdown = shutdown

    def cancel_all(self) -> list[TrialResult]:
        results = super().cancel_all()
        return [] if self._shutdown() else results


def execute(
    ctx: JobContext, job_id: str, hooks: RunHooks | None = None, shutdown: Callable[[], bool] | None = None
) -> JobSummary:
    """Run (or resume) a job that this process has claimed; record its end in the job row.

    From the first step to the last, a heartbeat thread keeps the job this runner's
    (``ownership.Ownership``). A runner that loses the job (another runner holds it now)
    stops at once: its trials in flight are cancelled without being recorded and the job
    row is left alone; the summary's stop_reason is then ``LOST_STOP_REASON``.

    ``shutdown`` (the service's job runner) is polled with the cancel request: once it is
    true, the trials in flight are cancelled without being recorded and the job goes back
    to the queue, to be resumed by the next runner; the summary's stop_reason is then
    ``SHUTDOWN_STOP_REASON``.

    Trials a dead run left behind are marked ``interrupted`` and their configs run again,
    once (``recovery.retry_interrupted``). Trials that keep failing for one reason stop the
    job as failed, naming it (the study's ``autotuner.breaker``). When the database cannot be
    reached the exception propagates and the job is left running (not failed): the
    service's runner puts it back in the queue once the database answers.
    """
    me = runner_id()
    with Ownership(ctx.store, job_id, me, ctx.settings.heartbeat_s) as ownership:
        stopping = shutdown or (lambda: False)
        run = _Run(ctx, job_id, me, ownership, lambda: stopping() or ownership.lost.is_set())
        return run.execute(hooks or RunHooks())


LOST_STOP_REASON = "ownership lost"


@dataclass
class _Run:
    """One runner's run of one job, owned through ``ownership``."""

    ctx: JobContext
    job_id: str
    me: str
    ownership: Ownership
    stopping: Callable[[], bool]
    verified: int = 0  # budget.verify_in_verl as resolved on this runner

    def execute(self, caller: RunHooks) -> JobSummary:
        ctx, job_id = self.ctx, self.job_id
        hooks = RunHooks(
            on_record=caller.on_record,
            on_start=caller.on_start,
            stop_requested=lambda: caller.stop_requested() or self.stopping(),
        )
        job = ctx.store.get(job_id)
        settings = ctx.settings
        executor: _StoppableExecutor | None = None
        try:
            spec = ctx.spec_of(job)
            engine = spec.workload.engine
            executor = _StoppableExecutor(
                self.stopping,
                trial_python=settings.python_for(engine),
                trial_env=settings.trial_env_for(engine),
            )
            result = self._run(job, spec, executor, hooks)
            if result is None:  # lost during set-up, before the study was touched
                return summarize(spec, [], LOST_STOP_REASON)
        except BaseException as exc:
            if executor is not None and executor.in_flight:  # no trial outlives the run that started it
                executor.cancel_all()
            if self.ownership.held and isinstance(exc, Exception) and not database_unavailable(exc):
                why = str(exc) if isinstance(exc, AutotunerError) else f"{type(exc).__name__}: {exc}"
                self._finish("failed", stop_reason="error", error=why)
            raise
        if not self.ownership.held:
            log.error("job %s: lost to another runner; this run stops without recording its end", job_id)
            return summarize(spec, result.records, LOST_STOP_REASON)
        if (
            result.stop.kind is StopKind.CANCELLED
            and self.stopping()
            and not ctx.store.is_cancel_requested(job_id)
        ):
            ctx.store.release(job_id, self.me)
            log.info("job %s: service shutting down; back in the queue to resume", job_id)
            return summarize(spec, result.records, SHUTDOWN_STOP_REASON)
        verl = stored_verdicts(VerlRunStore(ctx.database), job_id)
        summary = summarize(spec, result.records, result.stop_reason, verl)
        summary.verify_in_verl = self.verified
        status, error = job_outcome(result.stop, found_a_winner=summary.best is not None)
        self._finish(status, result.stop_reason, error, json.dumps(summary.to_dict()))
        return summary

    def _run(
        self, job: JobRecord, spec: JobSpec, executor: _StoppableExecutor, hooks: RunHooks
    ) -> RunSummary | None:
        """Set the run up (space, engine, study, Ray), then drive the study to its end; None
        when the job was lost to another runner before its study was opened."""
        ctx, settings, job_id = self.ctx, self.ctx.settings, self.job_id
        device = resolve_device(spec)
        verl_python = verl_environment(settings) if device == "cuda" and spec.cluster.nnodes == 1 else None
        verified = self.verified = resolve_verify_in_verl(spec, device, settings, lambda _: verl_python)
        space = build_space(spec, device, settings)
        hold_setup(settings, lambda: hooks.stop_requested() or self._cancel_requested())
        check_engine_environment(spec, device, settings)
        if not self.ownership.held:
            log.error("job %s: lost to another runner during its set-up; its study is left alone", job_id)
            return None
        study = open_study(spec, job.study_name, settings.resolved_database_url)
        interrupted = recover_interrupted(study, space)
        if interrupted:
            log.warning(
                "job %s: trials %s were running when the tuner stopped; marked failed", job_id, interrupted
            )
        retried = retry_interrupted(study)
        if retried:
            log.warning("job %s: the configs of interrupted trials %s run again (once)", job_id, retried)
        ensure_ray(settings.ray_address, settings.ray_num_cpus)
        check_capacity(spec, space, settings)
        cpus = cluster_resources().get("CPU", 1.0)
        cap = memory_cap_gib(spec, device, settings)
        runner = StudyRunner(
            spec=spec,
            study=study,
            space=space,
            executor=executor,
            device=device,
            memory_cap_gib=cap,
            cpus_per_trial=max(1.0, cpus // spec.budget.max_concurrent_trials),
            memory_model=StudyRunner.default_memory_model(spec, space, cap),
            verl_cut_env=verl_cut_env(verl_python, settings),
            hooks=_with_progress(
                ctx, job_id, self.me, hooks, already=sum(1 for r in records(study) if r.measured)
            ),
        )
        study.set_user_attr(VERIFY_IN_VERL, verified)  # the default as resolved here
        if verified:
            runner.verification = job_verification(
                VerlRunStore(ctx.database), job_id, spec, space.arch, settings, verified,
                stop_requested=lambda: runner.hooks.stop_requested(),
            )  # fmt: skip
        runner.enqueue_baseline()
        return runner.run()

    def _cancel_requested(self) -> bool:
        """Whether the job's cancel was asked for; False while the database cannot say."""
        try:
            return self.ctx.store.is_cancel_requested(self.job_id)
        except DatabaseUnavailableError:
            return False

    def _finish(
        self, status: str, stop_reason: str | None, error: str | None, result_json: str | None = None
    ) -> None:
        """End the job as this runner's; a job another runner took meanwhile is left to it."""
        try:
            self.ctx.store.finish(
                self.job_id,
                status,
                stop_reason=stop_reason,
                error=error,
                result_json=result_json,
                runner_id=self.me,
            )
        except JobNotOwnedError as exc:
            log.error("job %s: not recording its end (%s): %s", self.job_id, status, exc)


def verify_finished(
    ctx: JobContext,
    job: JobRecord,
    trials: list[int] | None,
    stop_requested: Callable[[], bool],
    launch: Launch = launch_verl,
) -> str | None:
    """Run a finished job's ``trials`` (default: its baselines and its ``budget.verify_in_verl``
    fastest front trials, as resolved when it ran, else ``DEFAULT_VERIFIED``) in verl,
    ``budget.verify_rounds`` more runs each, interleaved, recording each run; a note on what
    was done, None when stopped.

    Raises:
        EngineUnavailableError: the job's trials ran on a CPU, where verl cannot run.
    """
    settings = ctx.settings
    spec = ctx.spec_of(job)
    device = resolve_device(spec)
    if device != "cuda":
        raise EngineUnavailableError(
            f"job {job.id} runs on {device}, where verl cannot run a training step; verify it "
            "on a host whose GPUs NVML sees (cluster.device cuda or auto)"
        )
    space = build_space(spec, device, settings)
    study = open_study(spec, job.study_name, settings.resolved_database_url)
    count = int(study.user_attrs.get(VERIFY_IN_VERL) or DEFAULT_VERIFIED)
    ensure_ray(settings.ray_address, settings.ray_num_cpus)
    verification = job_verification(
        VerlRunStore(ctx.database), job.id, spec, space.arch, settings, count, stop_requested,
        trials=trials, again=True, launch=launch,
    )  # fmt: skip
    return verification.run(SearchState(spec, space, study))


def hold_setup(settings: Settings, stopping: Callable[[], bool]) -> None:
    """Testing aid (``AUTOTUNER_SETUP_GATE``): a job's set-up waits here, after its search
    space is built, until the gate file exists, the run is stopped (a cancel, a shutdown, a
    lost job) or ``setup_gate_timeout_s`` passes, so a test can hold a set-up as long as it
    needs."""
    gate = settings.setup_gate
    if gate is None:
        return
    deadline = time.monotonic() + settings.setup_gate_timeout_s
    log.warning("job set-up held until %s exists (AUTOTUNER_SETUP_GATE)", gate)
    while not gate.exists() and not stopping() and time.monotonic() < deadline:
        time.sleep(0.1)


def _with_progress(ctx: JobContext, job_id: str, me: str, hooks: RunHooks, already: int = 0) -> RunHooks:
    """Wrap the caller's hooks: progress in the job row (``already`` trials measured before
    a resume count too) and cancel requests."""
    state = {"done": already}

    def on_record(record: TrialRecord) -> None:
        if record.measured:
            state["done"] += 1
        try:
            ctx.store.update_progress(job_id, int(state["done"]), runner_id=me)
        except JobNotOwnedError as exc:
            log.error("job %s: progress not recorded: %s", job_id, exc)
        hooks.on_record(record)

    def stop_requested() -> bool:
        try:
            cancel = ctx.store.is_cancel_requested(job_id)
        except DatabaseUnavailableError as exc:
            # A database restart must not cut a trial short: keep polling; the trial's
            # result is told once the database answers (or the job resumes if it does not).
            log.warning("job %s: cannot poll the database (%s); the trials in flight go on", job_id, exc)
            cancel = False
        return cancel or hooks.stop_requested()

    return RunHooks(on_record=on_record, on_start=hooks.on_start, stop_requested=stop_requested)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def take_over(ctx: JobContext, job_id: str) -> JobRecord:
    """Claim a job to resume it here: a queued job, a running one whose runner process on
    this host is gone, or a running one whose runner elsewhere sent no heartbeat for
    ``orphan_after_s`` (presumed dead, as the service presumes: a database copied from a host
    that was lost). A job whose runner is alive here or heartbeating elsewhere is refused."""
    job = ctx.store.get(job_id)
    if job.status == "running" and job.runner_id:
        host, _, pid = job.runner_id.rpartition(":")
        here = host == this_host() and pid.isdigit()
        silent_s = (
            None
            if job.heartbeat_at is None
            else (datetime.now(timezone.utc) - job.heartbeat_at).total_seconds()
        )
        if (here and (int(pid) == os.getpid() or not pid_alive(int(pid)))) or (
            not here and (silent_s is None or silent_s > ctx.settings.orphan_after_s)
        ):
            job = ctx.store.release(job_id, job.runner_id)
        else:
            raise JobBusyError(
                f"job {job_id} is running under {job.runner_id}; stop that process first "
                "(or wait until it has sent no heartbeat for AUTOTUNER_ORPHAN_AFTER_S="
                f"{ctx.settings.orphan_after_s:g} s)"
            )
    if job.status != "queued":
        raise JobBusyError(f"job {job_id} is {job.status}; only queued or orphaned jobs resume")
    return ctx.store.claim(job_id, runner_id())


def recover_orphans(ctx: JobContext, stale_after_s: float) -> list[str]:
    """Put back in the queue the running jobs whose runner is gone; return their ids.

    A runner process on this host that no longer exists is known dead at once (its job is
    released); a runner elsewhere is presumed dead once its heartbeat is older than
    ``stale_after_s`` (``JobStore.requeue_orphans``).
    """
    released = []
    here = this_host()
    for job in _running_jobs(ctx):
        host, _, pid = (job.runner_id or "").rpartition(":")
        if host != here or not pid.isdigit() or int(pid) == os.getpid() or pid_alive(int(pid)):
            continue
        try:
            ctx.store.release(job.id, job.runner_id or "")
        except JobNotOwnedError:
            continue  # it finished or another runner took it meanwhile
        log.warning("job %s: its runner %s is gone; back in the queue", job.id, job.runner_id)
        released.append(job.id)
    return released + ctx.store.requeue_orphans(stale_after_s)


def _running_jobs(ctx: JobContext, page: int = 200) -> list[JobRecord]:
    out: list[JobRecord] = []
    while True:
        rows, count = ctx.store.list(status="running", offset=len(out), limit=page)
        out.extend(rows)
        if not rows or len(out) >= count:
            return out
