"""What the routes call: one function per endpoint, over the job store and the studies.

Jobs come from ``storage.JobStore``; a job's trials from its Optuna study on the same
database, read through one ``RDBStorage`` shared by the service's threads.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import optuna
from pydantic import ValidationError

from autotuner import hardware
from autotuner.api.errors import ConflictError, InvalidInputError, NotFoundError
from autotuner.api.submission import parse_body, validate_job
from autotuner.errors import AutotunerError
from autotuner.export import to_overrides, to_yaml, verl_config
from autotuner.jobs import JobContext, verify_finished
from autotuner.records import MEMORY_CAP, TrialRecord, record_of
from autotuner.spec import JobSpec, error_loc, read_stored_spec
from autotuner.summary import JobSummary, Runs, best, front, pick, runs_of, summarize, verified_summaries
from autotuner.verification import Launch, stored_verdicts
from autotuner.verl_check import VerlChecker
from autotuner.verl_results import VerlVerdict
from storage import JobRecord, VerlRunStore
from trials.launcher import remove_scratch
from trials.verl.launch import launch_verl

# An Idempotency-Key: 1 to 255 visible ASCII characters (a UUID is the usual choice).
IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,255}")


def check_idempotency_key(value: str) -> str:
    """The header's value, or InvalidInputError naming the header and the fix."""
    if not IDEMPOTENCY_KEY.fullmatch(value):
        raise InvalidInputError.at(
            ["header", "Idempotency-Key"],
            f"Idempotency-Key must be 1 to 255 visible ASCII characters without spaces, got "
            f"{len(value)} character(s) {value[:40]!r}; send a fresh UUID for each new submission",
        )
    return value


@dataclass(frozen=True)
class JobView:
    """A job with its spec, its trials so far and the per-device memory cap they ran under
    (the spec's, else what its runner recorded; None before it ran)."""

    job: JobRecord
    spec: JobSpec
    records: list[TrialRecord]
    memory_cap_gib: float | None = None
    verl: dict[int, VerlVerdict] = field(default_factory=dict)  # trials verified in verl

    @property
    def best(self) -> TrialRecord | None:
        return best(self.spec, self.records, verl=self.verl)

    @property
    def picked_by(self) -> str:
        """verl when the winner is the best verl-measured median, else trials."""
        return pick(self.spec, self.records, verl=self.verl)[2]

    @property
    def summary(self) -> JobSummary:
        """The job's summary from its trials and verl runs as they stand now."""
        return summarize(self.spec, self.records, self.job.stop_reason or str(self.job.status), self.verl)

    @property
    def verified(self) -> dict[int, dict[str, Any]]:
        """Each verified trial's verl verdict as plain data, with its prediction error."""
        return verified_summaries(self.records, self.verl)

    @property
    def runs(self) -> dict[int, Runs]:
        """Every feasible trial's runs, by number (re-measured finalists have several)."""
        return runs_of(self.records)


@dataclass(frozen=True)
class ConfigFile:
    filename: str
    media_type: str
    text: str


log = logging.getLogger(__name__)


class UnreadableJobError(ConflictError):
    """Raised for a job whose stored spec no longer validates (one stored by an older version
    that let a value through the database cannot hold, e.g. an infinite length stored as null):
    it cannot be shown or exported, only deleted."""

    def __init__(self, job_id: str, exc: ValidationError) -> None:
        where = ", ".join(
            ".".join(str(p) for p in error_loc(e)) or "spec" for e in exc.errors(include_url=False)
        )
        super().__init__(
            f"job {job_id}'s stored spec can no longer be read ({where}: {exc.errors()[0]['msg']}); "
            f"it cannot run or be shown: delete it (DELETE /v1/jobs/{job_id}) and submit it again",
            field="job_id",
        )


