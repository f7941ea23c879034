"""Where the study loop's next config comes from: one small interface, its implementations.

- ``Baselines``: verl's defaults, then the job's own baselines, first (once per study).
- ``BaselineRepeats``: each measured baseline again once half the trial budget is measured,
  so its runs spread over the job (``autotuner.noise``: their spread is the job's noise).
- ``Composition``: the unmeasured combination of a measured engine side and a measured
  train side predicted fastest (``autotuner.compose``), when it beats the best measured
  throughput by more than the noise band.
- ``EngineExploration``: an engine-side setting no proposal has had yet, paired with the
  best train side measured so far.
- ``TrainExploration``: every other time the sampler would choose, a train side the sampler
  chooses behind the fastest engine side measured so far, whose rollout the trial reuses.
- ``Sampler``: the Optuna sampler's proposal (TPE, NSGA-II, ...: ``autotuner.samplers``).
- ``Finalists``: the fastest trials of the Pareto front again, until each has
  ``budget.remeasure_runs`` runs, interleaved with the baselines' last runs (until each has
  ``budget.baseline_runs``), after the search.

A new way to propose configs (verl verification, say) is one more ``ProposalSource`` in the
list the loop is given; the loop itself only asks, screens, dispatches and tells.
"""

from __future__ import annotations

import abc
import logging
import statistics
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import TrialState

from autotuner.baselines import DEFAULTS_BASELINE, citation, example_baseline
from autotuner.compose import best_composition, engine_seconds, explorable, next_engine_side, side_of
from autotuner.memory import budget_beside_resident
from autotuner.records import RETRY_OF, TrialRecord, config_key, records
from autotuner.reuse import reusable, rollout_key, rollout_side
from autotuner.space import SearchSpace
from autotuner.spec import JobSpec
from autotuner.summary import front
from autotuner.trialspec import trial_gpus
from trials.metrics import THROUGHPUT

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Proposal:
    """A config to run: the searched knobs' values (``params``; None: whatever the study's
    sampler suggests when the loop asks) and the user attributes that say why it runs
    (``baseline``, ``composed_from``, ``explores_with``, ``trains_behind``, ``repeat_of``)."""

    params: dict[str, Any] | None
    attrs: dict[str, Any] = field(default_factory=dict)
    # False: ``params`` fixes some knobs only, and the study's sampler chooses the rest.
    complete: bool = True


@dataclass
class SearchState:
    """What the loop knows, as the proposal sources may read it (and never change)."""

    spec: JobSpec
    space: SearchSpace
    study: optuna.Study
    ran: list[TrialRecord] = field(default_factory=list)  # ran to an outcome, in order
    known: dict[str, TrialRecord] = field(default_factory=dict)  # config key -> the trial settling it
    in_flight: set[str] = field(default_factory=set)  # config keys running or waiting for GPUs
    proposed: set[str] = field(default_factory=set)  # config keys a source proposed

    def key_of(self, params: dict[str, Any]) -> str:
        """The config key of the config ``params`` (searched values) makes."""
        return config_key(self.space.full_config(params))

    def taken(self) -> set[str]:
        """Config keys no source should propose again: settled, in flight or proposed."""
        return set(self.known) | self.in_flight | self.proposed


class ProposalSource(abc.ABC):
    """One way to choose the next config (see the module docstring).

    Contract, like an Optuna sampler's: the loop calls ``start`` once, before its first
    proposal, then ``propose`` before each ``study.ask()``, in the loop's thread, going
    down its list of sources until one returns a ``Proposal``; it enqueues that proposal's
    params in the study (so the ask hands it out) and records its key in
    ``state.proposed``. A source reads ``state`` and the study; it never asks or tells
    the study itself. It keeps its own state for the life of one loop.
    """

    def start(self, state: SearchState) -> list[Proposal]:
        """Proposals to enqueue once, before anything else runs (default: none)."""
        return []

    @abc.abstractmethod
    def propose(self, state: SearchState) -> Proposal | None:
        """The next proposal, or None to leave the choice to the next source."""


