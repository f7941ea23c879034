"""API schemas: what the service accepts and returns, separate from the table models.

Lists are ``{data, count}``: ``count`` is the number of items matching the filter, of
which ``data`` is the requested page.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from autotuner.noise import Verdict
from autotuner.records import TrialRecord, TrialStatus
from autotuner.spec import JobSpec
from autotuner.summary import JobSummary, Runs, runs_of, summarize
from autotuner.verl_results import VerlVerdict
from storage import JobRecord, JobStatus
from trials.metrics import PEAK_MEMORY, THROUGHPUT

T = TypeVar("T")


class JobCreate(JobSpec):
    """The body of ``POST /v1/jobs``: a job spec, as JSON or as YAML
    (``Content-Type: application/yaml``)."""

    model_config = ConfigDict(title="JobCreate")


class Page(BaseModel, Generic[T]):
    data: list[T]
    count: int = Field(description="Items matching the filter (all pages).")


class JobCreated(BaseModel):
    id: str = Field(description="The job's id.")
    url: str = Field(description="Where to watch it (also the Location header).")
    status: JobStatus


class RunsPublic(BaseModel):
    """A trial's step throughput over its runs (its own and its re-measurements): median,
    spread and n, as every reported throughput carries them."""

    runs: int = Field(description="How many times the config was measured.")
    median: float = Field(description="Median throughput (tokens/s/GPU); a failed run counts as 0.")
    low: float
    high: float
    spread_pct: float | None = Field(description="(high - low) / median, in percent; None for one run.")

    @classmethod
    def of(cls, runs: Runs | None) -> RunsPublic | None:
        if runs is None or runs.n < 1:
            return None
        return cls(runs=runs.n, median=runs.median, low=runs.low, high=runs.high, spread_pct=runs.spread_pct)


class VerlPublic(BaseModel):
    """What verl itself measured for a trial (``autotuner.verification``): its runs, interleaved
    with the other verified configs, each of >= 3 measured steps after a warm-up."""

    status: str = Field(description="ok when at least one run finished; else the last run's status.")
    runs: int = Field(description="Runs of the config in verl.")
    ok_runs: int = Field(description="Runs that finished.")
    throughput_median: float | None = Field(
        description="Median over the finished runs of verl's perf/throughput (tokens/s/GPU; "
        "each run's figure is the median of its measured steps)."
    )
    throughput_low: float | None
    throughput_high: float | None
    spread_pct: float | None = Field(description="(high - low) / median, in percent; None below 2 runs.")
    steps: int = Field(
        default=0,
        description="Measured steps (after each run's warm-up) of the finished runs; each step "
        "runs the batch the trials ran, so they repeat one measurement.",
    )
    steps_spread_pct: float | None = Field(
        default=None, description="(high - low) / median of the steps' perf/throughput, in percent."
    )
    noise_pct: float | None = Field(
        default=None,
        description="The wider of spread_pct and steps_spread_pct: the band this figure is "
        "compared within (with budget.noise_band_pct as its floor).",
    )
    phase_spread_pct: dict[str, float] = Field(
        default_factory=dict,
        description="verl's own spread over its measured steps, per phase of "
        "prediction_error_pct (and step, throughput): a trial's error inside it is inside "
        "verl's noise.",
    )
    medians: dict[str, float] = Field(
        description="verl's perf/throughput, timing_s/step, timing_s/gen, timing_s/old_log_prob, "
        "timing_s/ref, timing_s/update_actor and timing_s/update_weights (the engine woken and "
        "the weight sync): "
        "medians over the finished runs."
    )
    peak_memory_gb: dict[str, float] = Field(
        description="perf/max_memory_allocated_gb and perf/max_memory_reserved_gb: the largest of the runs."
    )
    versions: dict[str, str] = Field(description="verl, the engine, torch and transformers as verl ran them.")
    device: str
    prediction_error_pct: dict[str, float] = Field(
        description="(trial - verl) / verl in percent: per phase (rollout, old_log_prob, "
        "ref_log_prob, update_actor, weight_sync: the trial's weight sync and engine wake against "
        "verl's update_weights), the step time (step) and step throughput "
        "(throughput)."
    )
    error: str | None = Field(default=None, description="The last failed run's error.")

    @classmethod
    def of(cls, summary: dict[str, Any] | None) -> VerlPublic | None:
        return None if summary is None else cls(**{k: v for k, v in summary.items() if k != "trial"})


class VerlPickPublic(BaseModel):
    """The winner verl picked, judged inside verl's noise (``autotuner.verl_results``)."""

    trial: int
    over_defaults: float | None = Field(
        description="Its verl-measured median over verl's defaults' (both verified); None otherwise."
    )
    verdict: Literal["faster", "slower", "tie"] | None = Field(
        description="Against verl's defaults in verl: a tie when the gap is inside band_pct."
    )
    band_pct: float | None = Field(
        description="The band it was judged in: the wider of the two verl noises, at least "
        "budget.noise_band_pct."
    )
    tied_with: list[int] = Field(
        description="Other verified trials whose verl median is inside the band of the winner's."
    )
    tie_band_pct: float | None = Field(description="The widest band of those ties; None without one.")
    summary: str = Field(description="The same in words, as the CLI and the job's page say it.")

    @classmethod
    def of(cls, summary: JobSummary) -> VerlPickPublic | None:
        parts = summary.verl_verdicts()
        if not parts or summary.best is None:
            return None
        versus_defaults = summary.best != summary.baseline  # the defaults' own pick is no gain
        return cls(
            trial=summary.best,
            over_defaults=summary.verl_gain_over_baseline if versus_defaults else None,
            verdict=summary.verl_gain_verdict if versus_defaults else None,  # type: ignore[arg-type]
            band_pct=summary.verl_gain_band_pct if versus_defaults else None,
            tied_with=summary.verl_tied_with,
            tie_band_pct=summary.verl_tie_band_pct,
            summary="; ".join(parts),
        )


