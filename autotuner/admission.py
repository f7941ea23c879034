"""GPU admission: an ``Executor`` that starts a trial only when the cluster's GPUs can hold it.

On CUDA a trial reserves its GPUs in Ray (``Resources.num_gpus``: its replica's TP group, or
the world). Handed to Ray at once, a trial that does not fit would wait in Ray's queue with
its deadline running; ``GpuAdmission`` keeps it instead, and hands trials to the executor it
wraps first in first out, each once the GPUs the executor reported (``Executor.gpu_capacity``)
less those of the trials it started and that have not finished can hold it. A trial never
overtakes an earlier one that is still waiting.

Threading: driven by one thread (the study loop), like the executor it wraps.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from autotuner.executor import Executor, GpuCapacity, Resources
from trials.types import TrialResult, TrialSpec


@dataclass
class _Waiting:
    spec: TrialSpec
    resources: Resources
    timeout_s: float


@dataclass
class GpuAdmission:
    """Wraps ``executor`` (see the module docstring). ``capacity`` None: GPUs are not counted
    and every trial starts at once (a CPU job, a replay). ``on_start(trial_id)`` hears each
    trial the moment it is handed to ``executor``."""

    executor: Executor
    capacity: GpuCapacity | None
    on_start: Callable[[str], None] = lambda trial_id: None
    _waiting: list[_Waiting] = field(default_factory=list)
    _running_gpus: dict[str, float] = field(default_factory=dict)

    @property
    def largest_node(self) -> float:
        """The most GPUs one trial can be given (all on one node); infinite when not counted."""
        return math.inf if self.capacity is None else self.capacity.largest_node

    @property
    def waiting(self) -> int:
        """Trials submitted but not started: their GPUs are not free yet."""
        return len(self._waiting)

    def gpu_capacity(self) -> GpuCapacity | None:
        return self.capacity

    def submit(self, spec: TrialSpec, resources: Resources, timeout_s: float) -> None:
        """Start the trial now if its GPUs are free and none waits before it, else queue it."""
        self._waiting.append(_Waiting(spec, resources, timeout_s))
        self._admit()

    def wait(self, timeout_s: float) -> list[TrialResult]:
        """Start the waiting trials the GPUs freed so far can hold, then wait for results. A
        trial is started here, not the moment a result frees its GPUs: the caller tells
        that result first, and may stop (its breaker) instead of starting more."""
        self._admit()
        results = self.executor.wait(timeout_s)
        for result in results:
            self._running_gpus.pop(result.trial_id, None)
        return results

    def cancel_all(self) -> list[TrialResult]:
        """Cancel the trials started (the executor's results) and drop those still waiting,
        each with a ``Cancelled`` result."""
        results = self.executor.cancel_all()
        results += [
            TrialResult(
                w.spec.trial_id,
                "error",
                error_type="Cancelled",
                error_message="the job stopped before this trial got its GPUs",
            )
            for w in self._waiting
        ]
        self._waiting.clear()
        self._running_gpus.clear()
        return results

    def _free_gpus(self) -> float:
        if self.capacity is None:
            return math.inf
        return self.capacity.total - sum(self._running_gpus.values())

    def _admit(self) -> None:
        while self._waiting and self._waiting[0].resources.num_gpus <= self._free_gpus():
            first = self._waiting.pop(0)
            self.executor.submit(first.spec, first.resources, first.timeout_s)
            self._running_gpus[first.spec.trial_id] = first.resources.num_gpus
            self.on_start(first.spec.trial_id)
