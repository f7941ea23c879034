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
  ``duplicate``, not run again.
On resume, trials left RUNNING by a dead process are marked ``interrupted`` (FAIL);
finished trials count against the budget and are not repeated.
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

from autotuner.executor import RayExecutor, Resources
from autotuner.knobs import R
from autotuner.records import TrialRecord, attrs_for, record_of, records
from autotuner.samplers import make_sampler
from autotuner.space import SearchSpace
from autotuner.spec import JobSpec
from autotuner.trialspec import build_trial_spec
from trials.types import TrialResult

log = logging.getLogger(__name__)

# Proposals in a row that could not be run (invalid or duplicate) before the space counts
# as exhausted.
MAX_UNRUNNABLE_IN_A_ROW = 200
CONSTRAINT = "fits"
# Failures that say nothing about the config (the machine or Ray failed, or the user
# cancelled): recorded as ``infra_error``, not counted, and the config may run again.
INFRA_ERROR_TYPES = frozenset({
    "GpuNotClean", "TrialLaunchError", "Cancelled", "WorkerCrashedError", "NodeDiedError", "RaySystemError",
    "LocalRayletDiedError", "OwnerDiedError", "ObjectLostError", "ActorDiedError",
})
# This many infrastructure failures in a row stop the job: the machine cannot measure.
MAX_INFRA_ERRORS_IN_A_ROW = 3
BREAKER_PREFIX = "circuit breaker"
DEFAULTS_BASELINE = "verl-v0.9-defaults"


def config_key(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, default=str)


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


