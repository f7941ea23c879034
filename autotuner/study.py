"""The search loop: Optuna ask/tell, trials dispatched to Ray, outcomes told explicitly.

Outcome mapping (Optuna samplers ignore FAIL trials and would propose them again):
- ``ok``: COMPLETE with the objective values, constraint <= 0 (feasible).
- ``oom``/``timeout``: COMPLETE with the worst objective values and constraint > 0,
  so constrained samplers learn the boundary; never re-run.
- ``error``: FAIL with the error kept; never re-run.
- an error outside the config (GPU not clean, Ray worker lost, cancelled): FAIL as
  ``infra_error``; not counted against the budget, may run again; a few in a row stop
  the job (circuit breaker).
- a proposal that breaks a verl rule: FAIL as ``invalid``, never run.
- a proposal equal to an earlier trial's config: told that trial's outcome as
  ``duplicate``, not run again. One equal to a trial in flight is told ``duplicate`` (FAIL)
  too, and the loop asks for nothing more until a result comes in: a small space whose
  configs are all in flight would otherwise fill the study with duplicates and count as
  exhausted while unmeasured configs remain.
- phase composition (``autotuner.compose``, ``budget.compose_phases``): before asking the
  sampler, the unmeasured combination of a measured engine side and a measured actor side
  predicted fastest is queued, when it beats the best measured throughput by more than the
  noise band; it runs like any proposal (screened, deduplicated, its rollout reused).
- a proposal at least as large in every memory knob as a measured OOM (the rest equal):
  ``inferred_oom``; one the memory model predicts to exceed the device by more than the
  job's margin (and no measured success at least as large vouches for): ``predicted_oom``.
  Both are COMPLETE with constraint > 0 like an OOM, never run, and cost nothing.
GPU admission: on CUDA a trial reserves ``trial_gpus`` GPUs (its replica's TP group, or
the world: ``cluster.trial_scope``); the loop dispatches it only when the Ray cluster's GPUs
less this job's trials in flight can hold it (first in, first out), so a trial never waits
in Ray's queue with its deadline running; a trial larger than every node is ``invalid``.
On resume, trials left RUNNING by a dead process are marked ``interrupted`` (FAIL);
finished trials count against the budget and are not repeated.

The loop stops at ``max_trials`` measured trials, ``max_minutes``, an exhausted space (every
config of a listed space measured or known not to fit; for a larger one, 200 proposals in a
row that could not run), or
early once the Pareto front has not improved beyond the noise band for
``patience_trials`` trials (``autotuner.stopping``); then the fastest finalists of the
front are measured again (``remeasure_finalists`` x ``remeasure_runs``: ``repeat_of``
set, outside the trial budget) so the winner is chosen on medians (``autotuner.summary``).
Each run trial records the memory model's prediction made before it ran and the error of
that prediction once measured.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import optuna
from optuna.trial import TrialState

from autotuner.compose import THROUGHPUT, best_composition, explorable, next_engine_side, side_of
from autotuner.executor import Executor, GpuCapacity, Resources
from autotuner.feasibility import Feasibility
from autotuner.memory import MemoryModel
from autotuner.records import SKIPPED_STATUSES, TrialRecord, attrs_for, record_of, records
from autotuner.samplers import make_sampler
from autotuner.space import SearchSpace
from autotuner.spec import JobSpec
from autotuner.stopping import Patience
from autotuner.summary import front
from autotuner.trialspec import build_trial_spec, trial_gpus
from trials.types import TrialResult, TrialSpec

log = logging.getLogger(__name__)

# Proposals in a row that could not be run (invalid, duplicate or known not to fit) before
# the space counts as exhausted.
MAX_UNRUNNABLE_IN_A_ROW = 200
# A space of at most this many configs is listed (``SearchSpace.grid``): the loop stops
# proposing once each is measured, in flight or known not to fit, without asking the
# sampler for proposals it can only repeat.
GRID_LISTED_UP_TO = 4096
CONSTRAINT = "fits"
# Failures that say nothing about the config (the machine or Ray failed, or the user
# cancelled): recorded as ``infra_error`` (``cancelled`` for a cancelled one), not counted,
# and the config may run again.
INFRA_ERROR_TYPES = frozenset(
    {
        "GpuNotClean",
        "TrialLaunchError",
        "Cancelled",
        "WorkerCrashedError",
        "NodeDiedError",
        "RaySystemError",
        "LocalRayletDiedError",
        "OwnerDiedError",
        "ObjectLostError",
        "ActorDiedError",
    }
)
# This many infrastructure failures in a row stop the job: the machine cannot measure.
MAX_INFRA_ERRORS_IN_A_ROW = 3
BREAKER_PREFIX = "circuit breaker"
CANCELLED = "cancelled"
DEFAULTS_BASELINE = "verl-v0.9-defaults"


def config_key(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, default=str)


def rollout_key(config: dict[str, Any]) -> str:
    """What decides a trial's rollout: its rollout knobs (and any unknown key) and the
    actor's offload, which sets the memory resident beside the engine (``compose.side_of``)."""
    return config_key({p: v for p, v in config.items() if side_of(p) != "actor"})