class Baselines(ProposalSource):
    """verl's defaults, its example command for the model's size (``autotuner.baselines``),
    then the job's own baselines, run first (once per study: a study with
    trials already has them), so every job reports its gain over them. A baseline value
    outside the searched values, or for a fixed knob, cannot be proposed: it is left to the
    sampler and logged."""

    def start(self, state: SearchState) -> list[Proposal]:
        if state.study.get_trials(deepcopy=False):
            return []
        base = state.space.baseline_config()
        allowed = {p: [v] for p, v in state.space.fixed.items()} | state.space.searched
        example = example_baseline(state.space.arch.num_parameters, allowed)
        log.info("baseline %s: %s", example.name, citation(example))
        named = [(DEFAULTS_BASELINE, base), (example.name, base | example.config)] + [
            (name, base | config) for name, config in state.spec.baselines.items()
        ]
        out: list[Proposal] = []
        for name, config in named:
            params = {
                p: config[p]
                for p, values in state.space.searched.items()
                if p in config and config[p] in values
            }
            same = next((p.attrs["baseline"] for p in out if p.params == params), None)
            if same is not None:  # e.g. the example's knobs are fixed by the job to the defaults'
                log.info("baseline %s: the same config as %s within this job's space", name, same)
                continue
            ignored = sorted(p for p in state.spec.baselines.get(name, {}) if p not in params)
            if ignored:
                log.warning(
                    "baseline %s: %s not searched with those values; the sampler picks them",
                    name,
                    ", ".join(ignored),
                )
            out.append(Proposal(params, {"baseline": name}))
        return out

    def propose(self, state: SearchState) -> Proposal | None:
        return None


def runs_so_far(state: SearchState, number: int) -> int:
    """How many times trial ``number`` ran: itself and its re-measurements."""
    return sum(1 for r in state.ran if r.number == number or r.repeat_of == number)


class BaselineRepeats(ProposalSource):
    """Each baseline that ran to a throughput, once more, as soon as half of ``max_trials``
    are measured (the middle of the job's runs of it; ``Finalists`` adds the last), while
    the job asks ``budget.baseline_runs`` of at least 3. A baseline already run twice (a
    resumed job) is not proposed again."""

    def __init__(self) -> None:
        self._proposed: set[int] = set()

    def propose(self, state: SearchState) -> Proposal | None:
        budget = state.spec.budget
        if budget.baseline_runs < 3:
            return None
        measured = sum(1 for r in state.ran if r.measured)
        if 2 * measured < budget.max_trials:
            return None
        for rec in state.ran:
            if (
                rec.baseline
                and rec.feasible
                and rec.number not in self._proposed
                and runs_so_far(state, rec.number) < 2
            ):
                self._proposed.add(rec.number)
                frozen = state.study.get_trials(deepcopy=False)[rec.number]
                log.info("baseline %s (trial %s) again, mid-job, for the noise", rec.baseline, rec.number)
                return Proposal(dict(frozen.params), {"repeat_of": rec.number})
        return None


def composes(spec: JobSpec) -> bool:
    """Whether the job composes phases: ``budget.compose_phases``, both phases measured and
    step throughput maximized."""
    w = spec.workload
    return (
        spec.budget.compose_phases
        and w.measures_rollout
        and w.measures_train
        and any(o.metric == THROUGHPUT and o.resolved_direction == "maximize" for o in spec.objectives)
    )


class Composition(ProposalSource):
    """The config ``autotuner.compose`` predicts fastest, if it beats the best measured
    throughput by more than the noise band (once per config)."""

    def propose(self, state: SearchState) -> Proposal | None:
        if not composes(state.spec):
            return None
        best = best_composition(
            state.ran,
            state.space.searched,
            state.taken(),
            state.key_of,
            offload_shapes_rollout=budget_beside_resident(state.spec.workload.engine),
        )
        incumbent = max((r.metrics.get(THROUGHPUT, 0.0) for r in state.ran if r.feasible), default=0.0)
        band = 1 + state.spec.budget.noise_band_pct / 100
        if best is None or best.predicted_throughput <= incumbent * band:
            return None
        log.info(
            "queued a composition: trial %s's rollout side with trial %s's train side, "
            "predicted %.1f tokens/s/GPU (best measured %.1f)",
            best.engine_from,
            best.actor_from,
            best.predicted_throughput,
            incumbent,
        )
        return Proposal(
            best.params,
            {
                "composed_from": [best.engine_from, best.actor_from],
                "predicted_throughput": round(best.predicted_throughput, 1),
            },
        )


class EngineExploration(ProposalSource):
    """An engine-side setting no proposal has had yet, paired with the best train side
    measured so far (``compose.next_engine_side``), while the job composes phases."""

    def __init__(self) -> None:
        self.done = False  # every engine-side setting has been proposed

    def propose(self, state: SearchState) -> Proposal | None:
        if self.done or not composes(state.spec) or not explorable(state.space.searched):
            return None
        tried = [
            t.user_attrs["config"] for t in state.study.get_trials(deepcopy=False) if "config" in t.user_attrs
        ]
        taken = state.taken()
        while True:
            found = next_engine_side(state.ran, state.space.searched, tried, state.spec.seed)
            if found is None:
                self.done = any(r.feasible for r in state.ran)  # else: nothing to pair with yet
                return None
            combo, best = found
            params = {p: best.config[p] for p in state.space.searched if p in best.config} | combo
            tried.append(params)
            if state.key_of(params) in taken:
                continue
            log.info(
                "queued an engine-side setting not tried yet, with trial %s's train side: %s",
                best.number,
                combo,
            )
            return Proposal(params, {"explores_with": best.number})