class BestTrialPublic(BaseModel):
    """The winner so far: the fastest feasible trial, or, once finalists were re-measured,
    the one with the best median (ties inside the noise band go to less memory)."""

    number: int
    throughput_tokens_per_s_per_gpu: float | None = Field(
        description="Its median throughput when re-measured, else its one measurement."
    )
    peak_memory_gib: float | None
    device: str = Field(description="The device the figures come from.")
    runs: RunsPublic | None = Field(default=None, description="Its runs: median, spread and n.")
    picked_by: Literal["verl", "trials"] = Field(
        default="trials",
        description="verl: the best verl-measured median among the trials verified in verl; "
        "trials: the trials' own figures (no verified run finished).",
    )
    verl: VerlPublic | None = Field(default=None, description="What verl measured for it, if verified.")

    @classmethod
    def of(
        cls,
        best: TrialRecord,
        runs: Runs | None,
        picked_by: str = "trials",
        verl: dict[str, Any] | None = None,
    ) -> BestTrialPublic:
        many = runs is not None and runs.n >= 2
        return cls(
            number=best.number,
            throughput_tokens_per_s_per_gpu=runs.median if many and runs else best.metric(THROUGHPUT),
            peak_memory_gib=best.metric(PEAK_MEMORY),
            device=best.device,
            runs=RunsPublic.of(runs),
            picked_by=picked_by,  # type: ignore[arg-type]
            verl=VerlPublic.of(verl),
        )


class NoisePublic(BaseModel):
    """The job's measurement noise, from its baselines' repeats (``autotuner.noise``)."""

    measured_pct: float | None = Field(
        description="The baselines' spreads over their runs, pooled (%); None: no baseline ran twice yet."
    )
    floor_pct: float = Field(description="budget.noise_band_pct: the noise assumed before any is measured.")
    band_pct: float = Field(description="The tie band (%): the larger of the two.")
    baselines: int = Field(description="Baselines with two runs or more.")
    runs: int = Field(description="Their runs in all.")


