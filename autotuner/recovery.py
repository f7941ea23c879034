"""What a job does after something outside its configs went wrong.

- ``retry_interrupted``: a trial cut off by a stopped tuner (killed, shut down, its
  database gone mid-run) says nothing about its config; its config runs again, once.
- ``RepeatedErrorBreaker``: trials that keep failing with the very same error (a missing
  engine, a broken environment) stop the job as failed, naming the error, instead of
  spending the whole budget on it. Infrastructure errors have their own breaker in the
  study loop (``study.MAX_INFRA_ERRORS_IN_A_ROW``); this one watches config verdicts.
- ``database_unavailable``: whether an exception means the database could not be reached
  (or stayed locked), so the job should wait and resume rather than fail.
"""

from __future__ import annotations

import logging

import optuna
from optuna.trial import TrialState
from sqlalchemy import exc as sa_exc

from autotuner.records import RETRY_OF, TrialRecord
from storage import DatabaseUnavailableError
from storage.driver_errors import is_transient

log = logging.getLogger(__name__)

# Trials in a row failing with the same error type and message that stop the job. Larger
# than the infrastructure breaker's 3: distinct configs sharing one bad knob value may fail
# alike a few times by chance, but five identical failures in a row mean nothing can run.
SAME_ERROR_IN_A_ROW = 5


def retry_interrupted(study: optuna.Study) -> list[int]:
    """Enqueue the config of every interrupted trial not retried yet; return their numbers.

    A retry is itself never retried: a config whose trial keeps taking the tuner down
    with it (its memory gets the service OOM-killed, say) runs twice, not forever. A
    trial interrupted before its config was chosen has nothing to retry.
    """
    trials = study.get_trials(deepcopy=False)
    retried = {t.user_attrs.get(RETRY_OF) for t in trials}
    numbers = []
    for t in trials:
        if (
            t.state != TrialState.FAIL
            or t.user_attrs.get("status") != "interrupted"
            or not t.params
            or t.number in retried
            or RETRY_OF in t.user_attrs
        ):
            continue
        attrs = {RETRY_OF: t.number}
        if t.user_attrs.get("baseline"):
            attrs["baseline"] = t.user_attrs["baseline"]
        study.enqueue_trial(dict(t.params), user_attrs=attrs)
        numbers.append(t.number)
    return numbers


class RepeatedErrorBreaker:
    """Counts trials in a row that failed (status ``error``) with one error type and message.

    ``see`` every recorded trial in order: an error with another type or message starts a
    new count, any other measured outcome (ok, oom, timeout) resets it; infrastructure
    errors and unrun trials leave it as it is. ``tripped`` once ``limit`` in a row agree.
    """

    def __init__(self, limit: int = SAME_ERROR_IN_A_ROW) -> None:
        self.limit = limit
        self.count = 0
        self.error: tuple[str, str] | None = None

    def see(self, record: TrialRecord) -> None:
        if record.status == "error":
            key = (record.error_type or "", record.error_message or "")
            self.count = self.count + 1 if key == self.error else 1
            self.error = key
        elif record.measured:
            self.count, self.error = 0, None

    @property
    def tripped(self) -> bool:
        return self.count >= self.limit

    @property
    def reason(self) -> str:
        error_type, message = self.error or ("", "")
        return (
            f"{self.count} trials in a row failed with the same error; fix its cause and "
            f"submit the job again: {error_type}: {message}"
        )[:2000]


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
