"""The study's circuit breaker: trials that keep failing for one reason stop the job.

It sees every trial that ran, in order, and trips on either of two runs:

- ``MAX_INFRA_ERRORS_IN_A_ROW`` infrastructure failures in a row (GPU not clean, Ray worker
  lost: ``infra_error``): the machine cannot measure; any other outcome resets the count.
- ``SAME_ERROR_IN_A_ROW`` trials in a row failing with the very same error type and message
  (a missing engine, a broken environment): nothing can run, whatever the config
  (``RepeatedErrorBreaker``).

Once tripped, the study stops with a ``StopKind.BREAKER`` reason naming the failure, and a
job whose search it stopped fails with that message.
"""

from __future__ import annotations

from autotuner.records import TrialRecord, TrialStatus
from autotuner.stop import StopKind, StopReason

# This many infrastructure failures in a row stop the job: the machine cannot measure.
MAX_INFRA_ERRORS_IN_A_ROW = 3
# Trials in a row failing with the same error type and message that stop the job. Larger
# than the infrastructure count: distinct configs sharing one bad knob value may fail alike
# a few times by chance, but five identical failures in a row mean nothing can run.
SAME_ERROR_IN_A_ROW = 5
PREFIX = "circuit breaker"


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
        if record.status == TrialStatus.ERROR:
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


class InfraErrorBreaker:
    """Counts infrastructure failures in a row; trips at ``limit``."""

    def __init__(self, limit: int = MAX_INFRA_ERRORS_IN_A_ROW) -> None:
        self.limit = limit
        self.count = 0
        self.last = ""

    def see(self, record: TrialRecord) -> None:
        if record.status == TrialStatus.INFRA_ERROR:
            self.count += 1
            self.last = f"{record.error_type}: {record.error_message or ''}"[:500]
        else:
            self.count = 0

    @property
    def tripped(self) -> bool:
        return self.count >= self.limit

    @property
    def reason(self) -> str:
        return f"{self.count} trials in a row failed for reasons outside their configs; last: {self.last}"


class CircuitBreaker:
    """Both counts over the trials a study ran (see the module docstring)."""

    def __init__(self) -> None:
        self.rules: tuple[InfraErrorBreaker | RepeatedErrorBreaker, ...] = (
            InfraErrorBreaker(),
            RepeatedErrorBreaker(),
        )

    def see(self, record: TrialRecord) -> None:
        for rule in self.rules:
            rule.see(record)

    @property
    def stop(self) -> StopReason | None:
        """Why to stop, once a count reached its limit; else None."""
        for rule in self.rules:
            if rule.tripped:
                return StopReason(StopKind.BREAKER, f"{PREFIX}: {rule.reason}")
        return None