class BaselinePublic(BaseModel):
    """A baseline of the job against the winner: a gain only outside the tie band."""

    name: str
    trial: int
    status: TrialStatus
    throughput: RunsPublic | None = Field(description="Its runs (tokens/s/GPU): median, spread and n.")
    best_over_baseline: float | None = Field(description="The winner's median over this one's.")
    verdict: Verdict | None = Field(
        description="The winner against it: faster, slower, or tie (the difference is inside the band)."
    )
    tie_band_pct: float = Field(description="The band this comparison used (%).")


class JobPublic(BaseModel):
    id: str
    name: str
    status: JobStatus
    url: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    trials_done: int = Field(description="Trials measured (ok, oom, error or timeout).")
    trials_total: int = Field(description="The job's budget.max_trials.")
    cancel_requested: bool
    stop_reason: str | None
    error: str | None
    elapsed_s: float | None = Field(description="Since the job first started; None if queued.")
    eta_s: float | None = Field(description="Estimated time to finish; None unless running.")
    best: BestTrialPublic | None
    verl_pick: VerlPickPublic | None = Field(
        default=None,
        description="When verl picked the winner: it against verl's defaults and the other "
        "verified trials, inside verl's noise.",
    )
    noise: NoisePublic | None = Field(default=None, description="The job's measured noise and tie band.")
    baselines: list[BaselinePublic] = Field(
        default_factory=list, description="Its baselines against the winner, ties called as ties."
    )
    gpu_seconds: float | None = Field(
        default=None, description="What its runs cost so far: each run's wall time x its GPUs."
    )
    gpu_seconds_to_best: float | None = Field(
        default=None,
        description="What it had cost when the winner's first run ended: the GPU-seconds of the runs "
        "numbered up to it (runs are numbered as they start).",
    )
    first_tied: int | None = Field(
        default=None,
        description="The earliest trial whose median throughput is inside the tie band of the winner's "
        "(the winner itself when none ran before it): a config the noise cannot tell from the winner.",
    )
    gpu_seconds_to_tie: float | None = Field(
        default=None,
        description="What it had cost when first_tied's first run ended, counted as gpu_seconds_to_best.",
    )
    first_tied_proposed: int | None = Field(
        default=None,
        description="first_tied among the search's own trials, verl's baselines left out (differs "
        "from first_tied where a baseline ties the winner; null if the winner is a baseline none ties).",
    )
    gpu_seconds_to_tie_proposed: float | None = Field(
        default=None,
        description="What it had cost when first_tied_proposed's first run ended, counted as "
        "gpu_seconds_to_best.",
    )
    hosts: dict[str, int] = Field(
        default_factory=dict,
        description="The runs (trials and re-measurements) by the kind of host they ran on "
        "(processor model and CPU counts, as each trial's software records them). More than "
        "one kind: configs measured on different kinds compare across hosts, whose speeds can "
        "differ.",
    )
    spec: dict[str, Any] | None = Field(
        description="The job spec as stored (validated; a list of lengths kept as its distinct "
        "lengths and their counts). A listing of jobs leaves it out (null): GET the job for it."
    )

    @classmethod
    def of(
        cls,
        job: JobRecord,
        url: str,
        records: list[TrialRecord],
        best: TrialRecord | None,
        now: datetime | None = None,
        spec: JobSpec | None = None,
        picked_by: str = "trials",
        verl: dict[int, dict[str, Any]] | None = None,
        listed: bool = False,
        verdicts: dict[int, VerlVerdict] | None = None,
    ) -> JobPublic:
        """The job; with its ``spec``, its noise and its baselines against the winner too, and
        with its ``verdicts`` (verl's runs), the winner verl picked inside verl's noise.
        ``listed``: as a listing shows it, without the stored spec (whose size is the
        submitter's)."""
        now = now or datetime.now(timezone.utc)
        done = sum(1 for r in records if r.measured)
        elapsed = None
        if job.started_at is not None:
            elapsed = ((job.finished_at or now) - job.started_at).total_seconds()
        eta = None
        if job.status == "running" and elapsed is not None and done:
            eta = elapsed / done * max(job.trials_total - done, 0)
        runs = runs_of(records)
        noise, baselines, cost, cost_to_best, tied, cost_to_tie = None, [], None, None, None, None
        own, cost_to_own, hosts, verl_pick = None, None, {}, None
        if spec is not None:
            summary = summarize(spec, records, "", verdicts)
            verl_pick = VerlPickPublic.of(summary)
            hosts = summary.hosts
            cost, cost_to_best = summary.gpu_seconds, summary.gpu_seconds_to_best
            tied, cost_to_tie = summary.first_tied, summary.gpu_seconds_to_tie
            own, cost_to_own = summary.first_tied_proposed, summary.gpu_seconds_to_tie_proposed
            noise = NoisePublic(
                measured_pct=summary.noise_pct,
                floor_pct=summary.noise_band_pct,
                band_pct=summary.tie_band_pct,
                baselines=summary.noise_baselines,
                runs=summary.noise_runs,
            )
            baselines = [
                BaselinePublic(
                    name=name,
                    trial=b["trial"],
                    status=b["status"],
                    throughput=RunsPublic.of(runs.get(b["trial"])),
                    best_over_baseline=b["gain_of_best"],
                    verdict=b["verdict"],
                    tie_band_pct=b["tie_band_pct"],
                )
                for name, b in summary.baselines.items()
            ]
        return cls(
            id=job.id,
            name=job.name,
            status=job.status,
            url=url,  # type: ignore[arg-type]
            created_at=job.created_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            trials_done=done,
            trials_total=job.trials_total,
            cancel_requested=job.cancel_requested,
            stop_reason=job.stop_reason,
            error=job.error,
            elapsed_s=elapsed,
            eta_s=eta,
            best=None
            if best is None
            else BestTrialPublic.of(best, runs.get(best.number), picked_by, (verl or {}).get(best.number)),
            verl_pick=verl_pick,
            noise=noise,
            baselines=baselines,
            gpu_seconds=cost,
            gpu_seconds_to_best=cost_to_best,
            first_tied=tied,
            gpu_seconds_to_tie=cost_to_tie,
            first_tied_proposed=own,
            gpu_seconds_to_tie_proposed=cost_to_own,
            hosts=hosts,
            spec=None if listed else json.loads(job.spec_json),
        )


