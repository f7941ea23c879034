"""The tracer's record of verl's hand-over of the actor's weights (``trials.verl.trace``):
the worker's ``update_weights``, a coroutine, with Python's collector in it, and in a
process's first call (verl's ``on_init_end``) its heap and what a full collection costs it."""

from __future__ import annotations

import asyncio
import gc
import inspect
import json
from pathlib import Path

from trials.verl import trace


class _Worker:
    """The part of verl v0.9's actor worker the tracer wraps: ``update_weights`` is a
    coroutine (Ray runs it on the actor's event loop) that collects garbage, as verl's
    ``aggressive_empty_cache`` and its bucket sender's clean-up do."""

    collections = 2

    async def update_weights(self, global_steps: int | None = None, mode: str = "auto") -> str:
        for _ in range(self.collections):
            await asyncio.sleep(0)
            gc.collect()
        return f"{mode} {global_steps}"


_Worker.update_weights.dispatch = "ONE_TO_ALL"  # type: ignore[attr-defined]  (verl's register)


def test_each_update_weights_records_its_collections_and_the_first_the_heap(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr(trace, "_update_weights_calls", [0])
    out = tmp_path / "trace.jsonl"
    trace._wrap_update_weights(_Worker, out)
    wrapped = _Worker.update_weights
    # Still a coroutine function with verl's dispatch attribute: verl's worker group calls it
    # as it did; wrapping twice changes nothing.
    assert inspect.iscoroutinefunction(wrapped) and wrapped.dispatch == "ONE_TO_ALL"
    trace._wrap_update_weights(_Worker, out)
    assert _Worker.update_weights is wrapped

    worker = _Worker()
    assert asyncio.run(worker.update_weights(global_steps=0, mode="naive")) == "naive 0"
    _Worker.collections = 3
    assert asyncio.run(worker.update_weights(1)) == "auto 1"
    first, second = (json.loads(line) for line in out.read_text().splitlines())

    assert [first["call"], second["call"]] == ["update_weights", "update_weights"]
    assert [first["call_number"], second["call_number"]] == [1, 2]
    # Every explicit gc.collect() is a full collection; each is counted and timed.
    assert first["full_gcs"] == 2 and second["full_gcs"] == 3
    assert first["gcs"] >= 2 and second["gcs"] >= 3
    for record in (first, second):
        assert 0 < record["gc_s"] <= record["wall_s"]
        assert record["start"] <= record["end"]
    # Only the first (verl's on_init_end, outside its step timers) walks the heap.
    assert first["heap_objects"] > 10_000 and first["gc_walk_s"] > 0
    assert "heap_objects" not in second and "gc_walk_s" not in second
