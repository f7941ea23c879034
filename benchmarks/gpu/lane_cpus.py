"""CPUs for the lanes of ``verl-lanes.sh``: each lane's share of its GPU's CPUs, whole cores.

A lane (one comparison on one GPU of a host with several) should find what a host of one
GPU gives it: its own cores, near its GPU. NVML names the CPUs close to each GPU
(``nvmlDeviceGetCpuAffinity``: its NUMA node's); the lanes whose GPUs share a set of
CPUs split its physical cores evenly, each lane taking every hardware thread of its
cores, so no two lanes run on the two threads of one core.

Usage, on the GPU host: ``python3 -m benchmarks.gpu.lane_cpus 0 1 2 3`` prints one line per
GPU, ``GPU CPULIST`` (the list as ``taskset -c`` takes it).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

CPU_ROOT = Path("/sys/devices/system/cpu")


def split(
    gpus: list[int], affinity: dict[int, set[int]], core_of: dict[int, tuple[int, int]]
) -> dict[int, list[int]]:
    """Each GPU's CPUs: the GPUs of one affinity set share its physical cores (``core_of``:
    a CPU's (package, core)) evenly, in the order ``gpus`` lists them; cores left over by
    the division go to no lane. Raises ``ValueError`` when a set has fewer cores than GPUs."""
    groups: dict[frozenset[int], list[int]] = {}
    for gpu in gpus:
        groups.setdefault(frozenset(affinity[gpu]), []).append(gpu)
    out: dict[int, list[int]] = {}
    for cpus, members in groups.items():
        cores = sorted({core_of[c] for c in cpus})
        share = len(cores) // len(members)
        if share == 0:
            raise ValueError(
                f"GPUs {members} share {len(cores)} core(s) ({cpu_list(cpus)}): fewer than one each"
            )
        for i, gpu in enumerate(members):
            mine = set(cores[i * share : (i + 1) * share])
            out[gpu] = sorted(c for c in cpus if core_of[c] in mine)
    return out


def cpu_list(cpus: Iterable[int]) -> str:
    """``0-3,8,10-11``: the form ``taskset -c`` and sysfs use."""
    ranges: list[list[int]] = []
    for c in sorted(cpus):
        if ranges and c == ranges[-1][1] + 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in ranges)


def host_cores(root: Path = CPU_ROOT) -> dict[int, tuple[int, int]]:
    """Each online CPU's (physical package, core), from sysfs."""
    out: dict[int, tuple[int, int]] = {}
    for topo in root.glob("cpu[0-9]*/topology"):
        cpu = int(topo.parent.name[3:])
        package = int((topo / "physical_package_id").read_text())
        out[cpu] = (package, int((topo / "core_id").read_text()))
    return out


def gpu_affinity(gpus: list[int]) -> dict[int, set[int]]:
    """The CPUs NVML names ideal for each GPU (NVML's index, as ``CUDA_VISIBLE_DEVICES``
    numbers a host's GPUs when nothing reorders them)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        words = 64  # up to 4096 CPUs, 64 per word
        out: dict[int, set[int]] = {}
        for gpu in gpus:
            mask = pynvml.nvmlDeviceGetCpuAffinity(pynvml.nvmlDeviceGetHandleByIndex(gpu), words)
            out[gpu] = {w * 64 + b for w, word in enumerate(mask) for b in range(64) if word >> b & 1}
        return out
    finally:
        pynvml.nvmlShutdown()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or not all(a.isdigit() for a in args):
        print("usage: python3 -m benchmarks.gpu.lane_cpus GPU [GPU ...]", file=sys.stderr)
        return 2
    gpus = [int(a) for a in args]
    cores = host_cores()
    affinity = {g: cpus & cores.keys() for g, cpus in gpu_affinity(gpus).items()}
    for gpu, cpus in split(gpus, affinity, cores).items():
        print(gpu, cpu_list(cpus))
    return 0


if __name__ == "__main__":
    sys.exit(main())
