"""Typed states: a job's outcome follows a stop's kind, never its words; one circuit breaker;
trial statuses are one enum whose values are what the study stores."""

from __future__ import annotations

import json
from typing import get_args

import optuna
import pytest

from autotuner.breaker import MAX_INFRA_ERRORS_IN_A_ROW, SAME_ERROR_IN_A_ROW, CircuitBreaker
from autotuner.records import TrialRecord, TrialStatus, record_of
from autotuner.stop import StopKind, StopReason, job_outcome
from trials.types import WorkerStatus


@pytest.mark.parametrize(
    ("kind", "winner", "outcome"),
    [
        (StopKind.MAX_TRIALS, True, ("succeeded", None)),
        (StopKind.EXHAUSTED, True, ("succeeded", None)),
        (StopKind.PATIENCE, True, ("succeeded", None)),
        (StopKind.MAX_MINUTES, True, ("succeeded", None)),
        (StopKind.MAX_TRIALS, False, ("failed", "no trial succeeded")),
        (StopKind.CANCELLED, False, ("cancelled", None)),
        (StopKind.CANCELLED, True, ("cancelled", None)),
        (StopKind.BREAKER, True, ("failed", "any words at all")),
    ],
)
def test_the_outcome_follows_the_kind_not_the_message(kind, winner, outcome) -> None:
    assert job_outcome(StopReason(kind, "any words at all"), found_a_winner=winner) == outcome


def test_only_a_search_that_ran_its_course_re_measures_its_finalists() -> None:
    complete = {k for k in StopKind if StopReason(k, "").complete}
    assert complete == {StopKind.MAX_TRIALS, StopKind.EXHAUSTED, StopKind.PATIENCE}
    noted = StopReason(StopKind.MAX_TRIALS, "reached max_trials (4)").noted("; finalists re-measured")
    assert noted == StopReason(StopKind.MAX_TRIALS, "reached max_trials (4); finalists re-measured")


def _rec(status: str, error_type: str | None = None, message: str | None = None) -> TrialRecord:
    return TrialRecord(0, TrialStatus(status), error_type=error_type, error_message=message)


def test_the_breaker_trips_on_infrastructure_failures_in_a_row() -> None:
    breaker = CircuitBreaker()
    lost = _rec("infra_error", "NodeDiedError", "node 3 died")
    for rec in (
        [lost] * (MAX_INFRA_ERRORS_IN_A_ROW - 1) + [_rec("oom")] + [lost] * (MAX_INFRA_ERRORS_IN_A_ROW - 1)
    ):
        breaker.see(rec)
        assert breaker.stop is None
    breaker.see(lost)
    stop = breaker.stop
    assert stop is not None and stop.kind is StopKind.BREAKER
    assert stop.message.startswith(f"circuit breaker: {MAX_INFRA_ERRORS_IN_A_ROW} trials in a row")
    assert stop.message.endswith("NodeDiedError: node 3 died")


def test_the_breaker_trips_on_the_same_error_in_a_row() -> None:
    breaker = CircuitBreaker()
    same = _rec("error", "ImportError", "no vllm")
    for _ in range(SAME_ERROR_IN_A_ROW - 1):
        breaker.see(same)
        breaker.see(_rec("duplicate"))  # an unrun trial leaves the count as it is
    assert breaker.stop is None
    breaker.see(same)
    assert breaker.stop is not None and "same error" in breaker.stop.message


def test_trial_statuses_are_one_enum_stored_as_plain_values(tmp_path) -> None:
    assert set(get_args(WorkerStatus)) <= {s.value for s in TrialStatus}
    assert json.dumps({"status": TrialStatus.PREDICTED_OOM}) == '{"status": "predicted_oom"}'
    assert f"{TrialStatus.OK:<4}|" == "ok  |" and TrialStatus("oom") is TrialStatus.OOM
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}")
    trial = study.ask()
    trial.set_user_attr("status", TrialStatus.INVALID)
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    (frozen,) = study.get_trials()
    assert frozen.user_attrs["status"] == "invalid" and type(frozen.user_attrs["status"]) is str
    assert record_of(frozen).status is TrialStatus.INVALID
    study.enqueue_trial({})
    assert record_of(study.get_trials()[-1]).status is TrialStatus.QUEUED
