"""How Optuna's trials read as records: statuses the tuner never wrote come from the state."""

from __future__ import annotations

import optuna

from autotuner.records import record_of, records


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