# The user attributes of a trial some source other than the sampler proposed.
CHOSEN_BY_A_SOURCE = ("baseline", "composed_from", "explores_with", "trains_behind", "repeat_of", RETRY_OF)


class TrainExploration(ProposalSource):
    """Every other time the sampler would choose, a config whose engine side is fixed to the
    fastest one measured so far and whose train side the sampler chooses; the trial reuses
    that engine side's rollout (``autotuner.reuse``), so it costs its training only.

    A trial of the sampler's own measures a new engine side and a new train side for the
    price of a start-up, a rollout and a training; this measures a new train side for the
    training alone, and composition (``Composition``) pairs it with every engine side
    measured. Alternating keeps the engine sides explored where there are too many to try
    one by one (``compose.explorable``). The engine side fixed includes the actor's offload,
    which is part of what keys a rollout (``reuse.rollout_key``). Only for one-GPU trials
    in a job that composes phases and reuses rollouts, with train knobs to choose."""

    def propose(self, state: SearchState) -> Proposal | None:
        spec = state.spec
        if not (composes(spec) and spec.budget.reuse_rollouts):
            return None
        if not any(side_of(p) == "actor" and len(v) > 1 for p, v in state.space.searched.items()):
            return None
        trials = state.study.get_trials(deepcopy=False)
        by_sampler = sum(1 for t in trials if not any(a in t.user_attrs for a in CHOSEN_BY_A_SOURCE))
        behind = sum(1 for t in trials if "trains_behind" in t.user_attrs)
        if behind > by_sampler:
            return None
        donor = fastest_rollout(state.ran)
        if donor is None or trial_gpus(spec, donor.config) != 1:
            return None
        fixed = {p: v for p, v in rollout_side(donor.config).items() if p in state.space.searched}
        log.info("queued a train side of the sampler's behind trial %s's rollout: %s", donor.number, fixed)
        return Proposal(fixed, {"trains_behind": donor.number}, complete=False)


def fastest_rollout(ran: list[TrialRecord]) -> TrialRecord | None:
    """The first trial of the engine side (``reuse.rollout_key``) whose engine phases took
    the least time, the median over its runs, among trials whose rollout can be reused
    (``reuse.reusable``); None when there is none."""
    sides: dict[str, list[TrialRecord]] = {}
    for rec in ran:
        if reusable(rec):
            sides.setdefault(rollout_key(rec.config), []).append(rec)
    if not sides:
        return None
    fastest = min(sides.values(), key=lambda recs: statistics.median(engine_seconds(r) for r in recs))
    return fastest[0]


class Sampler(ProposalSource):
    """The study's own sampler: always proposes, so it ends a list of sources."""

    def propose(self, state: SearchState) -> Proposal | None:
        return Proposal(None)


class Finalists(ProposalSource):
    """The fastest trials of the Pareto front (``budget.finalists``) again until each has
    ``budget.remeasure_runs`` runs, and the measured baselines until each has
    ``budget.baseline_runs`` (a baseline among the finalists: the larger), counting its own
    and earlier re-measurements (mid-job ones, a resumed job's), interleaved round by round
    (A-B-C-A-B-C), so a drift of the machine spreads over all of them; then nothing.
    ``chosen`` lists them once ``start`` ran."""

    def __init__(self) -> None:
        self.chosen: list[TrialRecord] = []
        self._queue: list[TrialRecord] = []

    def start(self, state: SearchState) -> list[Proposal]:
        budget = state.spec.budget
        recs = records(state.study)
        self.chosen = front(state.spec, recs)[: budget.finalists] if budget.finalists else []
        target = {rec.number: budget.remeasure_runs for rec in self.chosen}
        for r in recs:
            if r.baseline and r.measured and r.feasible and budget.baseline_runs > 1:
                if r.number not in target:
                    self.chosen.append(r)
                target[r.number] = max(target.get(r.number, 0), budget.baseline_runs)
        missing = {
            rec.number: target[rec.number] - 1 - sum(1 for r in recs if r.repeat_of == rec.number and r.ran)
            for rec in self.chosen
        }
        for k in range(max(missing.values(), default=0)):
            self._queue += [rec for rec in self.chosen if missing[rec.number] > k]
        return []

    @property
    def pending(self) -> bool:
        return bool(self._queue)

    def propose(self, state: SearchState) -> Proposal | None:
        if not self._queue:
            return None
        original = self._queue.pop(0)
        frozen = state.study.get_trials(deepcopy=False)[original.number]
        return Proposal(dict(frozen.params), {"repeat_of": original.number})


def waiting(study: optuna.Study) -> bool:
    """Whether an enqueued trial waits to be handed out by the next ask."""
    return bool(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
