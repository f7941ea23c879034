"""Where verl's training phases spend their time inside its workers (opt-in).

verl's ``timing_s/old_log_prob``, ``timing_s/ref`` and ``timing_s/update_actor`` are
measured by its driver around a worker-group call: they hold the driver's batch
conversions, Ray's transfers and the worker's own pass. With ``VerlRunSpec.trace`` the
runner has verl's Ray run ``install`` in every worker process it starts
(``ray_init.runtime_env.worker_process_setup_hook``), and ``install`` wraps verl v0.9's
unified-engine worker (``verl.workers.engine_workers.TrainingWorker``) and its FSDP engine
(``verl.workers.engine.fsdp.transformer_impl``) so that each call appends one JSON line to
``$AUTOTUNER_VERL_TRACE/trace-<pid>.jsonl``:

- ``infer_batch`` (a log-prob pass; ``role`` ``actor`` or ``ref``) and ``train_mini_batch``
  (the actor's update): the worker's seconds, the GPU synchronised at both ends;
- ``forward_backward_batch`` (one pass over a batch's micro-batches; the update runs one per
  mini-batch): its seconds, the seconds verl took to cut it into micro-batches
  (``prepare_s``), and per micro-batch its tokens and its GPU seconds (CUDA events at each
  micro-batch's start and at the end: the forward, the backward where there is one, and
  any time the GPU waited for the CPU) and its CPU seconds (``micro_batch_cpu_s``: from
  its start to the next one's on the CPU's clock; ``micro_batch_thread_s``: the CPU seconds the
  pass's thread ran in it, the forward and the loss, PyTorch running a GPU's backward on a
  thread of its own), the process's CPU seconds in the pass (``process_cpu_s``, every
  thread's) and the host's busy cores over it (``host_busy_cores``, passes of a second or
  more: ``trials.profiling.busy_cores``), and the batch's entries by kind (``data_keys``:
  nested, dense or other tensors, the ones verl's cut has to slice); Python's collector in
  the cut and in the whole pass (``prepare_cpu_s``, ``prepare_gc_s``, ``prepare_gcs``,
  ``prepare_full_gcs``; ``pass_gc_s``, ``pass_gcs``, ``pass_full_gcs``:
  ``trials.verl.gcclock``) and, in the process's first pass, its heap (``heap_objects``...);
- ``optimizer_step``: its seconds;
- ``update_weights`` (the actor's worker, ``verl.workers.engine_workers.ActorRolloutRefWorker``:
  verl's hand-over of the actor's weights to its rollout, what its driver's
  ``timing_s/update_weights`` holds): its seconds and Python's collector in it
  (``gc_s``, ``gcs``, ``full_gcs``), and, in the process's first (verl's ``on_init_end``,
  outside its step timers), before the call, the process's heap and what a full collection
  costs it with nothing to free (``gc_walk_s``, ``trials.verl.gcclock.walk``);

and, with ``AUTOTUNER_PROFILE`` set (``trials.profiling``), a profile of a few micro-batches
of one update pass of each process (profiled after the pass's first micro-batches and
recorded as usual, the profiler's cost included);

each with the CUDA caching allocator's retries (``alloc_retries``: a full free-and-retry
of the cache, slow), device allocations and frees during the call. The syncs at the ends
of a call cost what a ``.item()`` costs; nothing is added inside a micro-batch.

Without ``AUTOTUNER_VERL_TRACE`` or without verl's unified-engine worker, ``install``
changes nothing. ``read_trace`` reads the records back in the order they were written.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trials.profiling import BUSY_MIN_S, MicroBatchProfiler, busy_cores, host_cpu, pass_number
from trials.profiling import folder as profile_folder
from trials.verl.gcclock import CLOCK, heap, walk

TRACE_ENV = "AUTOTUNER_VERL_TRACE"
_PASS_COLLECTOR = ("pass_gc_s", "pass_gcs", "pass_full_gcs")
SETUP_HOOK = "trials.verl.trace.install"
_ALLOC_STATS = {
    "alloc_retries": "num_alloc_retries",
    "device_allocs": "num_device_alloc",
    "device_frees": "num_device_free",
}
# The micro-batch marks of the engine's pass now running (one pass at a time per process),
# and the seconds its ``prepare_micro_batches`` took.
_marks: list[tuple[Any, int, float, float]] | None = None  # (CUDA event, tokens, CPU clock, thread time)
_last_prepare: dict[str, float] = {}
_heap_recorded = [False]
_update_weights_calls = [0]
# The profile of this process's update pass number ``profiling.pass_number()``, while it runs.
_profiler: MicroBatchProfiler | None = None
_update_passes = [0]
_micro_batch_index = [0]


def install() -> None:
    """Wrap verl's worker and engine in this process when ``AUTOTUNER_VERL_TRACE`` is set."""
    folder = os.environ.get(TRACE_ENV)
    if not folder:
        return
    try:
        from verl.workers import engine_workers
        from verl.workers.engine.fsdp import transformer_impl
    except ImportError:
        return
    out = Path(folder) / f"trace-{os.getpid()}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    worker = engine_workers.TrainingWorker
    engine = transformer_impl.FSDPEngine
    _wrap_update_weights(engine_workers.ActorRolloutRefWorker, out)
    _wrap(worker, "infer_batch", out, _role_of_worker)
    _wrap(worker, "train_mini_batch", out, _role_of_worker)
    _wrap(engine, "optimizer_step", out, _role_of_engine)
    _wrap_pass(engine, out)
    _wrap_micro_batches(transformer_impl)
    _wrap_forward_step(transformer_impl.FSDPEngineWithLMHead)