def worst_value(metric: str, direction: str, cap_gib: float | None) -> float:
    if metric == "peak_memory_gib":
        return float(cap_gib or 1e6)
    return 0.0 if direction == "maximize" else 1e9


def open_study(spec: JobSpec, study_name: str, storage_url: str) -> optuna.Study:
    storage = optuna.storages.RDBStorage(storage_url, engine_kwargs={"pool_pre_ping": True})
    return optuna.create_study(
        study_name=study_name,
        storage=storage,
        directions=[o.resolved_direction for o in spec.objectives],
        sampler=make_sampler(spec.sampler, spec.seed),
        load_if_exists=True,
    )


def recover_interrupted(study: optuna.Study, space: SearchSpace | None = None) -> list[int]:
    """Mark trials a dead process left RUNNING as failed ``interrupted``; return their numbers.

    A trial can die between its proposal and the write of its config (the database went
    away in between); with ``space`` its config is rebuilt from its params, so the record
    says what was interrupted (and what its retry runs)."""
    numbers = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if space is not None and t.params and "config" not in t.user_attrs:
            study._storage.set_trial_user_attr(t._trial_id, "config", space.full_config(dict(t.params)))
        study._storage.set_trial_user_attr(t._trial_id, "status", "interrupted")
        study.tell(t.number, state=TrialState.FAIL)
        numbers.append(t.number)
    return numbers


@dataclass
class RunHooks:
    """Callbacks the CLI or the API service plug into the loop (all optional)."""

    on_record: Callable[[TrialRecord], None] = lambda record: None
    on_start: Callable[[int, str], None] = lambda number, trial_id: None
    stop_requested: Callable[[], bool] = lambda: False


@dataclass
class RunSummary:
    stop_reason: str
    measured: int
    records: list[TrialRecord] = field(default_factory=list)


@dataclass
class _Pending:
    trial: optuna.Trial
    config: dict[str, Any]
    predicted: dict[str, float] = field(default_factory=dict)
    repeat_of: int | None = None
    spec: TrialSpec | None = None
    gpus: int = 0  # reserved while it runs (CUDA)
    dispatched: bool = False  # handed to the executor (else waiting for GPUs)


