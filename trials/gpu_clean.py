"""Start a CUDA trial only on GPUs nobody else is using.

A trial measures memory and throughput on the whole device, so memory someone else
holds (a previous trial's engine still exiting, another user) would make vLLM refuse a
``gpu_memory_utilization`` that fits on a clean GPU, and would slow both down.

``unclean_message`` is the rule (pure): a GPU using more than the threshold is not
clean, and the message names it, its used memory and the processes holding it.
``wait_for_clean_gpus`` reads the visible GPUs through NVML (``trials.memory``) until
the rule passes or ``wait_s`` runs out, then raises ``GpuNotClean``. Without NVML it
does not check (returns None).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from trials.errors import GpuNotClean
from trials.memory import GpuReading, gpu_readings

log = logging.getLogger(__name__)

POLL_S = 1.0


def unclean_message(readings: Sequence[GpuReading], threshold_gib: float) -> str | None:
    """None when every GPU uses at most ``threshold_gib``; otherwise what holds them."""
    dirty = [r for r in readings if r.used_gib > threshold_gib]
    if not dirty:
        return None
    parts = []
    for r in dirty:
        holders = ", ".join(
            f"pid {p.pid} ({p.name}" + (f", {p.used_gib:.2f} GiB)" if p.used_gib is not None else ")")
            for p in r.processes
        )
        parts.append(
            f"{r.gpu} has {r.used_gib:.2f} of {r.total_gib:.2f} GiB in use, held by "
            + (holders or "no process this container can see")
        )
    return (
        "; ".join(parts)
        + f". A trial needs its GPUs clean (at most {threshold_gib:g} GiB in use) to measure "
        "them; stop those processes or wait for them to exit."
    )


def wait_for_clean_gpus(
    threshold_gib: float,
    wait_s: float,
    read: Callable[[], list[GpuReading] | None] = gpu_readings,
    poll_s: float = POLL_S,
) -> list[GpuReading] | None:
    """Block until the visible GPUs are clean; the readings that passed (None: no NVML).

    Raises ``GpuNotClean`` with ``unclean_message`` after ``wait_s`` seconds.
    """
    deadline = time.monotonic() + wait_s
    while True:
        readings = read()
        if readings is None:
            log.warning("NVML is not readable here: the GPUs' baseline memory is not checked")
            return None
        message = unclean_message(readings, threshold_gib)
        if message is None:
            return readings
        if time.monotonic() >= deadline:
            raise GpuNotClean(f"waited {wait_s:g} s: {message}")
        log.info("waiting for the GPUs to be released: %s", message)
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
