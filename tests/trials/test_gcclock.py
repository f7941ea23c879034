"""The garbage collector's seconds and collections in a stretch of work."""

from __future__ import annotations

import gc

from trials.verl.gcclock import GcClock, heap, walk


def test_a_window_counts_the_collections_inside_it_only() -> None:
    clock = GcClock().install()
    try:
        gc.collect()  # before the window: not counted
        stretch: dict[str, float] = {}
        before = [generation["collections"] for generation in gc.get_stats()]
        with clock.window(stretch, "cut_"):
            garbage = [[i] for i in range(200_000)]  # may set off collections of its own
            gc.collect()  # a collection of the whole heap
            gc.collect(0)  # of the youngest generation only
            del garbage
        after = [generation["collections"] for generation in gc.get_stats()]
        assert stretch["cut_full_gcs"] == after[2] - before[2] >= 1
        assert stretch["cut_gcs"] == sum(after) - sum(before) >= 2
        assert 0 < stretch["cut_gc_s"] <= stretch["cut_wall_s"]
        assert stretch["cut_cpu_s"] > 0
        quiet: dict[str, float] = {}
        with clock.window(quiet):
            sum(range(1000))
        assert quiet["full_gcs"] == 0 and quiet["gc_s"] == 0
    finally:
        gc.callbacks.remove(clock._on_gc)


def test_install_is_idempotent_and_the_heap_is_described() -> None:
    clock = GcClock()
    clock.install().install()
    try:
        assert gc.callbacks.count(clock._on_gc) == 1
    finally:
        gc.callbacks.remove(clock._on_gc)
    held = [object() for _ in range(50_000)]
    described = heap()
    assert described["heap_objects"] > len(held)  # objects are not tracked, lists are: > 1
    assert described["gc_enabled"] == 1 and described["gc_threshold_0"] == gc.get_threshold()[0]


def test_the_walk_times_a_collection_that_finds_nothing_to_free() -> None:
    """``walk``: a first collection frees what is there, the timed second finds nothing."""
    collected: list[int] = []

    def record(phase: str, info: dict) -> None:
        if phase == "stop":
            collected.append(info["collected"])

    gc.disable()  # no collection of its own frees the garbage before the walk
    gc.callbacks.append(record)
    try:
        for _ in range(1000):  # cyclic garbage only a collection frees
            cycle: list = []
            cycle.append(cycle)
        del cycle
        seconds = walk()
    finally:
        gc.callbacks.remove(record)
        gc.enable()
    assert seconds > 0
    # The first collection frees the test's cycles; the timed one may find a little garbage
    # that other threads of the process (a pytest-xdist worker's) left in between.
    assert collected[0] >= 999 and collected[-1] < 999
