"""Make a device memory cap real for the code inside ``device_memory_cap(...)``.

- ``cpu``: the soft ``RLIMIT_DATA`` of this process is set to its current data segment
  (``VmData``) plus the cap, so an allocation past the cap fails in the allocator
  (torch raises "DefaultCPUAllocator: can't allocate memory", Python ``MemoryError``),
  exactly where a GPU would raise its out-of-memory error. ``RLIMIT_DATA`` counts
  private writable mappings only (Linux >= 4.7), i.e. what the heap really holds;
  ``RLIMIT_AS`` would also count reserved address space (thread stacks, shared
  libraries, guard regions), which is large and unrelated to the phase's needs.
- ``cuda``: ``torch.cuda.set_per_process_memory_fraction(cap / total)`` on device 0.

The previous limit is restored on exit. Nothing happens when ``cap_gib`` is None.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

GIB = 1 << 30
# The memory a CPU 'device' has when the spec sets no cap (sizes the vLLM KV cache).
DEFAULT_CPU_CAP_GIB = 8.0


def vm_data_bytes() -> int:
    """This process's data segment (``VmData`` in /proc/self/status), in bytes."""
    return _status_bytes("VmData:")


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise OSError(f"{key} not found in /proc/self/status")


@contextmanager
def device_memory_cap(device: str, cap_gib: float | None) -> Iterator[None]:
    if cap_gib is None:
        yield
    elif device == "cuda":
        with _cuda_cap(cap_gib):
            yield
    else:
        with _cpu_cap(cap_gib):
            yield


@contextmanager
def _cpu_cap(cap_gib: float) -> Iterator[None]:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    base = vm_data_bytes()
    limit = base + int(cap_gib * GIB)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    log.info(
        "memory cap: RLIMIT_DATA %.2f GiB (VmData %.2f GiB + cap %.2f GiB; VmSize %.2f GiB)",
        limit / GIB,
        base / GIB,
        cap_gib,
        _status_bytes("VmSize:") / GIB,
    )
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


@contextmanager
def _cuda_cap(cap_gib: float) -> Iterator[None]:
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    fraction = min(1.0, cap_gib * GIB / total)
    torch.cuda.set_per_process_memory_fraction(fraction, 0)
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
