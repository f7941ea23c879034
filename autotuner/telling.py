"""Telling Optuna each trial's outcome: the one place the study's values, states and
constraints are written.

Optuna samplers ignore FAIL trials and would propose them again, so outcomes are mapped
explicitly:

- ``ok``: COMPLETE with the objective values, constraint <= 0 (feasible).
- ``oom``/``timeout``: COMPLETE with the worst objective values and constraint > 0, so
  constrained samplers learn the boundary.
- ``error``: FAIL with the error kept (``ok`` without a value for an objective is one).
- an error outside the config (``INFRA_ERROR_TYPES``): FAIL as ``infra_error``, or as
  ``cancelled`` for a trial the job's cancellation (or its end) stopped.
- never run: ``invalid`` (breaks a rule) FAIL; ``duplicate`` told the earlier trial's
  outcome (FAIL while that trial is in flight); ``predicted_oom``/``inferred_oom``
  COMPLETE with the worst values and constraint > 0, like an OOM.

Each ``tell_*`` writes the trial's user attributes first and tells the study last, so a
reader sees the trial running until its outcome is complete (``records.record_of``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from autotuner.memory import MemoryModel
from autotuner.records import (
    INFEASIBLE_STATUSES,
    SKIPPED_STATUSES,
    TrialRecord,
    TrialStatus,
    attrs_for,
    record_of,
)
from autotuner.spec import Objective
from trials.metrics import PEAK_MEMORY
from trials.types import TrialResult

CONSTRAINT = "fits"
# Failures that say nothing about the config (the machine or Ray failed, or the user
# cancelled): recorded as ``infra_error`` (``cancelled`` for a cancelled one), not counted,
# and the config may run again.
INFRA_ERROR_TYPES = frozenset(
    {
        "GpuNotClean",
        "TrialLaunchError",
        "Cancelled",
        "WorkerCrashedError",
        "NodeDiedError",
        "RaySystemError",
        "LocalRayletDiedError",
        "OwnerDiedError",
        "ObjectLostError",
        "ActorDiedError",
    }
)


def worst_value(metric: str, direction: str, cap_gib: float | None) -> float:
    if metric == PEAK_MEMORY:
        return float(cap_gib or 1e6)
    return 0.0 if direction == "maximize" else 1e9


@dataclass
class Teller:
    """Tells ``study`` the outcomes of its trials (see the module docstring). ``memory_model``
    None: no prediction error is recorded."""

    study: optuna.Study
    objectives: list[Objective]
    memory_cap_gib: float | None
    memory_model: MemoryModel | None = None

    def tell_result(
        self, trial: optuna.Trial, config: dict[str, Any], result: TrialResult, predicted: dict[str, float]
    ) -> TrialRecord:
        """A trial that ran (or was cancelled): its measurements and its outcome."""
        for key, value in attrs_for(result, config).items():
            trial.set_user_attr(key, value)
        if result.status == "error" and result.error_type in INFRA_ERROR_TYPES:
            cancelled = result.error_type == "Cancelled"
            trial.set_user_attr("status", TrialStatus.CANCELLED if cancelled else TrialStatus.INFRA_ERROR)
            return record_of(self.study.tell(trial, state=TrialState.FAIL))
        if predicted and self.memory_model is not None:
            trial.set_user_attr(
                "memory_error_gib", self.memory_model.errors(predicted, result.status, result.metrics)
            )
        values = self._objective_values(result) if result.ok else None
        if result.ok and values is None:
            trial.set_user_attr("status", TrialStatus.ERROR)
            trial.set_user_attr("error_message", "the trial reported no value for an objective")
        if values is not None:
            trial.set_constraint(CONSTRAINT, -1.0)
            return record_of(self.study.tell(trial, values))
        if result.status in INFEASIBLE_STATUSES:
            trial.set_constraint(CONSTRAINT, 1.0)
            return record_of(self.study.tell(trial, self._worst_values(result.metrics.get(PEAK_MEMORY))))
        return record_of(self.study.tell(trial, state=TrialState.FAIL))

    def tell_unrun(self, trial: optuna.Trial, config: dict[str, Any], status: TrialStatus, why: str) -> None:
        """A proposal that is not run and teaches the sampler nothing (FAIL)."""
        trial.set_user_attr("status", status)
        trial.set_user_attr("config", config)
        trial.set_user_attr("error_message", why)
        self.study.tell(trial, state=TrialState.FAIL)

    def tell_skipped(
        self,
        trial: optuna.Trial,
        config: dict[str, Any],
        status: TrialStatus,
        why: str,
        predicted: dict[str, float],
        inferred_from: int | None = None,
    ) -> TrialRecord:
        """Known not to fit: infeasible for the sampler (like an OOM), never run, no cost."""
        trial.set_user_attr("status", status)
        trial.set_user_attr("config", config)
        trial.set_user_attr("error_message", why)
        if predicted:
            trial.set_user_attr("predicted_memory_gib", predicted)
        if inferred_from is not None:
            trial.set_user_attr("inferred_from", inferred_from)
        trial.set_constraint(CONSTRAINT, 1.0)
        return record_of(self.study.tell(trial, self._worst_values(predicted.get("peak"))))

    def tell_duplicate(
        self, trial: optuna.Trial, config: dict[str, Any], earlier: TrialRecord | None
    ) -> None:
        """The same config as ``earlier``, told its outcome; None: the same config is in
        flight now (FAIL: nothing to tell yet)."""
        if earlier is None:
            self.tell_unrun(trial, config, TrialStatus.DUPLICATE, "the same config is being measured now")
            return
        trial.set_user_attr("status", TrialStatus.DUPLICATE)
        trial.set_user_attr("config", config)
        trial.set_user_attr("duplicate_of", earlier.number)
        trial.set_user_attr("metrics", earlier.metrics)
        if earlier.status == TrialStatus.OK and earlier.values is not None:
            trial.set_constraint(CONSTRAINT, -1.0)
            self.study.tell(trial, earlier.values)
        elif earlier.status in (*INFEASIBLE_STATUSES, *SKIPPED_STATUSES) and earlier.values is not None:
            trial.set_constraint(CONSTRAINT, 1.0)
            self.study.tell(trial, earlier.values)
        else:
            self.study.tell(trial, state=TrialState.FAIL)

    def _objective_values(self, result: TrialResult) -> list[float] | None:
        values = []
        for obj in self.objectives:
            value = result.metrics.get(obj.metric)
            if value is None or not math.isfinite(value):
                return None
            values.append(float(value))
        return values

    def _worst_values(self, peak_gib: float | None) -> list[float]:
        values = []
        for obj in self.objectives:
            worst = worst_value(obj.metric, obj.resolved_direction, self.memory_cap_gib)
            if obj.metric == PEAK_MEMORY and peak_gib:
                worst = max(worst, float(peak_gib))
            values.append(worst)
        return values
