"""Whether a job's device can run any trial at all: checked at submission and before a run.

A job for ``cuda`` on a cluster without a GPU would record every proposal ``invalid``; a
CPU job whose memory cap exceeds the machine would be killed by the kernel instead of
measured against its cap; a model whose weights and optimizer state alone exceed the CPU
cap OOMs in every trial. Each is refused up front, with the numbers.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from autotuner.errors import SpecError
from autotuner.memory import DTYPE_BYTES, GIB
from autotuner.spec import JobSpec, ModelArch

# The actor as verl trains it: fp32 weights, fp32 gradients, AdamW's two fp32 moments.
ACTOR_BYTES_PER_PARAM = 16
_CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


def host_memory_gib() -> float:
    """This machine's memory, or its container's (cgroup) limit where that is lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in _CGROUP_LIMITS:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total / GIB


def cpu_floor_gib(spec: JobSpec, arch: ModelArch) -> float:
    """The least memory one CPU trial of the job holds, whatever its knobs: the actor rank's
    share of weights, gradients and optimizer state (train), the engine's weights (rollout)."""
    w = spec.workload
    actor = ACTOR_BYTES_PER_PARAM * arch.num_parameters / spec.cluster.world_size if w.measures_train else 0
    engine = DTYPE_BYTES[w.dtype] * arch.num_parameters if w.measures_rollout else 0
    return (actor + engine) / GIB


def check_device(
    spec: JobSpec,
    arch: ModelArch,
    device: Literal["cuda", "cpu"],
    default_cpu_cap_gib: float,
    cluster_gpus: float | None,
) -> None:
    """Refuse a job no trial of which could run.

    ``default_cpu_cap_gib``: the memory a CPU trial may use when the job's
    ``device_memory_gib`` is unset (the service's setting); ``cluster_gpus``: the GPUs
    the trials' Ray cluster has (None: unknown).

    Raises:
        SpecError: naming the field, the numbers and the fix.
    """
    if device == "cuda" and cluster_gpus is not None and cluster_gpus <= 0:
        raise SpecError(
            "cluster.device",
            "cuda, but the Ray cluster that runs the trials has no GPU, so no trial could start; "
            "use device cpu (tiny models) or auto, or add GPU nodes to the cluster",
        )
    if device != "cpu":
        return
    host = host_memory_gib()
    asked = spec.cluster.device_memory_gib
    if asked is not None and asked > host:
        raise SpecError(
            "cluster.device_memory_gib",
            f"{asked:g} GiB exceeds this machine's memory ({host:.1f} GiB): a CPU trial is held to "
            "its cap for real, so the cap must fit the machine; lower it",
        )
    cap = min(asked if asked is not None else default_cpu_cap_gib, host)
    floor = cpu_floor_gib(spec, arch)
    if floor > cap:
        raise SpecError(
            "workload.model",
            f"{arch.name} has {arch.num_parameters / 1e9:.2f}B parameters: a CPU trial holds at "
            f"least {floor:.1f} GiB of weights and optimizer state for it, more than the "
            f"{cap:.1f} GiB a CPU trial may use here (cluster.device_memory_gib, at most this "
            f"machine's {host:.1f} GiB); pick a smaller model or run the job on GPUs",
        )
