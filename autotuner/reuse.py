"""Rollout reuse: a trial whose engine would see what a measured trial's engine saw takes
over that trial's rollout instead of starting its own engine (``budget.reuse_rollouts``;
the worker's side is ``trials.runner``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from autotuner.compose import side_of
from autotuner.records import TrialRecord, TrialStatus, config_key
from autotuner.spec import JobSpec


def rollout_side(config: dict[str, Any]) -> dict[str, Any]:
    """What decides a trial's rollout: its rollout knobs (and any unknown key) and the
    actor's offload, which sets the memory resident beside the engine (``compose.side_of``)."""
    return {p: v for p, v in config.items() if side_of(p) != "actor"}


def rollout_key(config: dict[str, Any]) -> str:
    """``rollout_side``'s key: trials with equal keys see the same rollout."""
    return config_key(rollout_side(config))


def rollout_donor(spec: JobSpec, ran: Iterable[TrialRecord], config: dict[str, Any]) -> dict[str, Any] | None:
    """The rollout side of a measured trial whose engine saw what ``config``'s would, as a
    ``TrialSpec.reused_rollout``; None when the job does not reuse rollouts or none did."""
    w = spec.workload
    if not (spec.budget.reuse_rollouts and w.measures_rollout and w.measures_train):
        return None
    key = rollout_key(config)
    for rec in ran:
        if reusable(rec) and rollout_key(rec.config) == key:
            return {"trial": rec.number, "metrics": rec.metrics, "timings": rec.phase_timings_s}
    return None


def reusable(rec: TrialRecord) -> bool:
    """Whether another trial can take over ``rec``'s rollout: it ran to the end, and its
    rollout's metrics and its engine's memory asleep are recorded."""
    return (
        rec.status == TrialStatus.OK
        and "engine_asleep_gib" in rec.metrics
        and "rollout_makespan_s" in rec.metrics
    )
