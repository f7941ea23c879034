"""The proposal-source seam: a new way to propose configs is one ``ProposalSource`` in the
loop's list; the loop asks it before the sampler, runs what it proposes once, and records why
(the proposal's attributes). Replayed on the recorded CPU landscape."""

from __future__ import annotations

import json

import optuna
import pytest

from autotuner.proposals import (
    DEFAULTS_BASELINE,
    Baselines,
    Proposal,
    ProposalSource,
    Sampler,
    SearchState,
)
from autotuner.records import config_key, records
from autotuner.replay import Landscape, ReplayExecutor
from autotuner.space import SearchSpace
from autotuner.spec import JobSpec
from autotuner.study import StudyRunner

from .conftest import REPO

optuna.logging.set_verbosity(optuna.logging.ERROR)
LANDSCAPE = REPO / "benchmarks" / "search" / "landscapes" / "cpu-train-mid.json"


class Smallest(ProposalSource):
    """Proposes each value of one knob in turn, the rest at their first searched values, then
    nothing."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.seen: list[int] = []  # how many trials had run at each proposal

    def propose(self, state: SearchState) -> Proposal | None:
        first = {p: values[0] for p, values in state.space.searched.items()}
        for value in state.space.searched[self.path]:
            params = first | {self.path: value}
            if state.key_of(params) not in state.taken():
                self.seen.append(len(state.ran))
                return Proposal(params, {"explores_with": -1})
        return None


@pytest.fixture(scope="module")
def landscape() -> Landscape:
    return Landscape.load(LANDSCAPE)


def _runner(landscape: Landscape, sources: list[ProposalSource], max_trials: int) -> StudyRunner:
    data = landscape.spec.model_dump(mode="json") | {"sampler": "random", "seed": 1}
    data["budget"] |= {"max_trials": max_trials, "patience_trials": 0, "remeasure_finalists": 0}
    spec = JobSpec.model_validate(data)
    study = optuna.create_study(directions=[o.resolved_direction for o in spec.objectives])
    space = SearchSpace.build(spec, landscape.arch, landscape.device)
    executor = ReplayExecutor(landscape)
    return StudyRunner(
        spec, study, space, executor, landscape.device, landscape.memory_cap_gib, sources=sources
    )


def test_a_new_source_proposes_before_the_sampler(landscape) -> None:
    path = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
    source = Smallest(path)
    runner = _runner(landscape, [source, Sampler()], max_trials=9)
    runner.enqueue_baseline()
    summary = runner.run()
    recs = records(runner.study)
    values = runner.space.searched[path]
    assert recs[0].baseline == DEFAULTS_BASELINE
    baselines = len([r for r in recs if r.baseline])  # verl's example too, unless the same config
    # Its proposals ran once each, one at a time after the baselines, then the sampler's.
    ours = [r for r in recs if r.explores_with == -1]
    first = {p: vs[0] for p, vs in runner.space.searched.items()}
    new = [
        v
        for v in values
        if config_key(runner.space.full_config(first | {path: v}))
        not in {config_key(r.config) for r in recs[:baselines]}
    ]
    assert [r.config[path] for r in ours] == new
    assert [r.number for r in ours] == list(range(baselines, baselines + len(ours)))
    # It saw a new result before each proposal.
    assert source.seen == sorted(set(source.seen)) and source.seen[0] >= 1
    assert summary.measured == 9 and len({config_key(r.config) for r in recs if r.measured}) == 9


def test_baselines_are_proposed_once_per_study(landscape) -> None:
    runner = _runner(landscape, [Sampler()], max_trials=1)
    state = SearchState(runner.spec, runner.space, runner.study)
    first = Baselines().start(state)
    names = [p.attrs["baseline"] for p in first]
    assert names[0] == DEFAULTS_BASELINE and set(names) <= {DEFAULTS_BASELINE, "verl-v0.9-example"}
    assert len({json.dumps(p.params, sort_keys=True) for p in first}) == len(first)  # none twice
    runner.enqueue_baseline()
    assert Baselines().start(state) == []  # the study has trials: its baselines are in it
