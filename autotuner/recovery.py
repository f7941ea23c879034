"""What a job does after something outside its configs went wrong.

- ``retry_interrupted``: a trial cut off by a stopped tuner (killed, shut down, its
  database gone mid-run) says nothing about its config; its config runs again, once.
- trials that keep failing for one reason stop the job: the study's circuit breaker
  (``autotuner.breaker``; its ``RepeatedErrorBreaker`` and ``SAME_ERROR_IN_A_ROW`` are
  importable from here too).
- ``database_unavailable``: whether an exception means the database could not be reached
  (or stayed locked), so the job should wait and resume rather than fail.
"""

from __future__ import annotations

import logging

import optuna
from optuna.trial import TrialState
from sqlalchemy import exc as sa_exc

from autotuner.breaker import SAME_ERROR_IN_A_ROW, RepeatedErrorBreaker
from autotuner.records import PROPOSAL_CUT_OFF, RETRY_OF, TrialStatus
from storage import DatabaseUnavailableError
from storage.driver_errors import is_transient

log = logging.getLogger(__name__)

__all__ = [
    "SAME_ERROR_IN_A_ROW",
    "RepeatedErrorBreaker",
    "database_unavailable",
    "retry_interrupted",
    "root_cause",
]


def retry_interrupted(study: optuna.Study) -> list[int]:
    """Enqueue the config of every interrupted trial not retried yet; return their numbers.

    A retry is itself never retried: a config whose trial keeps taking the tuner down
    with it (its memory gets the service OOM-killed, say) runs twice, not forever. A
    trial interrupted before its config was chosen (no params, or only some:
    ``PROPOSAL_CUT_OFF``) has nothing to retry; nor has an
    interrupted re-measurement (``repeat_of``): the end's round of re-measurements counts
    the runs each finalist and baseline has and makes up the missing ones.
    """
    trials = study.get_trials(deepcopy=False)
    retried = {t.user_attrs.get(RETRY_OF) for t in trials}
    numbers = []
    for t in trials:
        if (
            t.state != TrialState.FAIL
            or t.user_attrs.get("status") != TrialStatus.INTERRUPTED
            or not t.params
            or t.user_attrs.get(PROPOSAL_CUT_OFF)  # some knobs drawn, not all: no config chosen
            or t.number in retried
            or RETRY_OF in t.user_attrs
            or t.user_attrs.get("repeat_of") is not None  # a re-run: the finalists' round makes it up
        ):
            continue
        attrs = {RETRY_OF: t.number}
        if t.user_attrs.get("baseline"):
            attrs["baseline"] = t.user_attrs["baseline"]
        study.enqueue_trial(dict(t.params), user_attrs=attrs)
        numbers.append(t.number)
    return numbers


def database_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` or an exception it was raised from says the database could not be
    reached or stayed locked (our storage errors, or Optuna's, which wrap SQLAlchemy's)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DatabaseUnavailableError):
            return True
        if isinstance(current, sa_exc.SQLAlchemyError) and is_transient(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def root_cause(exc: BaseException) -> str:
    """``Type: message`` of the innermost exception ``exc`` was raised from, on one line
    (Optuna's storage errors only say "an exception is raised during the commit")."""
    seen: set[int] = set()
    current = exc
    while (current.__cause__ or current.__context__) is not None and id(current) not in seen:
        seen.add(id(current))
        current = current.__cause__ or current.__context__  # type: ignore[assignment]
    return " ".join(f"{type(current).__name__}: {current}".split())[:1000]
