"""The seconds Python's garbage collector takes in a stretch of a process's work.

verl's cut of a batch into micro-batches (``trials.verl.cut``) is pure Python and allocates
many short-lived objects; a collection of the oldest generation, which walks every object
the process holds, can land in it and cost more than the cut's own work. How often one
lands and what it costs depend on the process (its heap, what it allocated since the last
one), so the same cut of the same batch takes different seconds in verl's worker and in a
trial's process. ``GcClock`` counts, per stretch of work, the collector's seconds and its
collections of the oldest generation (``gc.callbacks``); ``heap`` describes the process's
heap. Both verl's traced worker (``trials.verl.trace``) and a trial's timed cut record them,
so the two can be set side by side.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

OLDEST = 2


class GcClock:
    """The collector's seconds and collections since ``install`` (one per process)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = 0
        self.oldest = 0  # collections of the oldest generation: a walk of the whole heap
        self._started: float | None = None

    def install(self) -> GcClock:
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)
        return self

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        if self._started is not None:
            self.seconds += time.perf_counter() - self._started
            self._started = None
        self.collections += 1
        if info.get("generation") == OLDEST:
            self.oldest += 1

    @contextmanager
    def window(self, into: dict[str, float], prefix: str = "") -> Iterator[None]:
        """Fill ``into`` with the stretch's wall, CPU and collector seconds and collections
        (``<prefix>wall_s``, ``cpu_s``, ``gc_s``, ``gcs``, ``full_gcs``)."""
        seconds, collections, oldest = self.seconds, self.collections, self.oldest
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            into[f"{prefix}wall_s"] = time.perf_counter() - wall
            into[f"{prefix}cpu_s"] = time.thread_time() - cpu
            into[f"{prefix}gc_s"] = self.seconds - seconds
            into[f"{prefix}gcs"] = float(self.collections - collections)
            into[f"{prefix}full_gcs"] = float(self.oldest - oldest)


CLOCK = GcClock()


def heap() -> dict[str, float]:
    """The objects the collector tracks (what a full collection walks), its thresholds and
    the objects frozen out of it (``gc.freeze``). Walking the heap takes a fraction of a
    second in a large process: call it outside what is timed."""
    first, second, third = gc.get_threshold()
    return {
        "heap_objects": float(len(gc.get_objects())),
        "heap_frozen": float(gc.get_freeze_count()),
        "gc_enabled": float(gc.isenabled()),
        "gc_threshold_0": float(first),
        "gc_threshold_1": float(second),
        "gc_threshold_2": float(third),
    }


def walk() -> float:
    """The seconds a full collection takes with nothing left to free: the walk of the heap
    alone, what every ``gc.collect()`` costs this process at least. One collection first, so
    the timed one finds no garbage; both cost seconds in a large process: call it outside
    what is timed."""
    gc.collect()
    t0 = time.perf_counter()
    gc.collect()
    return time.perf_counter() - t0