class TrialPublic(BaseModel):
    number: int
    status: TrialStatus = Field(
        description="ok, oom, error, timeout (measured); invalid, duplicate, "
        "predicted_oom, inferred_oom (never run); infra_error, cancelled, interrupted, "
        "running or queued."
    )
    feasible: bool = Field(description="Measured successfully (status ok).")
    measured: bool = Field(description="Ran on hardware to an outcome; counts against the budget.")
    skipped: bool = Field(
        default=False,
        description="Not run: predicted_oom (the memory model) or "
        "inferred_oom (a measured OOM no larger in any memory knob).",
    )
    config: dict[str, Any] = Field(description="The trial's knobs, keyed by verl path.")
    metrics: dict[str, float] = Field(description="Everything the trial measured.")
    phase_timings_s: dict[str, float]
    phase: str | None = Field(description="The phase it reached (or failed in).")
    error_type: str | None
    error_message: str | None
    device: str
    hostname: str = Field(default="", description='The host that ran it ("": not recorded).')
    node: str = Field(
        default="",
        description="The Ray node that ran it, on a cluster whose "
        'nodes may share a host name ("": not recorded).',
    )
    software: dict[str, str] = Field(
        default_factory=dict,
        description="What measured it: package versions (torch, transformers, the engine, "
        "flash-attn, verl), the actor's attention kernel, CUDA, the driver and the GPU "
        "({}: not recorded).",
    )
    timing_lines: list[str] = Field(
        default_factory=list,
        description="The engine's own log lines timing its start-up, sleep and wake, timestamped.",
    )
    values: list[float] | None = Field(description="Objective values told to the study.")
    baseline: str | None = Field(description="Set on the trial that runs verl's defaults.")
    duplicate_of: int | None
    wall_s: float
    repeat_of: int | None = Field(
        default=None,
        description="Set on a finalist's re-measurement: "
        "the trial it measures again (not counted against the budget).",
    )
    retry_of: int | None = Field(
        default=None,
        description="Set on the re-run of an interrupted "
        "trial (its tuner stopped while it ran): the trial it runs again.",
    )
    composed_from: list[int] | None = Field(
        default=None,
        description="Run as a phase "
        "composition: [the trial whose rollout side, the "
        "trial whose train side] predicted it fastest.",
    )
    explores_with: int | None = Field(
        default=None,
        description="Run to try a new rollout setting: the trial whose train side it was paired with.",
    )
    trains_behind: int | None = Field(
        default=None,
        description="Run to try a train side the sampler chose: the trial whose rollout it "
        "runs behind (that rollout reused).",
    )
    inferred_from: int | None = Field(
        default=None, description="inferred_oom: the measured OOM that rules it out."
    )
    predicted_memory_gib: dict[str, float] = Field(
        default_factory=dict,
        description="The memory model's peak per phase, predicted before the trial ran (GiB).",
    )
    memory_error_gib: dict[str, float] = Field(
        default_factory=dict, description="Measured minus predicted, per phase measured (GiB)."
    )
    runs: RunsPublic | None = Field(
        default=None,
        description="Its throughput over its runs (median, spread and n; re-measured finalists and "
        "baselines have several); None unless it ran to a throughput.",
    )
    verl: VerlPublic | None = Field(
        default=None, description="What verl itself measured for its config, when it was verified in verl."
    )

    @classmethod
    def of(cls, r: TrialRecord, runs: Runs | None = None, verl: dict[str, Any] | None = None) -> TrialPublic:
        return cls(
            number=r.number,
            status=r.status,
            feasible=r.feasible,
            measured=r.measured,
            skipped=r.skipped,
            config=r.config,
            metrics=r.metrics,
            phase_timings_s=r.phase_timings_s,
            phase=r.phase,
            error_type=r.error_type,
            error_message=r.error_message,
            device=r.device,
            hostname=r.hostname,
            node=r.node,
            software=r.software,
            timing_lines=r.timing_lines,
            values=r.values,
            baseline=r.baseline,
            duplicate_of=r.duplicate_of,
            wall_s=r.wall_s,
            repeat_of=r.repeat_of,
            retry_of=r.retry_of,
            inferred_from=r.inferred_from,
            composed_from=r.composed_from,
            explores_with=r.explores_with,
            trains_behind=r.trains_behind,
            predicted_memory_gib=r.predicted_memory_gib,
            memory_error_gib=r.memory_error_gib,
            runs=RunsPublic.of(runs),
            verl=VerlPublic.of(verl),
        )