@dataclass
class StudyRunner:
    """Drives one job's study (see the module docstring). ``memory_model`` None: nothing
    is predicted, nor skipped by prediction (``default_memory_model`` builds the job's);
    ``infer_feasibility`` False: nothing is skipped by monotonicity (None: the job's
    ``memory_model.infer_from_neighbours``)."""

    spec: JobSpec
    study: optuna.Study
    space: SearchSpace
    executor: Executor
    device: Literal["cuda", "cpu"]
    memory_cap_gib: float | None
    cpus_per_trial: float = 1
    hooks: RunHooks = field(default_factory=RunHooks)
    memory_model: MemoryModel | None = None
    infer_feasibility: bool | None = None
    _known: dict[str, TrialRecord] = field(default_factory=dict)
    _pending: dict[str, _Pending] = field(default_factory=dict)
    _ran: list[TrialRecord] = field(default_factory=list)
    _feasibility: Feasibility = field(default_factory=Feasibility)
    _patience: Patience | None = None
    _measured: int = 0
    _gpus: GpuCapacity | None = None
    _composed: set[str] = field(default_factory=set)  # config keys queued by composition
    _grid: set[str] | None = None  # every config the space holds, when it is small enough to list
    _predicted_oom: set[str] = field(default_factory=set)  # config keys skipped by prediction
    _explored: bool = False  # every engine-side setting has been proposed

    def __post_init__(self) -> None:
        settings = self.spec.memory_model
        if self.infer_feasibility is None:
            self.infer_feasibility = settings.infer_from_neighbours
        budget = self.spec.budget
        self._patience = Patience(self.spec.objectives, budget.noise_band_pct / 100, budget.patience_trials)

    @classmethod
    def default_memory_model(
        cls, spec: JobSpec, space: SearchSpace, memory_cap_gib: float | None
    ) -> MemoryModel | None:
        """The job's memory model, or None when the job turned it off."""
        if not spec.memory_model.enabled:
            return None
        return MemoryModel(spec, space.arch, space.device, memory_cap_gib)

    # ------------------------------------------------------------------ set-up

    def _load_known(self) -> int:
        measured = 0
        for rec in records(self.study):
            if rec.measured or rec.status == "inferred_oom":
                self._known.setdefault(config_key(rec.config), rec)
            if rec.ran:
                self._learn(rec)
            if rec.measured:
                measured += 1
        self._measured = measured
        return measured

    def _learn(self, rec: TrialRecord) -> None:
        """Take a trial that ran into the calibration, the feasibility structure, the patience."""
        self._ran.append(rec)
        if rec.repeat_of is None:
            self._feasibility.add(rec)
        if rec.measured and self._patience is not None:
            self._patience.add(rec)
        if self.memory_model is not None:
            self.memory_model.calibrate(self._ran)

    def enqueue_baseline(self) -> None:
        """verl's defaults, then the job's own baselines, run first (once per study), so every
        job reports its gain over them. A baseline value outside the searched values, or for a
        fixed knob, cannot be proposed: it is left to the sampler and logged."""
        if self.study.get_trials(deepcopy=False):
            return
        base = self.space.baseline_config()
        named = [(DEFAULTS_BASELINE, base)] + [
            (name, base | config) for name, config in self.spec.baselines.items()
        ]
        for name, config in named:
            params = {
                p: config[p]
                for p, values in self.space.searched.items()
                if p in config and config[p] in values
            }
            ignored = sorted(p for p in self.spec.baselines.get(name, {}) if p not in params)
            if ignored:
                log.warning(
                    "baseline %s: %s not searched with those values; the sampler picks them",
                    name,
                    ", ".join(ignored),
                )
            self.study.enqueue_trial(params, user_attrs={"baseline": name})

    # ------------------------------------------------------------------ loop

    def run(self) -> RunSummary:
        budget = self.spec.budget
        self._load_known()
        self._gpus = self._gpu_capacity()
        if self.space.size <= GRID_LISTED_UP_TO:
            self._grid = {config_key(c) for c in self.space.grid()}
        deadline = time.monotonic() + budget.max_minutes * 60
        stop_reason = self._search(deadline)
        if stop_reason.startswith(("reached max_trials", "search space exhausted", "stopped early")):
            note = self._remeasure(deadline)
            # A stop requested while re-measuring stops the job as one during the search does
            # (a service shutdown requeues it; a resume re-measures what is missing).
            stop_reason = "cancelled" if note == CANCELLED else stop_reason + note
        return RunSummary(stop_reason, self._measured, records(self.study))

    def _search(self, deadline: float) -> str:
        budget = self.spec.budget
        unrunnable_in_a_row = 0
        holding = False  # a proposal equalled a trial in flight: wait for a result first
        breaker = _Breaker()
        while True:
            if self.hooks.stop_requested():
                return self._cancel()
            launched = self._measured + len(self._pending)
            patience_out = self._patience is not None and self._patience.exhausted
            can_launch = (
                launched < budget.max_trials
                and time.monotonic() < deadline
                and len(self._pending) < budget.max_concurrent_trials
                and not self._waiting_for_gpus()
                and not holding
                and unrunnable_in_a_row < MAX_UNRUNNABLE_IN_A_ROW
                and not patience_out
            )
            left = self._unsettled()
            if can_launch and left is not None and not left:  # nothing new to propose
                if not self._pending:
                    return (
                        f"search space exhausted: all {len(self._grid or ())} configs of the "
                        "space were measured, are in flight or are known not to fit"
                    )
                can_launch = False
            if can_launch:
                self._queue_composition()
                ran = self._launch_one()
                if ran is None:
                    holding = True
                else:
                    unrunnable_in_a_row = 0 if ran else unrunnable_in_a_row + 1
                continue
            if not self._pending:
                if self._measured >= budget.max_trials:
                    return f"reached max_trials ({budget.max_trials})"
                if patience_out and self._patience is not None:
                    return self._patience.reason()
                if unrunnable_in_a_row >= MAX_UNRUNNABLE_IN_A_ROW:
                    return (
                        "search space exhausted: the last "
                        f"{MAX_UNRUNNABLE_IN_A_ROW} proposals were all measured already, "
                        "invalid or known not to fit"
                    )
                return f"reached max_minutes ({budget.max_minutes:g})"
            results = self._collect(breaker)
            if isinstance(results, str):
                return results
            holding = holding and not results

    def _unsettled(self) -> set[str] | None:
        """The configs of a listed space (``GRID_LISTED_UP_TO``) not measured, in flight or
        known not to fit; None for a space too large to list."""
        if self._grid is None:
            return None
        pending = {config_key(p.config) for p in self._pending.values()}
        return self._grid - set(self._known) - pending - self._predicted_oom

    def _collect(self, breaker: _Breaker) -> str | int:
        """Tell the results that are in: how many, or the breaker's stop reason when it trips."""
        results = self.executor.wait(timeout_s=1.0)
        for result in results:
            breaker.saw(result, self._finish(result) is None)
        if breaker.tripped:
            self._cancel_all()
            return breaker.reason()
        self._dispatch()
        return len(results)

    def _cancel(self) -> str:
        self._cancel_all()
        return CANCELLED

    def _cancel_all(self) -> None:
        """Stop the trials in flight and drop those waiting for GPUs, telling each."""
        for result in self.executor.cancel_all():
            self._finish(result)
        for tid in [t for t, p in self._pending.items() if not p.dispatched]:
            self._finish(
                TrialResult(
                    tid,
                    "error",
                    error_type="Cancelled",
                    error_message="the job stopped before this trial got its GPUs",
                )
            )

    # ------------------------------------------------------------------ composition

    def _composes(self) -> bool:
        w = self.spec.workload
        return (
            self.spec.budget.compose_phases
            and w.measures_rollout
            and w.measures_train
            and any(
                o.metric == THROUGHPUT and o.resolved_direction == "maximize" for o in self.spec.objectives
            )
        )

    def _queue_composition(self) -> None:
        """Queue the config ``autotuner.compose`` predicts fastest, if it beats the best
        measured throughput by more than the noise band (once per config; not while another
        queued trial, a baseline's or an earlier composition's, waits to run)."""
        if not self._composes() or self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            return
        exclude = set(self._known) | {config_key(p.config) for p in self._pending.values()} | self._composed
        best = best_composition(
            self._ran, self.space.searched, exclude, lambda params: config_key(self.space.full_config(params))
        )
        incumbent = max((r.metrics.get(THROUGHPUT, 0.0) for r in self._ran if r.feasible), default=0.0)
        band = 1 + self.spec.budget.noise_band_pct / 100
        if best is None or best.predicted_throughput <= incumbent * band:
            self._queue_exploration(exclude)
            return
        self._composed.add(config_key(self.space.full_config(best.params)))
        log.info(
            "queued a composition: trial %s's rollout side with trial %s's train side, "
            "predicted %.1f tokens/s/GPU (best measured %.1f)",
            best.engine_from,
            best.actor_from,
            best.predicted_throughput,
            incumbent,
        )
        self.study.enqueue_trial(
            best.params,
            user_attrs={
                "composed_from": [best.engine_from, best.actor_from],
                "predicted_throughput": round(best.predicted_throughput, 1),
            },
        )

    def _queue_exploration(self, exclude: set[str]) -> None:
        """Queue an engine-side setting no proposal has had yet, paired with the best train
        side measured so far (``compose.next_engine_side``), if there is one."""
        if self._explored or not explorable(self.space.searched):
            return
        tried = [
            t.user_attrs["config"] for t in self.study.get_trials(deepcopy=False) if "config" in t.user_attrs
        ]
        while True:
            found = next_engine_side(self._ran, self.space.searched, tried, self.spec.seed)
            if found is None:
                self._explored = any(r.feasible for r in self._ran)  # else: nothing to pair with yet
                return
            combo, best = found
            params = {p: best.config[p] for p in self.space.searched if p in best.config} | combo
            config = self.space.full_config(params)
            tried.append(params)
            if config_key(config) in exclude:
                continue
            self._composed.add(config_key(config))
            log.info(
                "queued an engine-side setting not tried yet, with trial %s's train side: %s",
                best.number,
                combo,
            )
            self.study.enqueue_trial(params, user_attrs={"explores_with": best.number})
            return

    # ------------------------------------------------------------------ rollout reuse

    def _rollout_donor(self, config: dict[str, Any]) -> dict[str, Any] | None:
        """The rollout side of a measured trial whose engine saw what this config's would
        (``budget.reuse_rollouts``; see ``trials.runner``), or None."""
        w = self.spec.workload
        if not (self.spec.budget.reuse_rollouts and w.measures_rollout and w.measures_train):
            return None
        key = rollout_key(config)
        for rec in self._ran:
            if (
                rec.status == "ok"
                and "engine_asleep_gib" in rec.metrics
                and "rollout_makespan_s" in rec.metrics
                and rollout_key(rec.config) == key
            ):
                return {"trial": rec.number, "metrics": rec.metrics, "timings": rec.phase_timings_s}
        return None

    # ------------------------------------------------------------------ GPU admission

    def _gpu_capacity(self) -> GpuCapacity | None:
        if self.device != "cuda":
            return None
        probe = getattr(self.executor, "gpu_capacity", None)
        return probe() if callable(probe) else None

    def _gpus_free(self) -> float:
        if self._gpus is None:
            return math.inf
        return self._gpus.total - sum(p.gpus for p in self._pending.values() if p.dispatched)

    def _waiting_for_gpus(self) -> bool:
        return any(not p.dispatched for p in self._pending.values())

    def _dispatch(self) -> None:
        """Hand waiting trials to the executor, oldest first, while the GPUs can hold them."""
        for tid, pending in self._pending.items():
            if pending.dispatched:
                continue
            if pending.gpus > self._gpus_free():
                return
            assert pending.spec is not None
            resources = (
                Resources(num_cpus=1, num_gpus=pending.gpus)
                if self.device == "cuda"
                else Resources(num_cpus=self.cpus_per_trial)
            )
            self.executor.submit(pending.spec, resources, self.spec.budget.trial_timeout_s)
            pending.dispatched = True
            self.hooks.on_start(pending.trial.number, tid)

    def _launch_one(self) -> bool | None:
        """Ask for one proposal; run it if it is valid, new and not known not to fit. True
        when a trial launched, None when the proposal equals a trial in flight."""
        trial = self.study.ask()
        proposal = self.space.suggest(trial)
        config = proposal.config
        if not proposal.valid:
            self._tell_unrun(trial, config, "invalid", "; ".join(map(str, proposal.violations)))
            return False
        key = config_key(config)
        if key in self._known:
            self._tell_duplicate(trial, config, self._known[key])
            return False
        if key in {config_key(p.config) for p in self._pending.values()}:
            self._tell_duplicate(trial, config, None)
            return None
        predicted = self._screen(trial, config)
        if predicted is None:
            return False
        return self._submit(trial, config, predicted)

    def _screen(self, trial: optuna.Trial, config: dict[str, Any]) -> dict[str, float] | None:
        """The memory prediction to record, or None when the proposal was skipped as known
        not to fit (and told as such)."""
        if self.infer_feasibility:
            oom = self._feasibility.ruled_out_by(config)
            if oom is not None:
                why = (
                    f"at least as large in every memory knob as trial {oom.number}, which ran "
                    f"out of memory ({oom.phase or 'unknown phase'})"
                )
                self._tell_skipped(trial, config, "inferred_oom", why, {}, inferred_from=oom.number)
                return None
        if self.memory_model is None:
            return {}
        prediction = self.memory_model.predict(config)
        predicted = prediction.to_attrs()
        too_big = prediction.exceeds(self.spec.memory_model.skip_margin)
        if too_big is not None:
            fits = self._feasibility.ruled_in_by(config)
            if fits is None:
                self._tell_skipped(trial, config, "predicted_oom", too_big, predicted)
                return None
            log.info(
                "trial %s: %s, but trial %s (at least as large) fit; running it",
                trial.number,
                too_big,
                fits.number,
            )
        return predicted

    def _submit(
        self,
        trial: optuna.Trial,
        config: dict[str, Any],
        predicted: dict[str, float],
        repeat_of: int | None = None,
    ) -> bool:
        """Run ``config`` as soon as its GPUs are free; False when no node can hold it."""
        trial_id = f"{self.study.study_name}-{trial.number}"
        gpus = trial_gpus(self.spec, config) if self.device == "cuda" else 0
        if self._gpus is not None and gpus > self._gpus.largest_node:
            self._tell_unrun(
                trial,
                config,
                "invalid",
                (
                    f"needs {gpus} GPUs on one node but the Ray cluster's largest node has "
                    f"{self._gpus.largest_node}; lower tensor_model_parallel_size (search), use "
                    "cluster.trial_scope 'replica', or add GPUs"
                ),
            )
            return False
        trial_spec = build_trial_spec(
            self.spec, self.space.arch, config, trial_id, self.device, self.memory_cap_gib
        )
        if repeat_of is None and trial_spec.trial_gpus == 1:
            trial_spec.reused_rollout = self._rollout_donor(config)
        trial.set_user_attr("config", config)
        trial.set_user_attr("trial_id", trial_id)
        if gpus:
            trial.set_user_attr("gpus", gpus)
        if predicted:
            trial.set_user_attr("predicted_memory_gib", predicted)
        self._pending[trial_id] = _Pending(trial, config, predicted, repeat_of, trial_spec, gpus)
        self._dispatch()
        return True

    # ------------------------------------------------------------------ finalists

    def _remeasure(self, deadline: float) -> str:
        """Run the fastest Pareto-front trials again until each has ``remeasure_runs`` runs;
        a note for the stop reason ('' when there is nothing to do)."""
        budget = self.spec.budget
        wanted = budget.finalists
        if wanted == 0:
            return ""
        recs = records(self.study)
        finalists = front(self.spec, recs)[:wanted]
        queue: list[TrialRecord] = []
        for rec in finalists:
            done = 1 + sum(1 for r in recs if r.repeat_of == rec.number and r.ran)
            queue += [rec] * max(0, budget.remeasure_runs - done)
        if not finalists:
            return ""
        breaker = _Breaker()
        while queue or self._pending:
            if self.hooks.stop_requested():
                return self._cancel()
            if time.monotonic() >= deadline and not self._pending:
                return f"; re-measuring the finalists stopped at max_minutes ({budget.max_minutes:g})"
            if (
                queue
                and time.monotonic() < deadline
                and not self._waiting_for_gpus()
                and len(self._pending) < budget.max_concurrent_trials
            ):
                self._launch_repeat(queue.pop(0))
                continue
            tripped = self._collect(breaker)
            if isinstance(tripped, str):
                return f"; re-measuring the finalists stopped: {tripped}"
        numbers = ", ".join(f"#{r.number}" for r in finalists)
        return (
            f"; finalists {numbers} measured {budget.remeasure_runs} times each (medians decide the winner)"
        )

    def _launch_repeat(self, original: TrialRecord) -> None:
        frozen = self.study.get_trials(deepcopy=False)[original.number]
        self.study.enqueue_trial(dict(frozen.params), user_attrs={"repeat_of": original.number})
        while True:  # enqueued trials come out first in, first out
            trial = self.study.ask()
            config = self.space.suggest(trial).config
            if trial.user_attrs.get("repeat_of") == original.number:
                break
            self._tell_unrun(
                trial,
                config,
                "invalid",
                "left waiting when the search ended; not run (re-measuring finalists)",
            )
        if config_key(config) != config_key(original.config):  # the space changed under it
            self._tell_unrun(trial, config, "invalid", f"could not re-propose trial {original.number}")
            return
        predicted = self.memory_model.predict(config).to_attrs() if self.memory_model else {}
        self._submit(trial, config, predicted, repeat_of=original.number)

    # ------------------------------------------------------------------ telling

    def _objective_values(self, result: TrialResult) -> list[float] | None:
        values = []
        for obj in self.spec.objectives:
            value = result.metrics.get(obj.metric)
            if value is None or not math.isfinite(value):
                return None
            values.append(float(value))
        return values

    def _worst_values(self, peak_gib: float | None) -> list[float]:
        values = []
        for obj in self.spec.objectives:
            worst = worst_value(obj.metric, obj.resolved_direction, self.memory_cap_gib)
            if obj.metric == "peak_memory_gib" and peak_gib:
                worst = max(worst, float(peak_gib))
            values.append(worst)
        return values

    def _finish(self, result: TrialResult) -> TrialRecord | None:
        """Tell the outcome; the trial's record, or None for an infrastructure failure."""
        pending = self._pending.pop(result.trial_id)
        trial, config = pending.trial, pending.config
        # Written one by one; readers see the trial running until it is told (record_of).
        for key, value in attrs_for(result, config).items():
            trial.set_user_attr(key, value)
        if result.status == "error" and result.error_type in INFRA_ERROR_TYPES:
            trial.set_user_attr("status", CANCELLED if result.error_type == "Cancelled" else "infra_error")
            self.study.tell(trial, state=TrialState.FAIL)
            self.hooks.on_record(record_of(self.study._storage.get_trial(trial._trial_id)))
            return None
        if pending.predicted and self.memory_model is not None:
            trial.set_user_attr(
                "memory_error_gib", self.memory_model.errors(pending.predicted, result.status, result.metrics)
            )
        values = self._objective_values(result) if result.ok else None
        if result.ok and values is None:
            trial.set_user_attr("status", "error")
            trial.set_user_attr("error_message", "the trial reported no value for an objective")
        if values is not None:
            trial.set_constraint(CONSTRAINT, -1.0)
            self.study.tell(trial, values)
        elif result.status in ("oom", "timeout"):
            trial.set_constraint(CONSTRAINT, 1.0)
            self.study.tell(trial, self._worst_values(result.metrics.get("peak_memory_gib")))
        else:
            self.study.tell(trial, state=TrialState.FAIL)
        record = record_of(self.study._storage.get_trial(trial._trial_id))
        if record.repeat_of is None:
            self._known.setdefault(config_key(config), record)
        if record.measured:
            self._measured += 1
        self._learn(record)
        self.hooks.on_record(record)
        return record

    def _tell_unrun(self, trial: optuna.Trial, config: dict[str, Any], status: str, why: str) -> None:
        trial.set_user_attr("status", status)
        trial.set_user_attr("config", config)
        trial.set_user_attr("error_message", why)
        self.study.tell(trial, state=TrialState.FAIL)

    def _tell_skipped(
        self,
        trial: optuna.Trial,
        config: dict[str, Any],
        status: str,
        why: str,
        predicted: dict[str, float],
        inferred_from: int | None = None,
    ) -> None:
        """Known not to fit: infeasible for the sampler (like an OOM), never run, no cost."""
        trial.set_user_attr("status", status)
        trial.set_user_attr("config", config)
        trial.set_user_attr("error_message", why)
        if predicted:
            trial.set_user_attr("predicted_memory_gib", predicted)
        if inferred_from is not None:
            trial.set_user_attr("inferred_from", inferred_from)
        trial.set_constraint(CONSTRAINT, 1.0)
        self.study.tell(trial, self._worst_values(predicted.get("peak")))
        record = record_of(self.study._storage.get_trial(trial._trial_id))
        if status == "inferred_oom":  # certain; a prediction is made again if it is re-proposed
            self._known.setdefault(config_key(config), record)
        else:
            self._predicted_oom.add(config_key(config))
        self.hooks.on_record(record)

    def _tell_duplicate(
        self, trial: optuna.Trial, config: dict[str, Any], earlier: TrialRecord | None
    ) -> None:
        if earlier is None:  # same config is in flight right now
            self._tell_unrun(trial, config, "duplicate", "the same config is being measured now")
            return
        trial.set_user_attr("status", "duplicate")
        trial.set_user_attr("config", config)
        trial.set_user_attr("duplicate_of", earlier.number)
        trial.set_user_attr("metrics", earlier.metrics)
        if earlier.status == "ok" and earlier.values is not None:
            trial.set_constraint(CONSTRAINT, -1.0)
            self.study.tell(trial, earlier.values)
        elif earlier.status in ("oom", "timeout", *SKIPPED_STATUSES) and earlier.values is not None:
            trial.set_constraint(CONSTRAINT, 1.0)
            self.study.tell(trial, earlier.values)
        else:
            self.study.tell(trial, state=TrialState.FAIL)


@dataclass
class _Breaker:
    """Counts infrastructure failures in a row; trips at ``MAX_INFRA_ERRORS_IN_A_ROW``."""

    in_a_row: int = 0
    last: str = ""

    def saw(self, result: TrialResult, infra: bool) -> None:
        if infra:
            self.in_a_row += 1
            self.last = f"{result.error_type}: {result.error_message or ''}"[:500]
        else:
            self.in_a_row = 0

    @property
    def tripped(self) -> bool:
        return self.in_a_row >= MAX_INFRA_ERRORS_IN_A_ROW

    def reason(self) -> str:
        return (
            f"{BREAKER_PREFIX}: {self.in_a_row} trials in a row failed for reasons outside "
            f"their configs; last: {self.last}"
        )
