"""Run trials as Ray tasks: one task per trial, reserving what the trial needs.

Each task calls ``trials.launcher.launch_trial``, which starts the trial in a fresh
process (its own process group) and kills it at its deadline. The executor adds a
second, outer deadline: a task still unfinished a grace period after its trial's
deadline (a wedged Ray worker) is force-cancelled and recorded as ``timeout``.

Threading: one executor is driven by one thread (the study loop).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import ray

from autotuner.errors import RayUnavailableError
from trials.launcher import launch_trial, remove_scratch
from trials.types import TrialResult, TrialSpec

log = logging.getLogger(__name__)

OUTER_GRACE_S = 60.0


@dataclass
class _InFlight:
    spec: TrialSpec
    ref: Any
    deadline: float


@dataclass(frozen=True)
class GpuCapacity:
    """The GPUs trials can be given: in all, and on the largest node (a trial's GPUs are on
    one node)."""

    total: float
    largest_node: float


@dataclass
class Resources:
    """What one trial reserves in Ray."""

    num_cpus: float = 1
    num_gpus: float = 0


class Executor(Protocol):
    """What the study loop dispatches trials to (``RayExecutor``; ``replay.ReplayExecutor``
    answers from recorded measurements; ``admission.GpuAdmission`` holds trials back until
    their GPUs are free). Driven by one thread.

    ``gpu_capacity`` says which GPUs trials can be given (None: the executor does not count
    GPUs; every trial may start at once); the loop asks it once per run on CUDA. ``submit``
    starts a trial; ``wait`` returns the results of the trials that finished within
    ``timeout_s`` (maybe none), each exactly once; ``cancel_all`` stops the trials in flight
    and returns a result for each (``error_type`` ``Cancelled``).
    """

    def gpu_capacity(self) -> GpuCapacity | None: ...

    def submit(self, spec: TrialSpec, resources: Resources, timeout_s: float) -> None: ...

    def wait(self, timeout_s: float) -> list[TrialResult]: ...

    def cancel_all(self) -> list[TrialResult]: ...


def ensure_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Connect to ``address`` or start a local Ray of our own (idempotent).

    Without an address Ray would join whatever ``ray start`` cluster this host runs (its
    ``/tmp/ray/ray_current_cluster``), someone else's included: ``address="local"`` asks
    for a new one."""
    if ray.is_initialized():
        return
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
    if address:
        try:
            ray.init(address=address, **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise RayUnavailableError(
                f"cannot join the Ray cluster at {address!r} (AUTOTUNER_RAY_ADDRESS): {exc}. "
                "Run this on a node of a running cluster (`ray start --address=HEAD:PORT`) with "
                "AUTOTUNER_RAY_ADDRESS=auto or HEAD:PORT, or unset it to use a local Ray."
            ) from None
    else:
        ray.init(address="local", num_cpus=num_cpus, **kwargs)


def _launch_on_node(spec: TrialSpec, **kwargs: Any) -> TrialResult:
    """``launch_trial`` as a Ray task, its result naming the Ray node that ran it."""
    result = launch_trial(spec, **kwargs)
    result.node = ray.get_runtime_context().get_node_id()
    return result


def cluster_resources() -> dict[str, float]:
    return dict(ray.cluster_resources())


@dataclass
class RayExecutor:
    """Runs trials as Ray tasks. ``trial_env`` is added to each trial process's environment
    (``Settings.trial_env``: the compile caches every trial on a host shares). Every trial
    starts its own engine: reusing a running engine across trials that differ only in
    train knobs is not implemented."""

    trial_python: str | None = None
    trial_env: dict[str, str] = field(default_factory=dict)
    in_flight: dict[str, _InFlight] = field(default_factory=dict)

    def gpu_capacity(self) -> GpuCapacity:
        """The GPUs of the Ray cluster's live nodes, as Ray counts them."""
        per_node = [
            float(node.get("Resources", {}).get("GPU", 0.0)) for node in ray.nodes() if node.get("Alive")
        ]
        return GpuCapacity(total=sum(per_node), largest_node=max(per_node, default=0.0))

    def submit(self, spec: TrialSpec, resources: Resources, timeout_s: float) -> None:
        remote = ray.remote(_launch_on_node).options(
            num_cpus=resources.num_cpus,
            num_gpus=resources.num_gpus,
            max_retries=0,
            name=f"trial-{spec.trial_id}",
        )
        kwargs: dict[str, Any] = {"timeout_s": timeout_s}
        if self.trial_python:
            kwargs["python"] = self.trial_python
        if self.trial_env:
            kwargs["env"] = dict(self.trial_env)
        ref = remote.remote(spec, **kwargs)
        self.in_flight[spec.trial_id] = _InFlight(spec, ref, time.monotonic() + timeout_s + OUTER_GRACE_S)

    def wait(self, timeout_s: float) -> list[TrialResult]:
        """Results of the trials that finished within ``timeout_s`` (maybe none)."""
        if not self.in_flight:
            return []
        refs = {entry.ref: tid for tid, entry in self.in_flight.items()}
        done, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
        results = [self._collect(refs[ref], ref) for ref in done]
        now = time.monotonic()
        for tid, entry in list(self.in_flight.items()):
            if now > entry.deadline:
                ray.cancel(entry.ref, force=True)
                remove_scratch(tid)  # its killed worker could not
                del self.in_flight[tid]
                results.append(
                    TrialResult(
                        tid,
                        "timeout",
                        phase=None,
                        error_type="RayTaskDeadline",
                        error_message="the Ray task outlived its deadline and was cancelled",
                    )
                )
        return results

    def _collect(self, tid: str, ref: Any) -> TrialResult:
        self.in_flight.pop(tid, None)
        try:
            result: TrialResult = ray.get(ref)
            return result
        except ray.exceptions.TaskCancelledError:
            return TrialResult(tid, "error", error_type="Cancelled", error_message="cancelled")
        except ray.exceptions.RayError as exc:
            # The Ray worker itself died (killed, lost node): the trial did not report.
            return TrialResult(tid, "error", error_type=type(exc).__name__, error_message=str(exc)[-2000:])

    def cancel_all(self) -> list[TrialResult]:
        out = []
        for tid, entry in list(self.in_flight.items()):
            ray.cancel(entry.ref, force=True)
            remove_scratch(tid)  # its killed worker could not (on this host)
            out.append(
                TrialResult(
                    tid,
                    "error",
                    error_type="Cancelled",
                    error_message="the job was cancelled while this trial ran",
                )
            )
        self.in_flight.clear()
        return out