class ObjectivePublic(BaseModel):
    metric: str
    direction: Literal["maximize", "minimize"]


class ParetoPointPublic(BaseModel):
    """A feasible trial that no other feasible trial beats on every objective of the job."""

    number: int
    objectives: dict[str, float] = Field(description="The job's objective metrics.")
    metrics: dict[str, float]
    config: dict[str, Any]
    device: str
    runs: RunsPublic | None = Field(
        default=None, description="Its throughput over its runs: median, spread and n."
    )

    @classmethod
    def of(cls, r: TrialRecord, metrics: Sequence[str], runs: Runs | None = None) -> ParetoPointPublic:
        return cls(
            number=r.number,
            objectives={m: float(r.metrics[m]) for m in metrics},
            metrics=r.metrics,
            config=r.config,
            device=r.device,
            runs=RunsPublic.of(runs),
        )


class ParetoPublic(Page[ParetoPointPublic]):
    objectives: list[ObjectivePublic]


class GpuPublic(BaseModel):
    index: int
    name: str
    memory_gib: float


class RayPublic(BaseModel):
    address: str | None = Field(description="The Ray cluster; None for the service's local Ray.")
    resources: dict[str, float] = Field(description="Ray's cluster resources (CPU, GPU, ...).")
    gpus: float


class HardwarePublic(BaseModel):
    ray: RayPublic | None
    ray_error: str | None = None
    host_gpus: list[GpuPublic] = Field(description="NVIDIA GPUs of the service's host (NVML).")
    host_cpu: str


class HealthPublic(BaseModel):
    status: Literal["ok"]
    database: str
    runner: Literal["running", "stopped"]
    jobs_running: int
