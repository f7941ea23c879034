"""The search loop: ask for a proposal, screen it, dispatch it, tell its outcome.

The parts, each in its own module:

- where the next config comes from: ``autotuner.proposals`` (baselines, phase composition,
  engine-side exploration, train-side exploration, the Optuna sampler, finalists), sources
  the loop goes down in order before each ``study.ask()``;
- what Optuna is told: ``autotuner.telling`` (OOM is data, never an exception that
  vanishes; every outcome mapped explicitly);
- when a trial gets its GPUs: ``autotuner.admission`` (the executor's GPU admission);
- when the job stops because the machine cannot measure: ``autotuner.breaker``.

The loop's own rules:

- a proposal that breaks a verl rule: ``invalid``, never run.
- a proposal equal to an earlier trial's config: told that trial's outcome as ``duplicate``,
  not run again. One equal to a trial in flight is told ``duplicate`` (FAIL) too, and the loop
  asks for nothing more until a result comes in: a small space whose configs are all in
  flight would otherwise fill the study with duplicates and count as exhausted while
  unmeasured configs remain.
- a proposal at least as large in every memory knob as a measured OOM (the rest equal):
  ``inferred_oom``; one the memory model predicts to exceed the device by more than the
  job's margin (and no measured success at least as large vouches for): ``predicted_oom``.
  Both are never run and cost nothing.
- a trial larger than every node of the Ray cluster is ``invalid``; an infrastructure
  failure (``infra_error``) is not counted against the budget and its config may run again.
- a trial whose rollout another measured trial already saw reuses it (``autotuner.reuse``).

On resume, trials left RUNNING by a dead process are marked ``interrupted`` (FAIL);
finished trials count against the budget and are not repeated.

The loop stops at ``max_trials`` measured trials, ``max_minutes``, an exhausted space (every
config of a listed space measured or known not to fit; for a larger one, 200 proposals in a
row that could not run), or early once the Pareto front has not improved beyond the noise
band for ``patience_trials`` trials (``autotuner.stopping``); then the finalists are measured
again (``repeat_of`` set, outside the trial budget) so the winner is chosen on medians
(``autotuner.summary``). A runner given a ``verification`` then runs the baselines and the
fastest front trials in verl itself (``autotuner.verification``; recorded beside the trials,
not as trials of the study), and the best verl-measured median wins. Each run trial records
the memory model's prediction made before it ran and the error of that prediction once
measured.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Literal

import optuna
from optuna.trial import TrialState

from autotuner import optuna_internals
from autotuner.admission import GpuAdmission
from autotuner.breaker import CircuitBreaker
from autotuner.executor import Executor, Resources
from autotuner.feasibility import Feasibility
from autotuner.memory import MemoryModel
from autotuner.proposals import (
    BaselineRepeats,
    Baselines,
    Composition,
    EngineExploration,
    Finalists,
    Proposal,
    ProposalSource,
    Sampler,
    SearchState,
    TrainExploration,
    waiting,
)
from autotuner.records import MEMORY_CAP, PROPOSAL_CUT_OFF, TrialRecord, TrialStatus, config_key, records
from autotuner.reuse import rollout_donor, rollout_key
from autotuner.samplers import make_sampler
from autotuner.space import SearchSpace
from autotuner.spec import JobSpec
from autotuner.stop import StopKind, StopReason
from autotuner.stopping import Patience
from autotuner.summary import noise_of
from autotuner.telling import Teller
from autotuner.trialspec import build_trial_spec, trial_gpus
from trials.types import TrialResult, TrialSpec

if TYPE_CHECKING:
    from autotuner.verification import JobVerification

__all__ = [
    "GRID_LISTED_UP_TO",
    "MAX_UNRUNNABLE_IN_A_ROW",
    "RunHooks",
    "RunSummary",
    "StudyRunner",
    "config_key",
    "open_study",
    "recover_interrupted",
    "rollout_key",
]

log = logging.getLogger(__name__)

# Proposals in a row that could not be run (invalid, duplicate or known not to fit) before
# the space counts as exhausted.
MAX_UNRUNNABLE_IN_A_ROW = 200
# A space of at most this many configs is listed (``SearchSpace.grid``): the loop stops
# proposing once each is measured, in flight or known not to fit, without asking the
# sampler for proposals it can only repeat.
GRID_LISTED_UP_TO = 4096
# How long one look at the executor waits for results.
WAIT_S = 1.0


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
    says what was interrupted (and what its retry runs). One that died while its knobs were
    being drawn (some params written, not all) chose no config: it is marked
    ``PROPOSAL_CUT_OFF`` and has nothing to retry (``recovery.retry_interrupted``)."""
    numbers = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if space is not None and t.params and "config" not in t.user_attrs:
            if space.chosen(dict(t.params)):
                optuna_internals.set_user_attr(study, t, "config", space.full_config(dict(t.params)))
            else:
                optuna_internals.set_user_attr(study, t, PROPOSAL_CUT_OFF, True)
        optuna_internals.set_user_attr(study, t, "status", TrialStatus.INTERRUPTED)
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
    stop: StopReason
    measured: int
    records: list[TrialRecord] = field(default_factory=list)

    @property
    def stop_reason(self) -> str:
        return self.stop.message


