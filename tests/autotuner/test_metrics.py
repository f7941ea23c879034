"""The metric names read by name across the project (``trials.metrics``) are ones a job can
name as objectives, and the default objectives."""

from __future__ import annotations

from typing import get_args

from autotuner.spec import JobSpec, ObjectiveMetric
from trials.metrics import PEAK_MEMORY, THROUGHPUT


def test_the_named_metrics_are_objective_metrics_and_the_defaults() -> None:
    assert {THROUGHPUT, PEAK_MEMORY} <= set(get_args(ObjectiveMetric))
    assert [o.metric for o in JobSpec().objectives] == [THROUGHPUT, PEAK_MEMORY]
    assert [o.resolved_direction for o in JobSpec().objectives] == ["maximize", "minimize"]