class JobService:
    """The service's operations. Thread-safe: routes call it from FastAPI's thread pool."""

    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx
        self._trials: optuna.storages.RDBStorage | None = None
        self._verl: VerlChecker | None = None
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            if self._trials is not None:
                self._trials.remove_session()
                self._trials.engine.dispose()
                self._trials = None

    # ------------------------------------------------------------------ jobs

    def submit(
        self, body: bytes, content_type: str | None, idempotency_key: str | None = None
    ) -> tuple[JobRecord, bool]:
        """Validate and queue a job: (the job, True). With an ``Idempotency-Key``, a request
        that repeats an earlier one (same key, same body) gets that job back, (job, False),
        validated and stored once; the same key with another body is a conflict."""
        if idempotency_key is None:
            return self.ctx.submit(validate_job(parse_body(body, content_type), self.ctx.settings)), True
        key = check_idempotency_key(idempotency_key)
        digest = hashlib.sha256(body).hexdigest()
        job = self.ctx.store.by_idempotency_key(key)
        created = False
        if job is None:
            spec = validate_job(parse_body(body, content_type), self.ctx.settings)
            job, created = self.ctx.submit_once(spec, key, digest)
        if job.request_sha256 != digest:
            raise ConflictError(
                f"the Idempotency-Key header {key!r} was sent before with another body (it "
                f"created job {job.id}); send a new Idempotency-Key for a new job, or the same "
                "body to get that job back",
                field="Idempotency-Key",
            )
        return job, created

    def list_jobs(self, status: str | None, offset: int, limit: int) -> tuple[list[JobView], int]:
        """A page of jobs; one whose stored spec cannot be read is left out (and logged), so
        that it cannot take the listing down for every other job."""
        jobs, count = self.ctx.store.list(status=status, offset=offset, limit=limit)
        views = []
        for job in jobs:
            try:
                views.append(self._view(job))
            except UnreadableJobError as exc:
                log.warning("left out of the job list: %s", exc.message)
        return views, count

    def get_job(self, job_id: str) -> JobView:
        return self._view(self.ctx.store.get(job_id))

    def cancel_job(self, job_id: str) -> JobView:
        return self._view(self.ctx.store.request_cancel(job_id))

    def delete_job(self, job_id: str) -> None:
        job = self.ctx.store.get(job_id)
        if job.status == "running":
            raise ConflictError(
                f"job {job_id} is running: cancel it first (POST "
                f"/v1/jobs/{job_id}/cancel), wait until it is cancelled, "
                "then delete it"
            )
        self.ctx.store.delete(job_id)
        remove_scratch(job.study_name)  # what killed trials left on this host

    # ------------------------------------------------------------------ trials

    def trials(
        self, job_id: str, status: str | None, offset: int, limit: int
    ) -> tuple[list[TrialRecord], int, dict[int, Runs], dict[int, dict[str, Any]]]:
        """A page of trials, how many match, the re-measured ones' runs and the verl-verified
        ones' verdicts (by number)."""
        view = self.get_job(job_id)
        every = view.records
        recs = every if status is None else [r for r in every if r.status == status]
        return recs[offset : offset + limit], len(recs), runs_of(every), view.verified

    def verify(
        self,
        job_id: str,
        trials: list[int] | None = None,
        stop_requested: Callable[[], bool] = lambda: False,
        launch: Launch = launch_verl,
    ) -> JobView:
        """Run a finished job's ``trials`` (default: its baselines and fastest front trials) in
        verl, ``budget.verify_rounds`` more runs each, interleaved, and record them here
        (``autotuner.jobs.verify_finished``); the job as it then stands."""
        view = self.get_job(job_id)
        if not view.job.is_finished:
            raise ConflictError(
                f"job {job_id} is {view.job.status}: verify a finished job (its own verification "
                "runs after its search, when budget.verify_in_verl is above 0)"
            )
        known = {r.number: r for r in view.records}
        for number in trials or []:
            if number not in known or not known[number].config:
                raise NotFoundError(
                    f"job {job_id} has no trial {number} with a config; "
                    f"its trials: 0..{len(view.records) - 1}",
                    field="trial",
                )
        verify_finished(self.ctx, view.job, trials, stop_requested, launch)
        return self.get_job(job_id)

    def pareto(self, job_id: str) -> tuple[JobSpec, list[TrialRecord], dict[int, Runs]]:
        """The job's spec, its Pareto front and the front's runs (median, spread, n)."""
        view = self.get_job(job_id)
        return view.spec, front(view.spec, view.records), view.runs

    def best_trial(
        self, job_id: str, max_peak_memory_gib: float | None
    ) -> tuple[TrialRecord, Runs | None, dict[str, Any] | None]:
        """The winner (see ``autotuner.summary``), its runs and its verl verdict."""
        view = self.get_job(job_id)
        chosen = best(view.spec, view.records, max_peak_memory_gib, view.verl)
        if chosen is None:
            cap = (
                f" with peak memory <= {max_peak_memory_gib:g} GiB" if max_peak_memory_gib is not None else ""
            )
            raise NotFoundError(
                f"job {job_id} has no successful trial{cap}"
                f"{'' if view.job.is_finished else ' yet'} ({view.job.status}, "
                f"{sum(1 for r in view.records if r.measured)} trials measured)",
                field="max_peak_memory_gib" if max_peak_memory_gib is not None else None,
            )
        return chosen, runs_of(view.records).get(chosen.number), view.verified.get(chosen.number)

    def trial(self, job_id: str, number: int) -> tuple[JobView, TrialRecord]:
        view = self.get_job(job_id)
        chosen = next((r for r in view.records if r.number == number), None)
        if chosen is None:
            known = f"0..{len(view.records) - 1}" if view.records else "none yet"
            raise NotFoundError(f"job {job_id} has no trial {number}; its trials: {known}", field="number")
        return view, chosen

    def export_config(self, job_id: str, number: int, fmt: Literal["yaml", "overrides"]) -> ConfigFile:
        view, rec = self.trial(job_id, number)
        if not rec.config:
            raise ConflictError(f"trial {number} has no config (status {rec.status})", field="number")
        header: dict[str, Any] = {
            "job": view.job.name,
            "job_id": view.job.id,
            "trial": rec.number,
            "metrics": rec.metrics,
            "device": rec.device,
        }
        runs = runs_of(view.records).get(rec.number)
        if runs is not None and runs.n >= 2:
            header["throughput"] = runs.describe()
        verdict = view.verl.get(rec.number)
        if verdict is not None:
            header["verl"] = f"{verdict.describe()} on {verdict.device() or 'unknown device'}"
        header["verl check"] = self._verl_check(view.spec, rec.config)
        stem = f"{view.job.name}-trial{rec.number}"
        if fmt == "yaml":
            return ConfigFile(f"{stem}.yaml", "application/yaml", to_yaml(rec.config, view.spec, header))
        return ConfigFile(f"{stem}.overrides", "text/plain", to_overrides(rec.config, view.spec, header))

    def _verl_check(self, spec: JobSpec, config: dict[str, Any]) -> str:
        """verl's own check of the config (``autotuner.verl_check``): its header line, or
        VerlRejectedError. The tuner's own checks run first (``export.verl_config``)."""
        verl_config(config, spec)
        try:
            arch = spec.validate_model(self.ctx.settings.models_dir)
        except AutotunerError as exc:
            return f"not run (the job's model cannot be read now: {exc})"
        with self._lock:
            if self._verl is None:
                self._verl = VerlChecker(self.ctx.settings)
        return self._verl.check(spec, arch, config).header

    # ------------------------------------------------------------------ machine

    def hardware(self) -> dict[str, Any]:
        from autotuner.executor import cluster_resources

        out: dict[str, Any] = {
            "host_gpus": [g.__dict__ for g in hardware.gpus()],
            "host_cpu": hardware.describe_cpu(),
            "ray": None,
        }
        try:
            resources = cluster_resources()
        except Exception as exc:  # Ray raises many types when its cluster is gone
            out["ray_error"] = f"{type(exc).__name__}: {exc}"
            return out
        out["ray"] = {
            "address": self.ctx.settings.ray_address,
            "resources": resources,
            "gpus": resources.get("GPU", 0.0),
        }
        return out

    def ping(self) -> None:
        self.ctx.database.ping()

    # ------------------------------------------------------------------ reading studies

    def _view(self, job: JobRecord) -> JobView:
        # The stored spec was validated at submission (its model path resolved then): read it
        # back without resolving the model again, so a moved model file breaks no read.
        try:
            spec = read_stored_spec(job.spec_json)
        except ValidationError as exc:
            raise UnreadableJobError(job.id, exc) from None
        records, attrs = self._study(job.study_name)
        cap = spec.cluster.device_memory_gib
        verl = stored_verdicts(VerlRunStore(self.ctx.database), job.id)
        return JobView(job, spec, records, cap if cap is not None else attrs.get(MEMORY_CAP), verl)

    def _storage(self) -> optuna.storages.RDBStorage:
        with self._lock:
            if self._trials is None:
                self._trials = optuna.storages.RDBStorage(
                    self.ctx.settings.resolved_database_url, engine_kwargs={"pool_pre_ping": True}
                )
            return self._trials

    def _study(self, study_name: str) -> tuple[list[TrialRecord], dict[str, Any]]:
        """The study's trials and its user attributes."""
        storage = self._storage()
        try:
            study_id = storage.get_study_id_from_name(study_name)
        except KeyError:
            return [], {}  # no trial yet: the runner creates the study
        trials = storage.get_all_trials(study_id, deepcopy=False)
        return [record_of(t) for t in trials], storage.get_study_user_attrs(study_id)
