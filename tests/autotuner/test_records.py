"""How Optuna's trials read as records: a trial not told yet reads as its state says, whatever
its attributes; statuses the tuner never wrote come from the state; a retry names its trial."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import optuna
from optuna.trial import TrialState

from autotuner.api.schemas import TrialPublic
from autotuner.records import record_of, records
from autotuner.recovery import retry_interrupted
from autotuner.replay import Landscape, ReplayExecutor
from autotuner.samplers import make_sampler
from autotuner.space import SearchSpace
from autotuner.spec import JobSpec
from autotuner.study import StudyRunner, recover_interrupted

from .conftest import REPO

optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_a_trial_without_an_outcome_reads_as_queued_running_or_interrupted():
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    study.enqueue_trial({"x": 1.0})  # a baseline or a retry waiting its turn
    running = study.ask({"x": optuna.distributions.FloatDistribution(0, 2)})
    dead = study.ask({"x": optuna.distributions.FloatDistribution(0, 2)})
    study.tell(dead, state=optuna.trial.TrialState.FAIL)  # failed without a status: died
    study.enqueue_trial({"x": 0.5})
    by_number = {r.number: r.status for r in records(study)}
    assert by_number[running.number] == "running"
    assert by_number[dead.number] == "interrupted"
    waiting = [t for t in study.get_trials() if t.state == optuna.trial.TrialState.WAITING]
    assert len(waiting) == 1 and record_of(waiting[0]).status == "queued"
    assert by_number[waiting[0].number] == "queued"


# ---------------------------------------------------------------- the loop's own writes

LANDSCAPE = REPO / "benchmarks" / "search" / "landscapes" / "cpu-train-mid.json"


class WatchedStorage(optuna.storages.RDBStorage):
    """The tuner's real storage, calling ``after_write(trial_id)`` after each write to a trial."""

    def __init__(self, url: str, after_write: Callable[[int], None]) -> None:
        super().__init__(url)
        self.after_write = after_write

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        super().set_trial_user_attr(trial_id, key, value)
        self.after_write(trial_id)

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        super().set_trial_system_attr(trial_id, key, value)
        self.after_write(trial_id)

    def set_trial_state_values(
        self, trial_id: int, state: TrialState, values: Sequence[float] | None = None
    ) -> bool:
        told = super().set_trial_state_values(trial_id, state, values)
        self.after_write(trial_id)
        return told


def _replayed_runner(storage: optuna.storages.BaseStorage, max_trials: int) -> StudyRunner:
    """The real loop on a real study (as ``open_study`` makes it, on ``storage``), its trials
    answered from a recorded CPU landscape (see tests/autotuner/test_search_loop.py)."""
    landscape = Landscape.load(LANDSCAPE)
    data = landscape.spec.model_dump(mode="json")
    data["budget"] |= {"max_trials": max_trials, "patience_trials": 0, "remeasure_finalists": 0}
    spec = JobSpec.model_validate(data)
    study = optuna.create_study(
        study_name="replayed",
        storage=storage,
        directions=[o.resolved_direction for o in spec.objectives],
        sampler=make_sampler(spec.sampler, spec.seed),
    )
    space = SearchSpace.build(spec, landscape.arch, landscape.device)
    return StudyRunner(spec, study, space, ReplayExecutor(landscape), "cpu", landscape.memory_cap_gib)


def test_a_reader_never_sees_a_result_before_it_is_told(tmp_path) -> None:
    # The tuner writes a result attribute by attribute and tells the study last. A reader on
    # a connection of its own (the API's) looks after every single write: until the tell the
    # trial reads as running, never as an outcome without its values.
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    reader = optuna.storages.RDBStorage(url)
    seen: dict[int, list[TrialPublic]] = defaultdict(list)

    def look(trial_id: int) -> None:
        seen[trial_id].append(TrialPublic.of(record_of(reader.get_trial(trial_id))))

    runner = _replayed_runner(WatchedStorage(url, look), max_trials=6)
    runner.run()

    final = {t._trial_id: TrialPublic.of(record_of(t)) for t in runner.study.get_trials()}
    assert {p.status for p in final.values()} >= {"ok", "oom"}, final
    assert set(seen) == set(final)
    for trial_id, views in seen.items():
        *before_tell, told = views
        assert told == final[trial_id]
        assert before_tell and all(
            v.status == "running" and v.values is None and not v.measured for v in before_tell
        ), [v.status for v in before_tell]


def test_the_retry_of_an_interrupted_trial_names_it_in_its_record(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    runner = _replayed_runner(optuna.storages.RDBStorage(url), max_trials=2)
    study = runner.study
    cut_off = study.ask()  # proposed and submitted, then the tuner was killed
    config = runner.space.suggest(cut_off).config
    cut_off.set_user_attr("config", config)

    assert recover_interrupted(study, runner.space) == [cut_off.number]
    assert retry_interrupted(study) == [cut_off.number]
    runner.run()

    by_number = {r.number: r for r in records(study)}
    retries = [r for r in by_number.values() if r.retry_of is not None]
    assert [(r.retry_of, r.config) for r in retries] == [(cut_off.number, config)]
    [retry] = retries
    assert retry.ran and by_number[cut_off.number].status == "interrupted"
    assert by_number[cut_off.number].retry_of is None
    assert TrialPublic.of(retry).retry_of == cut_off.number
    assert TrialPublic.of(retry).model_dump(mode="json")["retry_of"] == cut_off.number