def recover_interrupted(study: optuna.Study) -> list[int]:
    """Mark trials a dead process left RUNNING as failed ``interrupted``; return their numbers."""
    numbers = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
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
class StudyRunner:
    spec: JobSpec
    study: optuna.Study
    space: SearchSpace
    executor: RayExecutor
    device: Literal["cuda", "cpu"]
    memory_cap_gib: float | None
    cpus_per_trial: float = 1
    hooks: RunHooks = field(default_factory=RunHooks)
    _known: dict[str, TrialRecord] = field(default_factory=dict)
    _pending: dict[str, tuple[optuna.Trial, dict[str, Any]]] = field(default_factory=dict)

    # ------------------------------------------------------------------ set-up

    def _load_known(self) -> int:
        measured = 0
        for rec in records(self.study):
            if rec.measured:
                measured += 1
                self._known.setdefault(config_key(rec.config), rec)
        return measured

    def enqueue_baseline(self) -> None:
        """verl's defaults, then the job's own baselines, run first (once per study), so every
        job reports its gain over them. A baseline value outside the searched values, or for a
        fixed knob, cannot be proposed: it is left to the sampler and logged."""
        if self.study.get_trials(deepcopy=False):
            return
        base = self.space.baseline_config()
        named = [(DEFAULTS_BASELINE, base)] + [
            (name, base | config) for name, config in self.spec.baselines.items()]
        for name, config in named:
            params = {p: config[p] for p, values in self.space.searched.items()
                      if p in config and config[p] in values}
            ignored = sorted(p for p in self.spec.baselines.get(name, {}) if p not in params)
            if ignored:
                log.warning("baseline %s: %s not searched with those values; the sampler picks them",
                            name, ", ".join(ignored))
            self.study.enqueue_trial(params, user_attrs={"baseline": name})

    # ------------------------------------------------------------------ loop

    def run(self) -> RunSummary:
        budget = self.spec.budget
        measured = self._load_known()
        deadline = time.monotonic() + budget.max_minutes * 60
        unrunnable_in_a_row = 0
        infra_in_a_row, last_infra = 0, ""
        stop_reason = ""
        while True:
            if self.hooks.stop_requested():
                for result in self.executor.cancel_all():
                    self._finish(result)
                stop_reason = "cancelled"
                break
            launched = measured + len(self._pending)
            can_launch = (launched < budget.max_trials and time.monotonic() < deadline
                          and len(self._pending) < budget.max_concurrent_trials
                          and unrunnable_in_a_row < MAX_UNRUNNABLE_IN_A_ROW)
            if can_launch:
                ran = self._launch_one()
                unrunnable_in_a_row = 0 if ran else unrunnable_in_a_row + 1
                continue
            if not self._pending:
                if measured >= budget.max_trials:
                    stop_reason = f"reached max_trials ({budget.max_trials})"
                elif unrunnable_in_a_row >= MAX_UNRUNNABLE_IN_A_ROW:
                    stop_reason = ("search space exhausted: the last "
                                   f"{MAX_UNRUNNABLE_IN_A_ROW} proposals were all measured already "
                                   "or invalid")
                else:
                    stop_reason = f"reached max_minutes ({budget.max_minutes:g})"
                break
            for result in self.executor.wait(timeout_s=1.0):
                if self._finish(result):
                    measured += 1
                    infra_in_a_row = 0
                else:
                    infra_in_a_row += 1
                    last_infra = f"{result.error_type}: {result.error_message or ''}"[:500]
            if infra_in_a_row >= MAX_INFRA_ERRORS_IN_A_ROW:
                for result in self.executor.cancel_all():
                    self._finish(result)
                stop_reason = (f"{BREAKER_PREFIX}: {infra_in_a_row} trials in a row failed for "
                               f"reasons outside their configs; last: {last_infra}")
                break
        return RunSummary(stop_reason, measured, records(self.study))

    def _launch_one(self) -> bool:
        """Ask for one proposal; run it if it is valid and new. True when a trial launched."""
        trial = self.study.ask()
        proposal = self.space.suggest(trial)
        config = proposal.config
        if not proposal.valid:
            self._tell_unrun(trial, config, "invalid", "; ".join(map(str, proposal.violations)))
            return False
        key = config_key(config)
        if key in self._known or key in {config_key(c) for _, c in self._pending.values()}:
            self._tell_duplicate(trial, config, self._known.get(key))
            return False
        trial_id = f"{self.study.study_name}-{trial.number}"
        trial_spec = build_trial_spec(self.spec, self.space.arch, config, trial_id, self.device,
                                      self.memory_cap_gib)
        tp = int(config.get(R + "tensor_model_parallel_size", 1))
        resources = (Resources(num_cpus=1, num_gpus=tp) if self.device == "cuda"
                     else Resources(num_cpus=self.cpus_per_trial))
        trial.set_user_attr("config", config)
        trial.set_user_attr("trial_id", trial_id)
        self.executor.submit(trial_spec, resources, self.spec.budget.trial_timeout_s)
        self._pending[trial_id] = (trial, config)
        self.hooks.on_start(trial.number, trial_id)
        return True

    # ------------------------------------------------------------------ telling

    def _objective_values(self, result: TrialResult) -> list[float] | None:
        values = []
        for obj in self.spec.objectives:
            value = result.metrics.get(obj.metric)
            if value is None or not math.isfinite(value):
                return None
            values.append(float(value))
        return values

    def _worst_values(self, result: TrialResult) -> list[float]:
        values = []
        for obj in self.spec.objectives:
            worst = worst_value(obj.metric, obj.resolved_direction, self.memory_cap_gib)
            if obj.metric == "peak_memory_gib" and result.metrics.get("peak_memory_gib"):
                worst = max(worst, float(result.metrics["peak_memory_gib"]))
            values.append(worst)
        return values

    def _finish(self, result: TrialResult) -> bool:
        """Tell the outcome; False when it was an infrastructure failure (not counted)."""
        trial, config = self._pending.pop(result.trial_id)
        for key, value in attrs_for(result, config).items():
            trial.set_user_attr(key, value)
        if result.status == "error" and result.error_type in INFRA_ERROR_TYPES:
            trial.set_user_attr("status", "infra_error")
            self.study.tell(trial, state=TrialState.FAIL)
            self.hooks.on_record(record_of(self.study._storage.get_trial(trial._trial_id)))
            return False
        values = self._objective_values(result) if result.ok else None
        if result.ok and values is None:
            trial.set_user_attr("status", "error")
            trial.set_user_attr("error_message", "the trial reported no value for an objective")
        if values is not None:
            trial.set_constraint(CONSTRAINT, -1.0)
            self.study.tell(trial, values)
        elif result.status in ("oom", "timeout"):
            trial.set_constraint(CONSTRAINT, 1.0)
            self.study.tell(trial, self._worst_values(result))
        else:
            self.study.tell(trial, state=TrialState.FAIL)
        record = record_of(self.study._storage.get_trial(trial._trial_id))
        self._known.setdefault(config_key(config), record)
        self.hooks.on_record(record)
        return True

    def _tell_unrun(self, trial: optuna.Trial, config: dict[str, Any], status: str, why: str) -> None:
        trial.set_user_attr("status", status)
        trial.set_user_attr("config", config)
        trial.set_user_attr("error_message", why)
        self.study.tell(trial, state=TrialState.FAIL)

    def _tell_duplicate(self, trial: optuna.Trial, config: dict[str, Any],
                        earlier: TrialRecord | None) -> None:
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
        elif earlier.status in ("oom", "timeout") and earlier.values is not None:
            trial.set_constraint(CONSTRAINT, 1.0)
            self.study.tell(trial, earlier.values)
        else:
            self.study.tell(trial, state=TrialState.FAIL)
