"""Whether the rollout engine can start beside the resident actor on a device that stands
in for a smaller one.

On a real GPU vLLM itself refuses to start when the free memory (capacity minus what
the actor and anyone else hold) is less than ``gpu_memory_utilization * capacity``
("Free memory on device ... is less than desired GPU memory utilization"). Where the
trial's device is capped (a CPU, whose engine sizes its KV cache from the cap; or a GPU
larger than ``device_memory_cap_gib``) vLLM measures the wrong device, so the same rule
is applied here against the cap before the engine starts, with vLLM's wording, which
classifies it as ``oom`` (phase ``startup``).
"""

from __future__ import annotations

from trials.errors import EngineMemoryRefused
from trials.memory_cap import DEFAULT_CPU_CAP_GIB
from trials.types import TrialSpec


def emulated_capacity_gib(spec: TrialSpec, physical_gib: float | None) -> float | None:
    """The capacity the engine must fit in when it is not the physical device's, else None."""
    cap = spec.device_memory_cap_gib
    if spec.device == "cpu":
        return cap if cap is not None else DEFAULT_CPU_CAP_GIB
    if cap is not None and physical_gib is not None and cap < physical_gib:
        return cap
    return None


def check_engine_fits(
    device: str, capacity_gib: float, used_gib: float, gpu_memory_utilization: float
) -> None:
    """Raise ``EngineMemoryRefused`` as vLLM would when ``used_gib`` leaves too little."""
    requested = gpu_memory_utilization * capacity_gib
    free = capacity_gib - used_gib
    if free < requested:
        raise EngineMemoryRefused(
            f"Free memory on device {device} ({free:.2f}/{capacity_gib:.2f} GiB) on startup is "
            f"less than desired GPU memory utilization ({gpu_memory_utilization:g}, "
            f"{requested:.2f} GiB): the actor holds {used_gib:.2f} GiB of this "
            f"{capacity_gib:.2f} GiB device. Decrease gpu_memory_utilization, or offload "
            "the actor (param_offload, optimizer_offload)."
        )
