"""GpuAdmission: trials start first in first out, each once the GPUs can hold it; cancelling
drops the waiting ones with a result each. (Real Ray trials: test_packing.)"""

from __future__ import annotations

from dataclasses import dataclass, field

from autotuner.admission import GpuAdmission
from autotuner.executor import GpuCapacity, Resources
from trials.types import TrialResult, TrialSpec


@dataclass
class Recording:
    """An executor that runs nothing: it records what it was given and finishes trials when
    told to (``finish``)."""

    started: list[str] = field(default_factory=list)
    done: list[str] = field(default_factory=list)

    def gpu_capacity(self) -> GpuCapacity | None:
        return GpuCapacity(total=4, largest_node=4)

    def submit(self, spec: TrialSpec, resources: Resources, timeout_s: float) -> None:
        self.started.append(spec.trial_id)

    def finish(self, *trial_ids: str) -> None:
        self.done += trial_ids

    def wait(self, timeout_s: float) -> list[TrialResult]:
        done, self.done = self.done, []
        return [TrialResult(tid, "ok") for tid in done]

    def cancel_all(self) -> list[TrialResult]:
        running = [t for t in self.started if t not in self.done]
        return [TrialResult(t, "error", error_type="Cancelled") for t in running]


def _submit(admission: GpuAdmission, trial_id: str, gpus: int) -> None:
    spec = TrialSpec(trial_id, model_name="tiny", model_config={})
    admission.submit(spec, Resources(num_cpus=1, num_gpus=gpus), timeout_s=60)


def test_trials_start_in_order_once_their_gpus_are_free() -> None:
    inner = Recording()
    heard: list[str] = []
    admission = GpuAdmission(inner, inner.gpu_capacity(), on_start=heard.append)
    for trial_id, gpus in (("a", 2), ("b", 1), ("c", 4), ("d", 1)):
        _submit(admission, trial_id, gpus)
    # c needs all 4 GPUs: it waits, and d (which would fit) does not overtake it.
    assert inner.started == heard == ["a", "b"] and admission.waiting == 2
    inner.finish("a")
    assert [r.trial_id for r in admission.wait(0)] == ["a"]
    assert inner.started == ["a", "b"]  # b still holds a GPU: c cannot start yet
    inner.finish("b")
    admission.wait(0)
    admission.wait(0)  # the GPUs b freed are handed out at the next look, c first
    assert inner.started == ["a", "b", "c"] and admission.waiting == 1
    assert admission.largest_node == 4


def test_cancel_all_drops_the_waiting_trials_with_a_result_each() -> None:
    inner = Recording()
    admission = GpuAdmission(inner, inner.gpu_capacity())
    for trial_id, gpus in (("a", 4), ("b", 1)):
        _submit(admission, trial_id, gpus)
    results = admission.cancel_all()
    assert [(r.trial_id, r.error_type) for r in results] == [("a", "Cancelled"), ("b", "Cancelled")]
    assert "before this trial got its GPUs" in (results[1].error_message or "")
    assert admission.waiting == 0


def test_without_a_capacity_every_trial_starts_at_once() -> None:
    inner = Recording()
    admission = GpuAdmission(inner, capacity=None)
    for trial_id in "abc":
        _submit(admission, trial_id, 8)
    assert inner.started == ["a", "b", "c"] and admission.largest_node == float("inf")