class Launch(Enum):
    """What became of one proposal."""

    LAUNCHED = "launched"  # runs (or waits for its GPUs)
    UNRUNNABLE = "unrunnable"  # invalid, a duplicate of a finished trial, or known not to fit
    HELD = "held"  # equals a trial in flight: ask for nothing more until a result comes in


@dataclass
class _Pending:
    trial: optuna.Trial
    config: dict[str, Any]
    predicted: dict[str, float] = field(default_factory=dict)


@dataclass
class StudyRunner:
    """Drives one job's study (see the module docstring). ``memory_model`` None: nothing
    is predicted, nor skipped by prediction (``default_memory_model`` builds the job's);
    ``infer_feasibility`` False: nothing is skipped by monotonicity (None: the job's
    ``memory_model.infer_from_neighbours``). ``sources``: where proposals come from during
    the search, in order (default: the baselines' mid-job runs, composition, engine-side
    exploration, train-side exploration, the sampler)."""

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
    sources: Sequence[ProposalSource] = field(
        default_factory=lambda: [
            BaselineRepeats(),
            Composition(),
            EngineExploration(),
            TrainExploration(),
            Sampler(),
        ]
    )
    # Runs in verl itself once the finalists are re-measured (``autotuner.verification``).
    verification: JobVerification | None = None
    # verl's environment on the trials' host: each trial has it time verl's own cut of the
    # trial's batch into micro-batches (``TrialSpec.verl_cut_env``). Empty: not timed.
    verl_cut_env: dict[str, str] = field(default_factory=dict)
    _pending: dict[str, _Pending] = field(default_factory=dict)
    _feasibility: Feasibility = field(default_factory=Feasibility)
    _breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    _measured: int = 0
    _grid: set[str] | None = None  # every config the space holds, when it is small enough to list
    _predicted_oom: set[str] = field(default_factory=set)  # config keys skipped by prediction
    _patience: Patience = field(init=False)
    _state: SearchState = field(init=False)
    _teller: Teller = field(init=False)
    _executor: GpuAdmission = field(init=False)  # ``executor`` behind the GPU admission

    def __post_init__(self) -> None:
        if self.infer_feasibility is None:
            self.infer_feasibility = self.spec.memory_model.infer_from_neighbours
        budget = self.spec.budget
        self._patience = Patience(self.spec.objectives, budget.noise_band_pct / 100, budget.patience_trials)
        self._state = SearchState(self.spec, self.space, self.study)
        self._teller = Teller(self.study, self.spec.objectives, self.memory_cap_gib, self.memory_model)
        self._executor = GpuAdmission(self.executor, capacity=None, on_start=self._started)

    @classmethod
    def default_memory_model(
        cls, spec: JobSpec, space: SearchSpace, memory_cap_gib: float | None
    ) -> MemoryModel | None:
        """The job's memory model, or None when the job turned it off."""
        if not spec.memory_model.enabled:
            return None
        return MemoryModel(spec, space.arch, space.device, memory_cap_gib)

    def enqueue_baseline(self) -> None:
        """Enqueue the baselines to run first (``proposals.Baselines``; once per study)."""
        for proposal in Baselines().start(self._state):
            self._enqueue(proposal)

    # ------------------------------------------------------------------ the run

    def run(self) -> RunSummary:
        if self.device == "cuda":  # the cluster as it is now, not when the runner was built
            self._executor.capacity = self.executor.gpu_capacity()
        if self.memory_cap_gib is not None:  # for readers without the job's devices (the web page)
            self.study.set_user_attr(MEMORY_CAP, self.memory_cap_gib)
        self._load_known()
        for source in self.sources:
            for proposal in source.start(self._state):
                self._enqueue(proposal)
        if self.space.size <= GRID_LISTED_UP_TO:
            self._grid = {config_key(c) for c in self.space.grid()}
        deadline = time.monotonic() + self.spec.budget.max_minutes * 60
        stop = self._search(deadline)
        if stop.complete:
            stop = self._remeasure(deadline, stop)
        if stop.complete and self.verification is not None:
            note = self.verification.run(self._state, deadline)
            stop = StopReason.cancelled() if note is None else stop.noted(note)
        return RunSummary(stop, self._measured, records(self.study))

    def _load_known(self) -> None:
        for rec in records(self.study):
            if rec.measured or rec.status == TrialStatus.INFERRED_OOM:
                self._state.known.setdefault(config_key(rec.config), rec)
            if rec.ran:
                self._learn(rec)
            if rec.measured:
                self._measured += 1

    def _learn(self, rec: TrialRecord) -> None:
        """Take a trial that ran into the calibration, the feasibility structure, the patience."""
        self._state.ran.append(rec)
        if rec.repeat_of is None:
            self._feasibility.add(rec)
        if rec.repeat_of is not None and any(
            r.baseline and r.number == rec.repeat_of for r in self._state.ran
        ):
            # A baseline ran again: the job's noise is measured (or moved), and the front must
            # improve beyond it to count (``autotuner.noise``: the floor if that is larger).
            noise = noise_of(self.spec, self._state.ran)
            self._patience.band = noise.band_pct / 100
            if noise.measured_pct is not None and noise.measured_pct > noise.floor_pct:
                self._patience.band_source = f"measured on {noise.runs} runs of {noise.baselines} baseline(s)"
        if rec.measured:
            self._patience.add(rec)
        if self.memory_model is not None:
            self.memory_model.calibrate(self._state.ran)

    # ------------------------------------------------------------------ search

    def _search(self, deadline: float) -> StopReason:
        budget = self.spec.budget
        unrunnable_in_a_row = 0
        holding = False  # a proposal equalled a trial in flight: wait for a result first
        while True:
            if self.hooks.stop_requested():
                return self._cancel()
            can_launch = (
                self._measured + len(self._pending) < budget.max_trials
                and time.monotonic() < deadline
                and len(self._pending) < budget.max_concurrent_trials
                and not self._executor.waiting
                and not holding
                and unrunnable_in_a_row < MAX_UNRUNNABLE_IN_A_ROW
                and not self._patience.exhausted
            )
            left = self._unsettled()
            if can_launch and left is not None and not left:  # nothing new to propose
                if not self._pending:
                    return StopReason(
                        StopKind.EXHAUSTED,
                        f"search space exhausted: all {len(self._grid or ())} configs of the "
                        "space were measured, are in flight or are known not to fit",
                    )
                can_launch = False
            if can_launch:
                launch = self._launch(self._ask())
                if launch is Launch.HELD:
                    holding = True
                else:
                    unrunnable_in_a_row = 0 if launch is Launch.LAUNCHED else unrunnable_in_a_row + 1
                continue
            if not self._pending:
                return self._why_stopped(unrunnable_in_a_row)
            told, stop = self._collect()
            if stop is not None:
                return stop
            holding = holding and not told

    def _why_stopped(self, unrunnable_in_a_row: int) -> StopReason:
        """Why the search stopped, once nothing is in flight and nothing can launch."""
        budget = self.spec.budget
        if self._measured >= budget.max_trials:
            return StopReason(StopKind.MAX_TRIALS, f"reached max_trials ({budget.max_trials})")
        if self._patience.exhausted:
            return StopReason(StopKind.PATIENCE, self._patience.reason())
        if unrunnable_in_a_row >= MAX_UNRUNNABLE_IN_A_ROW:
            return StopReason(
                StopKind.EXHAUSTED,
                f"search space exhausted: the last {MAX_UNRUNNABLE_IN_A_ROW} proposals were all "
                "measured already, invalid or known not to fit",
            )
        return StopReason(StopKind.MAX_MINUTES, f"reached max_minutes ({budget.max_minutes:g})")

    def _unsettled(self) -> set[str] | None:
        """The configs of a listed space (``GRID_LISTED_UP_TO``) not measured, in flight or
        known not to fit; None for a space too large to list."""
        if self._grid is None:
            return None
        return self._grid - set(self._state.known) - self._in_flight() - self._predicted_oom

    def _in_flight(self) -> set[str]:
        return {config_key(p.config) for p in self._pending.values()}

    def _ask(self) -> optuna.Trial:
        """The next trial: an enqueued one if any waits, else the first proposal of the
        sources (``proposals.ProposalSource``)."""
        if not waiting(self.study):
            self._state.in_flight = self._in_flight()
            for source in self.sources:
                proposal = source.propose(self._state)
                if proposal is not None:
                    if proposal.params is not None:
                        self._enqueue(proposal)
                    if proposal.params is not None and proposal.complete:
                        self._state.proposed.add(self._state.key_of(proposal.params))
                    break
        return self.study.ask()

    def _enqueue(self, proposal: Proposal) -> None:
        self.study.enqueue_trial(proposal.params or {}, user_attrs=proposal.attrs)

    def _launch(self, trial: optuna.Trial) -> Launch:
        """Run the proposal ``trial`` if it is valid, new and not known not to fit."""
        proposal = self.space.suggest(trial)
        config = proposal.config
        repeat_of = trial.user_attrs.get("repeat_of")
        if repeat_of is not None:  # a baseline's mid-job run: a re-measurement, not a new config
            return Launch.LAUNCHED if self._repeat(trial, config, repeat_of) else Launch.UNRUNNABLE
        if not proposal.valid:
            self._teller.tell_unrun(
                trial, config, TrialStatus.INVALID, "; ".join(map(str, proposal.violations))
            )
            return Launch.UNRUNNABLE
        key = config_key(config)
        if key in self._state.known:
            self._teller.tell_duplicate(trial, config, self._state.known[key])
            return Launch.UNRUNNABLE
        if key in self._in_flight():
            self._teller.tell_duplicate(trial, config, None)
            return Launch.HELD
        predicted = self._screen(trial, config)
        if predicted is None:
            return Launch.UNRUNNABLE
        return Launch.LAUNCHED if self._submit(trial, config, predicted) else Launch.UNRUNNABLE

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
                status = TrialStatus.INFERRED_OOM
                self._skipped(self._teller.tell_skipped(trial, config, status, why, {}, oom.number))
                return None
        if self.memory_model is None:
            return {}
        prediction = self.memory_model.predict(config)
        predicted = prediction.to_attrs()
        too_big = prediction.exceeds(self.spec.memory_model.skip_margin)
        if too_big is not None:
            fits = self._feasibility.ruled_in_by(config)
            if fits is None:
                status = TrialStatus.PREDICTED_OOM
                self._skipped(self._teller.tell_skipped(trial, config, status, too_big, predicted))
                return None
            log.info(
                "trial %s: %s, but trial %s (at least as large) fit; running it",
                trial.number,
                too_big,
                fits.number,
            )
        return predicted

    def _skipped(self, record: TrialRecord) -> None:
        """Note a proposal told as known not to fit."""
        if record.status == TrialStatus.INFERRED_OOM:  # certain; a prediction is made again if re-proposed
            self._state.known.setdefault(config_key(record.config), record)
        else:
            self._predicted_oom.add(config_key(record.config))
        self.hooks.on_record(record)

    # ------------------------------------------------------------------ dispatch

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
        if gpus > self._executor.largest_node:
            self._teller.tell_unrun(
                trial,
                config,
                TrialStatus.INVALID,
                f"needs {gpus} GPUs on one node but the Ray cluster's largest node has "
                f"{self._executor.largest_node:g}; lower tensor_model_parallel_size (search), use "
                "cluster.trial_scope 'replica', or add GPUs",
            )
            return False
        trial_spec = self._trial_spec(config, trial_id, repeat_of)
        trial.set_user_attr("config", config)
        trial.set_user_attr("trial_id", trial_id)
        if gpus:
            trial.set_user_attr("gpus", gpus)
        if predicted:
            trial.set_user_attr("predicted_memory_gib", predicted)
        self._pending[trial_id] = _Pending(trial, config, predicted)
        resources = (
            Resources(num_cpus=1, num_gpus=gpus)
            if self.device == "cuda"
            else Resources(num_cpus=self.cpus_per_trial)
        )
        self._executor.submit(trial_spec, resources, self.spec.budget.trial_timeout_s)
        return True

    def _trial_spec(self, config: dict[str, Any], trial_id: str, repeat_of: int | None) -> TrialSpec:
        spec = build_trial_spec(
            self.spec, self.space.arch, config, trial_id, self.device, self.memory_cap_gib
        )
        if repeat_of is None and spec.trial_gpus == 1:
            spec.reused_rollout = rollout_donor(self.spec, self._state.ran, config)
        spec.verl_cut_env = dict(self.verl_cut_env)
        return spec

    def _started(self, trial_id: str) -> None:
        self.hooks.on_start(self._pending[trial_id].trial.number, trial_id)

    def _collect(self) -> tuple[int, StopReason | None]:
        """Tell the results that are in (the breaker sees each): how many, and why to stop
        when the breaker tripped (the trials in flight are then cancelled)."""
        results = self._executor.wait(timeout_s=WAIT_S)
        for result in results:
            self._breaker.see(self._finish(result))
        stop = self._breaker.stop
        if stop is not None:
            self._cancel_all()
        return len(results), stop

    def _finish(self, result: TrialResult) -> TrialRecord:
        """Tell the outcome and learn from it; the trial's record."""
        pending = self._pending.pop(result.trial_id)
        record = self._teller.tell_result(pending.trial, pending.config, result, pending.predicted)
        if record.status not in (TrialStatus.INFRA_ERROR, TrialStatus.CANCELLED):
            if record.repeat_of is None:
                self._state.known.setdefault(config_key(pending.config), record)
            if record.measured:
                self._measured += 1
            self._learn(record)
        self.hooks.on_record(record)
        return record

    def _cancel(self) -> StopReason:
        self._cancel_all()
        return StopReason.cancelled()

    def _cancel_all(self) -> None:
        """Stop the trials in flight and drop those waiting for GPUs, telling each."""
        for result in self._executor.cancel_all():
            self._finish(result)

    # ------------------------------------------------------------------ finalists

    def _remeasure(self, deadline: float, stop: StopReason) -> StopReason:
        """Run the finalists again (``proposals.Finalists``); ``stop`` with a note on what
        they did. A stop requested meanwhile stops the job as one during the search does
        (a shutdown requeues it; a resume re-measures what is missing). The breaker tripping
        ends the re-measuring only: the search's result stands."""
        budget = self.spec.budget
        finalists = Finalists()
        finalists.start(self._state)
        if not finalists.chosen:
            return stop
        while finalists.pending or self._pending:
            if self.hooks.stop_requested():
                return self._cancel()
            if time.monotonic() >= deadline and not self._pending:
                return stop.noted(
                    f"; re-measuring the finalists stopped at max_minutes ({budget.max_minutes:g})"
                )
            if (
                finalists.pending
                and time.monotonic() < deadline
                and not self._executor.waiting
                and len(self._pending) < budget.max_concurrent_trials
            ):
                proposal = finalists.propose(self._state)
                if proposal is not None:
                    self._launch_repeat(proposal)
                continue
            _, tripped = self._collect()
            if tripped is not None:
                return stop.noted(f"; re-measuring the finalists stopped: {tripped.message}")
        baselines = [r.number for r in finalists.chosen if r.baseline]
        if baselines:
            log.info(
                "baselines %s: %s runs each over the job (their spread is the noise)",
                baselines,
                budget.baseline_runs,
            )
        numbers = ", ".join(f"#{r.number}" for r in finalists.chosen if not r.baseline)
        if not numbers:
            return stop
        return stop.noted(
            f"; finalists {numbers} measured {budget.remeasure_runs} times each (medians decide the winner)"
        )

    def _launch_repeat(self, proposal: Proposal) -> None:
        """Run a finalist's config again: its proposal comes out of the study's queue after
        whatever the search left waiting, which is told it was not run."""
        original: int = proposal.attrs["repeat_of"]
        self._enqueue(proposal)
        while True:  # enqueued trials come out first in, first out
            trial = self.study.ask()
            config = self.space.suggest(trial).config
            if trial.user_attrs.get("repeat_of") == original:
                break
            self._teller.tell_unrun(
                trial,
                config,
                TrialStatus.INVALID,
                "left waiting when the search ended; not run (re-measuring finalists)",
            )
        self._repeat(trial, config, original)

    def _repeat(self, trial: optuna.Trial, config: dict[str, Any], original: int) -> bool:
        """Run trial ``original``'s config again as ``trial``; False when it cannot."""
        measured = next(r.config for r in self._state.ran if r.number == original)
        if config_key(config) != config_key(measured):  # the space changed under it
            self._teller.tell_unrun(
                trial, config, TrialStatus.INVALID, f"could not re-propose trial {original}"
            )
            return False
        predicted = self.memory_model.predict(config).to_attrs() if self.memory_model else {}
        return self._submit(trial, config, predicted, repeat_of=original)
