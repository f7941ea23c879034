"""Why a study stopped, as a kind the code decides on and a message people read.

The job's outcome follows from the kind (``job_outcome``), never from the message's words,
so a message can be reworded freely.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum

from storage import JobStatus


class StopKind(str, Enum):
    """What ended the search."""

    MAX_TRIALS = "max_trials"  # the trial budget was measured
    EXHAUSTED = "exhausted"  # every config of the space was settled, or nothing new came
    PATIENCE = "patience"  # the Pareto front stopped improving (``autotuner.stopping``)
    MAX_MINUTES = "max_minutes"  # the time budget ran out
    CANCELLED = "cancelled"  # a user's cancel, or the service shutting down
    BREAKER = "breaker"  # the circuit breaker: the machine cannot measure (``autotuner.breaker``)

    def __str__(self) -> str:
        return self.value


# A search that ended one of these ways is complete: its finalists are re-measured.
COMPLETE = (StopKind.MAX_TRIALS, StopKind.EXHAUSTED, StopKind.PATIENCE)


@dataclass(frozen=True)
class StopReason:
    """Why a study stopped: ``kind`` decides, ``message`` explains (it is the job's
    ``stop_reason``)."""

    kind: StopKind
    message: str

    @classmethod
    def cancelled(cls) -> StopReason:
        return cls(StopKind.CANCELLED, "cancelled")

    @property
    def complete(self) -> bool:
        """The search ran its course (its finalists are re-measured)."""
        return self.kind in COMPLETE

    def noted(self, note: str) -> StopReason:
        """The same reason with ``note`` added to its message (what the finalists did)."""
        return dataclasses.replace(self, message=self.message + note)

    def __str__(self) -> str:
        return self.message


def job_outcome(stop: StopReason, found_a_winner: bool) -> tuple[JobStatus, str | None]:
    """A finished job's status and error: cancelled as such; failed when the breaker tripped
    (its message is the error) or when no trial succeeded; succeeded otherwise."""
    if stop.kind is StopKind.CANCELLED:
        return "cancelled", None
    if stop.kind is StopKind.BREAKER:
        return "failed", stop.message
    if not found_a_winner:
        return "failed", "no trial succeeded"
    return "succeeded", None
