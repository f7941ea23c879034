"""Every registered sampler drives a real study through ``StudyRunner`` (one conformance suite
over the registry): the loop opens the study with the named sampler, runs the budget's trials
on recorded measurements (``ReplayExecutor``), never runs a config twice and stops on the
budget with the outcomes told."""

from __future__ import annotations

import optuna
import pytest

from autotuner.errors import UnknownBackendError
from autotuner.records import records
from autotuner.replay import Landscape, ReplayExecutor
from autotuner.samplers import SAMPLERS, make_sampler
from autotuner.space import SearchSpace
from autotuner.spec import JobSpec
from autotuner.stop import StopKind
from autotuner.study import StudyRunner, config_key, open_study

from .conftest import REPO

optuna.logging.set_verbosity(optuna.logging.ERROR)
LANDSCAPE = REPO / "benchmarks" / "search" / "landscapes" / "cpu-train-mid.json"
MAX_TRIALS = 8


@pytest.fixture(scope="module")
def landscape() -> Landscape:
    return Landscape.load(LANDSCAPE)


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_registered_sampler_drives_a_study(name, landscape, tmp_path) -> None:
    data = landscape.spec.model_dump(mode="json") | {"sampler": name, "seed": 3}
    # One run of the baseline: every run here is the sampler's (or the baseline's first).
    data["budget"] |= {
        "max_trials": MAX_TRIALS,
        "patience_trials": 0,
        "remeasure_finalists": 0,
        "baseline_runs": 1,
    }
    spec = JobSpec.model_validate(data)
    space = SearchSpace.build(spec, landscape.arch, landscape.device)
    study = open_study(spec, f"conformance-{name}", f"sqlite:///{tmp_path / 'study.db'}")
    assert type(study.sampler) is type(make_sampler(name, 0))
    executor = ReplayExecutor(landscape)
    runner = StudyRunner(spec, study, space, executor, landscape.device, landscape.memory_cap_gib)
    runner.enqueue_baseline()

    summary = runner.run()

    assert summary.stop.kind is StopKind.MAX_TRIALS, summary.stop_reason
    assert summary.measured == MAX_TRIALS == len(executor.history)
    ran = [config_key(point.config) for _, point, _, _ in executor.history]
    assert len(set(ran)) == len(ran), "a config ran twice"
    recs = records(study)
    assert sum(1 for r in recs if r.measured) == MAX_TRIALS
    assert all(r.status not in ("running", "queued") for r in recs)  # every proposal was told
    assert recs[0].baseline == "verl-v0.9-defaults" and recs[0].measured
    measured = [r for r in recs if r.status == "ok"]
    assert measured and all(r.values is not None for r in measured)


def test_unknown_sampler_lists_the_registered_ones() -> None:
    with pytest.raises(UnknownBackendError, match="valid samplers are: " + ", ".join(sorted(SAMPLERS))):
        make_sampler("cmaes-typo", 0)
