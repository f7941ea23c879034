"""The trial worker: run one configuration's rollout and train phases, report a TrialResult.

Importing ``trials`` (or ``trials.types``, ``trials.launcher``) imports neither torch nor
an engine: the control plane uses the types and the launcher, and the heavy imports
happen inside ``run_trial`` in the trial's own process.
"""

from __future__ import annotations

from collections.abc import Callable

from trials.launcher import launch_trial
from trials.types import RolloutKnobs, TrainKnobs, TrialResult, TrialSpec

__all__ = ["RolloutKnobs", "TrainKnobs", "TrialResult", "TrialSpec", "launch_trial", "run_trial"]


def run_trial(spec: TrialSpec, on_progress: Callable[[TrialResult], None] | None = None) -> TrialResult:
    """Run ``spec`` in this process (see ``trials.runner.run_trial``); never raises."""
    from trials.runner import run_trial as _run_trial

    return _run_trial(spec, on_progress)