def read_trace(folder: Path) -> list[dict[str, Any]]:
    """Every record under ``folder``, by the time each call ended (a torn line skipped)."""
    records: list[dict[str, Any]] = []
    for path in sorted(Path(folder).glob("trace-*.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
    return sorted(records, key=lambda r: r.get("end", 0.0))


# The trial's sub-phase each pass of verl's engine belongs to, by (role, forward only).
PASS_PHASES = {
    ("actor", True): "old_log_prob",
    ("ref", True): "ref_log_prob",
    ("actor", False): "update_actor",
}


def measured_passes(trace: list[dict[str, Any]], steps: int, warmup: int) -> dict[str, list[dict[str, Any]]]:
    """Per sub-phase (``old_log_prob``, ``ref_log_prob``, ``update_actor``): the records of
    verl's passes in the ``steps - warmup`` measured steps of a run of ``steps`` steps. Every
    step runs the same number of passes of a sub-phase (one per log-prob call, one per update
    mini-batch), the warm-up's first."""
    out: dict[str, list[dict[str, Any]]] = {}
    for key, phase in PASS_PHASES.items():
        passes = [
            r
            for r in trace
            if r.get("call") == "forward_backward_batch"
            and (r.get("role"), bool(r.get("forward_only"))) == key
        ]
        if passes and steps > warmup:
            out[phase] = passes[len(passes) // steps * warmup :]
    return out


def micro_batches(
    trace: list[dict[str, Any]], steps: int, warmup: int
) -> dict[str, tuple[list[float], list[int]]]:
    """Per sub-phase: the seconds and tokens of verl's micro-batches in the measured steps
    (``measured_passes``)."""
    return {
        phase: (
            [s for r in passes for s in r.get("micro_batch_s", [])],
            [n for r in passes for n in r.get("micro_batch_tokens", [])],
        )
        for phase, passes in measured_passes(trace, steps, warmup).items()
    }


def _role_of_worker(worker: Any) -> str:
    return _role_of_engine(getattr(worker, "engine", None))


def _role_of_engine(engine: Any) -> str:
    config = getattr(engine, "engine_config", None)
    return "ref" if getattr(config, "forward_only", False) else "actor"


def _cuda() -> Any:
    import torch

    return torch.cuda if torch.cuda.is_available() else None


def _alloc_counts(cuda: Any) -> dict[str, int]:
    if cuda is None:
        return {}
    stats = cuda.memory_stats()
    return {name: int(stats.get(key, 0)) for name, key in _ALLOC_STATS.items()}


def _write(out: Path, record: dict[str, Any]) -> None:
    with open(out, "a") as f:
        f.write(json.dumps(record) + "\n")


def _timed_call(
    out: Path, call: str, role: str, fn: Callable[[], Any], extra: Callable[[], dict[str, Any]] | None = None
) -> Any:
    """Run ``fn`` between two GPU syncs and append its record to ``out``."""
    cuda = _cuda()
    if cuda is not None:
        cuda.synchronize()
    before = _alloc_counts(cuda)
    start = time.time()
    t0 = time.perf_counter()
    result = fn()
    if cuda is not None:
        cuda.synchronize()
    wall_s = time.perf_counter() - t0
    after = _alloc_counts(cuda)
    record: dict[str, Any] = {"call": call, "role": role, "pid": os.getpid(), "start": start}
    record.update(end=time.time(), wall_s=wall_s)
    record.update({name: after[name] - before.get(name, 0) for name in after})
    if cuda is not None:
        record["max_allocated_gib"] = cuda.max_memory_allocated() / (1 << 30)
        record["reserved_gib"] = cuda.memory_reserved() / (1 << 30)
    if extra is not None:
        record.update(extra())
    _write(out, record)
    return result


def _wrap(cls: type, name: str, out: Path, role_of: Callable[[Any], str]) -> None:
    original = getattr(cls, name, None)
    if original is None or getattr(original, "_autotuner_traced", False):
        return

    @functools.wraps(original)
    def traced(self: Any, *args: Any, **kwargs: Any) -> Any:
        return _timed_call(out, name, role_of(self), lambda: original(self, *args, **kwargs))

    traced._autotuner_traced = True  # type: ignore[attr-defined]
    setattr(cls, name, traced)


def _wrap_update_weights(worker: type, out: Path) -> None:
    """The worker's ``update_weights`` (a coroutine: Ray runs it on the actor's event loop),
    with Python's collector in it; the process's heap and its walk before the first."""
    original = getattr(worker, "update_weights", None)
    if original is None or getattr(original, "_autotuner_traced", False):
        return

    @functools.wraps(original)
    async def traced(self: Any, *args: Any, **kwargs: Any) -> Any:
        _update_weights_calls[0] += 1
        record: dict[str, Any] = {"call": "update_weights", "role": "actor", "pid": os.getpid()}
        if _update_weights_calls[0] == 1:  # verl's on_init_end: no step timer runs
            record.update(heap(), gc_walk_s=walk())
        collector: dict[str, float] = {}
        record["start"] = time.time()
        with CLOCK.install().window(collector):
            result = await original(self, *args, **kwargs)
        record.update(end=time.time(), wall_s=collector.pop("wall_s"), call_number=_update_weights_calls[0])
        record.update(collector)
        _write(out, record)
        return result

    traced._autotuner_traced = True  # type: ignore[attr-defined]
    setattr(worker, "update_weights", traced)  # noqa: B010


def _wrap_pass(engine: type, out: Path) -> None:
    """``forward_backward_batch`` with its micro-batches' marks and ``prepare_s``."""
    original = getattr(engine, "forward_backward_batch")  # noqa: B009  (a verl class: untyped here)
    if getattr(original, "_autotuner_traced", False):
        return

    @functools.wraps(original)
    def traced(self: Any, data: Any, loss_function: Any, forward_only: bool = False) -> Any:
        global _marks, _profiler
        _marks = []
        _micro_batch_index[0] = 0
        _last_prepare.clear()
        profiles = profile_folder()
        if profiles is not None and not forward_only and _role_of_engine(self) == "actor":
            _update_passes[0] += 1
            if _update_passes[0] == pass_number():
                _profiler = MicroBatchProfiler(profiles, "verl-update_actor")
        state: dict[str, Any] = {}
        collector: dict[str, float] = {}

        def run() -> Any:
            state["host"], state["process"], state["wall"] = (
                host_cpu(),
                time.process_time(),
                time.perf_counter(),
            )
            with CLOCK.install().window(collector, "pass_"):
                result = original(self, data, loss_function, forward_only=forward_only)
            cuda = _cuda()
            if cuda is not None:
                end = cuda.Event(enable_timing=True)
                end.record()
                state["end"] = end
            state["cpu_end"], state["thread_end"] = time.perf_counter(), time.thread_time()
            wall = state["cpu_end"] - state["wall"]
            state["process_cpu_s"] = time.process_time() - state["process"]
            if wall >= BUSY_MIN_S:
                state["host_busy_cores"] = busy_cores(state["host"], host_cpu(), wall)
            return result

        def extra() -> dict[str, Any]:
            marks, end = _marks or [], state.get("end")
            seconds = []
            if end is not None:
                events = [event for event, *_ in marks] + [end]
                seconds = [events[i].elapsed_time(events[i + 1]) / 1000 for i in range(len(marks))]
            clocks = [clock for _, _, clock, _ in marks] + [state.get("cpu_end", 0.0)]
            threads = [thread for *_, thread in marks] + [state.get("thread_end", 0.0)]
            record: dict[str, Any] = {
                "forward_only": bool(forward_only),
                "micro_batches": len(marks),
                "micro_batch_tokens": [tokens for _, tokens, _, _ in marks],
                "micro_batch_s": seconds,
                # the CPU's seconds from each micro-batch's start to the next's (the last: to
                # the pass's end): where they match the GPU's, the GPU waited on the CPU
                "micro_batch_cpu_s": [clocks[i + 1] - clocks[i] for i in range(len(marks))],
                # the seconds the pass's thread ran on a CPU in each (the forward and the loss;
                # the backward runs on PyTorch's own thread)
                "micro_batch_thread_s": [threads[i + 1] - threads[i] for i in range(len(marks))],
                "process_cpu_s": state.get("process_cpu_s", 0.0),
                "prepare_s": _last_prepare.get("prepare_wall_s", 0.0),
                "data_keys": _keys(data),
            }
            record.update({k: v for k, v in _last_prepare.items() if k != "prepare_wall_s"})
            record.update({k: v for k, v in collector.items() if k in _PASS_COLLECTOR})
            if "host_busy_cores" in state:
                record["host_busy_cores"] = state["host_busy_cores"]
            if not _heap_recorded[0]:  # once per process: walking the heap takes a while
                _heap_recorded[0] = True
                record.update(heap())
            return record

        try:
            return _timed_call(out, "forward_backward_batch", _role_of_engine(self), run, extra)
        finally:
            _marks = None
            if _profiler is not None:
                _profiler.finish()
                _profiler = None

    traced._autotuner_traced = True  # type: ignore[attr-defined]
    setattr(engine, "forward_backward_batch", traced)  # noqa: B010


def _keys(data: Any) -> dict[str, list[str]]:
    """The batch's entries by kind: what verl's cut into micro-batches has to slice."""
    kinds: dict[str, list[str]] = {"nested": [], "dense": [], "other": []}
    try:
        for key, value in data.items():
            is_tensor = hasattr(value, "is_nested") and hasattr(value, "dtype")
            kind = ("nested" if value.is_nested else "dense") if is_tensor else "other"
            kinds[kind].append(str(key))
    except Exception:  # noqa: BLE001  (a diagnostic never breaks the pass)
        pass
    return kinds


def _wrap_micro_batches(module: Any) -> None:
    """The engine module's ``prepare_micro_batches``, timed on the CPU."""
    original = module.prepare_micro_batches
    if getattr(original, "_autotuner_traced", False):
        return

    @functools.wraps(original)
    def traced(*args: Any, **kwargs: Any) -> Any:
        with CLOCK.install().window(_last_prepare, "prepare_"):
            return original(*args, **kwargs)

    traced._autotuner_traced = True  # type: ignore[attr-defined]
    module.prepare_micro_batches = traced


def _tokens(micro_batch: Any) -> int:
    try:
        ids = micro_batch["input_ids"]
        return int(ids.values().numel()) if getattr(ids, "is_nested", False) else int(ids.numel())
    except Exception:  # noqa: BLE001  (a diagnostic never breaks the pass)
        return 0


def _wrap_forward_step(engine: type) -> None:
    """Mark each micro-batch's start on the GPU stream (no sync)."""
    original = getattr(engine, "forward_step")  # noqa: B009
    if getattr(original, "_autotuner_traced", False):
        return

    @functools.wraps(original)
    def traced(self: Any, micro_batch: Any, *args: Any, **kwargs: Any) -> Any:
        if _profiler is not None:
            _profiler.before(_micro_batch_index[0])
        _micro_batch_index[0] += 1
        cuda = _cuda()
        if _marks is not None and cuda is not None:
            event = cuda.Event(enable_timing=True)
            event.record()
            _marks.append((event, _tokens(micro_batch), time.perf_counter(), time.thread_time()))
        return original(self, micro_batch, *args, **kwargs)

    traced._autotuner_traced = True  # type: ignore[attr-defined]
    setattr(engine, "forward_step", traced)  # noqa: B010
