"""SGLang's offline ``Engine`` with dummy weights, as verl's SGLang rollout builds it.

The spec's ``model_config`` is written as ``config.json`` into a directory named by its
content (``dummy_model_dir``, shared by the host's trials of the model) and
loaded with ``load_format="dummy"`` and no tokenizer; prompts go in as token ids
(``input_ids``) and every request generates exactly its ``max_new_tokens``
(``ignore_eos``). The knobs go in as the arguments the knob table names for SGLang
(``RolloutKnobs.engine_args``), which are those verl v0.9's ``SGLangHttpServer.launch_server``
passes (``verl/workers/rollout/sglang_rollout/async_sglang_server.py`` at tag v0.9.0;
docs/verl-rules.md section 1):

- ``gpu_memory_utilization`` -> ``mem_fraction_static``: a different budget than vLLM's.
  SGLang sizes its KV pool as what is free when it starts, times ``mem_fraction_static``,
  less its weights; activations and CUDA graphs come out of the rest. The actor resident
  beside it is therefore not part of its budget, where vLLM's fraction counts the whole
  device;
- ``max_num_seqs`` -> ``max_running_requests``; ``tensor_model_parallel_size`` ->
  ``tp_size``; ``enforce_eager`` -> ``disable_cuda_graph``;
- chunked prefill: verl passes no ``max_num_batched_tokens`` to SGLang; its chunk size is
  ``engine_kwargs.sglang.chunked_prefill_size``, which the control plane's knob of that
  path puts in the trial's ``max_num_batched_tokens`` field (the engine's tokens per
  step), passed as ``chunked_prefill_size``;
- as verl does: ``enable_memory_saver`` and ``enable_weights_cpu_backup`` (so ``sleep``
  releases weights and KV cache with ``release_memory_occupation`` and ``wake_up`` takes
  them back, by tag, with ``resume_memory_occupation``), no ``context_length`` (verl does
  not pass ``max_model_len``); ``engine_kwargs`` merged last.
- the weight sync (``receive_weights``): each bucket's tensors go to
  ``Engine.update_weights_from_tensor`` (SGLang shares them with its workers by CUDA IPC
  and runs its model's ``load_weights``), the cache flushed with the last, as verl's
  ``update_weights`` does.
- unlike verl: the attention backend is SGLang's own choice (FA3 on Hopper), where verl
  v0.9 asks for ``flashinfer`` on SGLang >= 0.5.12 (FA3's CUDA-graph capture was broken
  there, SGLang #22800). FlashInfer's attention kernels are compiled on first use, which
  an air-gapped host without a CUDA compiler cannot do; SGLang 0.5.17 with its default ran
  there (../shared/gpu-host/README.md). ``ATTENTION_BACKEND`` says which.

Metrics are the vLLM backend's: ``kv_cache_tokens`` is the scheduler's
``max_total_num_tokens``; ``preemptions`` counts the requests SGLang retracted ("KV cache
pool is full. Retract requests. #retracted_reqs: N", logged at warning level, hence
``log_level="warning"``), read from the captured log after a marker written before each
generation.

Short of KV cache, SGLang cuts a request's ``max_new_tokens`` to what its pool holds and
returns short outputs without failing. Lengths are counted from the outputs and the
caller (``trials.rollout.phase``) turns short ones into ``KvCacheExhausted``; an abort's
message is kept in ``Generation.notes``.

Failures: SGLang's processes signal the trial process (SIGQUIT) when one of them fails,
and its own handlers answer by killing the whole process tree, this one included. The
backend installs its own handler instead (through ``custom_sigquit_handler`` while the
engine starts, then in place of the tokenizer manager's), which raises ``EngineDied`` in
the main thread; its message sends the classification to the engine's log (a scheduler's
"CUDA out of memory" is an ``oom``). An ``EngineWatch`` over the engine's processes covers
a death SGLang does not report. The backend runs on CUDA GPUs only.

The engine's event loop is uvloop's (SGLang installs its policy on import), and every
blocking call (``generate``, release, resume) is ``engine.loop.run_until_complete``.
Three of its rules shape the code (``_take_over_sigquit``, ``_LoopFailures``):

- ``TokenizerManager.auto_create_handle_loop`` puts the task that reads the engine's
  outputs on the *running* loop (``get_or_create_event_loop``); called outside one it makes
  a new loop that never runs, and every ``generate`` then waits for ever;
- uvloop's ``remove_signal_handler`` returns False and removes nothing unless the loop runs;
- while uvloop runs, Python signal handlers run inside its ``Loop._read_from_self``
  callback, and what they raise (other than ``KeyboardInterrupt``, ``SystemExit``) goes to
  the loop's exception handler, which only logs it: ``EngineDied`` from a signal handler
  would not end the blocked call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from trials import logcapture
from trials.errors import ConfigRejected, EngineDied, EngineMemoryRefused, WeightSyncFailed
from trials.memory import gpu_readings, gpu_total_gib
from trials.rollout.base import (
    EngineFacts,
    Generation,
    RolloutBackend,
    WeightBucket,
    dummy_model_dir,
    knob_arguments,
)
from trials.rollout.children import child_pids, death_probe, new_children, reap_new_children
from trials.rollout.watch import EngineWatch
from trials.types import TrialSpec

log = logging.getLogger(__name__)

# None: SGLang's default (FA3 on Hopper); verl's "flashinfer" needs its JIT compiler.
ATTENTION_BACKEND: str | None = None
LOG_LEVEL = "warning"  # SGLang's retraction lines are warnings
SLEEP_TAGS = ("kv_cache", "weights")  # what verl's hybrid engine releases
SHUTDOWN_WAIT_S = 30.0
FAILED_START_WAIT_S = 5.0
_RETRACTED = re.compile(r"KV cache pool is full\. Retract requests\. #retracted_reqs: (\d+)")
_FAILURE_LINE = re.compile(
    r"Scheduler hit an exception|crashed with exit code|scheduler died|"
    r"out of memory|Not enough memory|Error:"
)


def engine_kwargs(
    spec: TrialSpec, dtype: str, model_dir: str, emulated: tuple[float, float] | None = None
) -> dict[str, Any]:
    """The ``sglang.Engine(...)`` arguments for ``spec``: the knobs' (``knob_arguments``), the
    backend's own, ``engine_kwargs`` merged last.

    ``emulated``: (capacity, held) GiB when the GPU stands in for a smaller one of
    ``capacity`` (``device_memory_cap_gib``) and ``held`` GiB are in use as the engine starts:
    the fraction is rescaled so that SGLang takes what it would take there.
    """
    if spec.device != "cuda":
        raise ConfigRejected(
            f"the sglang rollout backend runs on CUDA GPUs only, not on {spec.device!r}; "
            "use engine vllm on a CPU"
        )
    r = spec.rollout
    kwargs: dict[str, Any] = {
        "model_path": model_dir,
        "load_format": "dummy",
        "skip_tokenizer_init": True,
        "dtype": dtype,
        **knob_arguments(spec),
        "enable_memory_saver": True,
        "enable_weights_cpu_backup": True,
        "random_seed": spec.seed,
        "log_level": LOG_LEVEL,
        "skip_server_warmup": True,
        "custom_sigquit_handler": _on_sigquit,
    }
    if ATTENTION_BACKEND is not None:
        kwargs["attention_backend"] = ATTENTION_BACKEND
    if emulated is not None:
        capacity, held = emulated
        kwargs["mem_fraction_static"] = emulated_fraction(
            r.gpu_memory_utilization, capacity, gpu_total_gib() or capacity, held
        )
    kwargs.update(r.engine_kwargs)
    return kwargs


def emulated_fraction(fraction: float, capacity_gib: float, physical_gib: float, held_gib: float) -> float:
    """``mem_fraction_static`` on a ``physical_gib`` GPU that gives SGLang the budget
    ``fraction`` gives it on a ``capacity_gib`` one, ``held_gib`` being in use on both:
    SGLang's budget is the fraction of the memory free when it starts."""
    free_there = capacity_gib - held_gib
    if free_there <= 0:
        raise EngineMemoryRefused(
            f"Not enough memory. Please try to increase --mem-fraction-static: the "
            f"{capacity_gib:.2f} GiB device already holds {held_gib:.2f} GiB (the actor), "
            "nothing is left for SGLang. Offload the actor (param_offload, optimizer_offload)."
        )
    return fraction * free_there / max(physical_gib - held_gib, free_there)


# SIGQUIT is how SGLang's processes (and its watchdog over them) say that one failed. One
# raise per engine: armed while the engine runs, disarmed by the first report.
_sigquit_armed = threading.Event()


def _on_sigquit(signum: int, frame: object) -> None:
    """Raise ``EngineDied`` in the main thread (module level: SGLang pickles it with its
    server arguments into its processes)."""
    if not _sigquit_armed.is_set():
        return  # shutting down, or the failure was raised already
    _sigquit_armed.clear()
    said = [line.strip() for line in logcapture.current_text().splitlines() if _FAILURE_LINE.search(line)]
    detail = f" (last: {said[-1][-300:]})" if said else ""
    raise EngineDied(
        f"an SGLang process failed and signalled the trial (SIGQUIT){detail}; see the engine's log above"
    )


class SglangBackend(RolloutBackend):
    """``RolloutBackend`` over ``sglang.Engine`` (see the module docstring)."""

    name = "sglang"

    def __init__(self) -> None:
        self._engine: Any = None
        self._model_dir: str | None = None
        self._children_before: set[int] = set()
        self._watch: EngineWatch | None = None
        self._previous_sigquit: Any = None
        self._owns_sigquit = False
        self._failures = _LoopFailures()
        self._generations = 0
        self._retracted: int | None = 0
        self._kv_tokens: int | None = None
        self.import_s = 0.0

    def start(self, spec: TrialSpec, dtype: str) -> float:
        self._children_before = child_pids()
        self._model_dir = dummy_model_dir(spec)
        t0 = time.perf_counter()
        from sglang.srt.entrypoints.engine import Engine

        self.import_s = time.perf_counter() - t0
        kwargs = engine_kwargs(spec, dtype, self._model_dir, _emulated(spec))
        log.info("starting SGLang: %s", {k: v for k, v in kwargs.items() if not callable(v)})
        self._arm_sigquit()
        t0 = time.perf_counter()
        with _logging_kept():
            self._engine = Engine(**kwargs)
        startup_s = time.perf_counter() - t0
        self.can_sleep = bool(kwargs.get("enable_memory_saver"))
        self._take_over_sigquit()
        self._kv_tokens = _kv_cache_tokens(self._engine)
        self._watch = EngineWatch(self._death_probe())
        self._watch.start()
        return startup_s

    def generate(self, prompts: list[list[int]], max_tokens: list[int]) -> Generation:
        params = [{"max_new_tokens": m, "ignore_eos": True, "temperature": 1.0} for m in max_tokens]
        self._generations += 1
        marker = f"[trials.rollout.sglang] generation {self._generations} of trial process {os.getpid()}"
        sys.stderr.write(marker + "\n")
        sys.stderr.flush()
        t0 = time.perf_counter()
        outputs = self._failures.call(self._engine.generate, input_ids=prompts, sampling_params=params)
        elapsed = time.perf_counter() - t0
        self._count_retractions(marker)
        if isinstance(outputs, dict):
            outputs = [outputs]
        counts, notes = [], {}
        for i, out in enumerate(outputs):
            meta = out.get("meta_info") or {}
            ids = out.get("output_ids")
            counts.append(len(ids) if ids is not None else int(meta.get("completion_tokens", 0)))
            reason = meta.get("finish_reason")
            if isinstance(reason, dict) and reason.get("type") == "abort":
                notes[i] = str(reason.get("message") or "aborted")
        return Generation(counts, elapsed, notes)

    def facts(self) -> EngineFacts:
        return EngineFacts(kv_cache_tokens=self._kv_tokens, preemptions=self._retracted)

    def sleep(self) -> float:
        if not self.can_sleep:
            return super().sleep()
        t0 = time.perf_counter()
        self._failures.call(self._engine.release_memory_occupation, tags=list(SLEEP_TAGS))
        return time.perf_counter() - t0

    def wake_up(self, tags: list[str] | None = None) -> float:
        if not self.can_sleep:
            return super().wake_up(tags)
        wanted = list(SLEEP_TAGS) if tags is None else [t for t in tags if t in SLEEP_TAGS]
        t0 = time.perf_counter()
        self._failures.call(self._engine.resume_memory_occupation, tags=wanted)
        if "kv_cache" in wanted:  # the cache's contents did not survive (verl does the same)
            self._failures.call(self._engine.flush_cache)
        return time.perf_counter() - t0

    def receive_weights(self, bucket: WeightBucket) -> None:
        named = bucket.views()
        if not named:
            if bucket.last:
                self._failures.call(self._engine.flush_cache)
            return
        answer = self._failures.call(
            self._engine.update_weights_from_tensor,
            named_tensors=named,
            load_format=None,
            flush_cache=bucket.last,
        )
        if isinstance(answer, tuple) and answer and not answer[0]:
            raise WeightSyncFailed(f"SGLang did not load a bucket of {len(named)} tensors: {answer[-1]}")

    def shutdown(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.stop()  # from here on, the engine's processes exit on purpose
        _sigquit_armed.clear()
        engine, self._engine = self._engine, None
        if engine is not None:
            try:
                engine.shutdown()
            except Exception:
                log.exception("SGLang engine shutdown failed; killing its processes")
            del engine
        wait_s = SHUTDOWN_WAIT_S if self._owns_sigquit else FAILED_START_WAIT_S
        reap_new_children(self._children_before, wait_s)
        self._restore_sigquit()
        self._model_dir = None  # shared by the host's trials of this model (dummy_model_dir)

    # ------------------------------------------------------------------ internals

    def _arm_sigquit(self) -> None:
        """Before the engine starts: SGLang installs ``_on_sigquit`` (its
        ``custom_sigquit_handler``) for the start-up; remember what was there."""
        if threading.current_thread() is threading.main_thread():
            self._previous_sigquit = signal.getsignal(signal.SIGQUIT)
        _sigquit_armed.set()

    def _take_over_sigquit(self) -> None:
        """Once started: SGLang's tokenizer manager would answer SIGQUIT by killing this
        process tree (a handler on its event loop, installed with the loop's output reader
        on first use); install them now, then put ``_on_sigquit`` in that handler's place.
        Its SIGTERM handler (drain and exit, for a server) gives way to the trial's own
        (kill the process group). Both steps run inside ``engine.loop`` (see the module
        docstring: the reader must be on the loop ``generate`` runs, and uvloop removes a
        handler only while it runs); from then on, what a signal handler raises while the
        engine's loop runs ends the blocked call (``_LoopFailures``)."""
        if threading.current_thread() is not threading.main_thread():
            return
        manager = getattr(self._engine, "tokenizer_manager", None)
        create_loop = getattr(manager, "auto_create_handle_loop", None)
        loop = getattr(self._engine, "loop", None)
        if create_loop is None or loop is None:
            log.warning(
                "this SGLang has no tokenizer-manager loop to take SIGQUIT from; a failed "
                "SGLang process will kill the trial process (the launcher records it)"
            )
            return
        sigterm = signal.getsignal(signal.SIGTERM)

        async def take_over() -> None:
            create_loop()  # on the running loop: engine.loop
            loop.remove_signal_handler(signal.SIGQUIT)
            signal.signal(signal.SIGQUIT, _on_sigquit)
            loop.remove_signal_handler(signal.SIGTERM)

        loop.run_until_complete(take_over())
        if sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)
        reader_loop = getattr(manager, "event_loop", loop)
        if reader_loop is not loop:  # generate would wait for ever
            raise RuntimeError(
                "SGLang's tokenizer manager reads the engine's outputs on another event loop "
                f"than the one generate runs ({reader_loop!r}, not {loop!r}); no request "
                "could finish"
            )
        self._failures.watch(loop)
        self._owns_sigquit = True

    def _restore_sigquit(self) -> None:
        if self._previous_sigquit is not None:
            signal.signal(signal.SIGQUIT, self._previous_sigquit)
            self._previous_sigquit = None
        self._owns_sigquit = False

    def _death_probe(self) -> Callable[[], str | None]:
        """The engine's processes exiting, unless SGLang reported it first (one raise)."""
        started = new_children(self._children_before)
        engine_pids = getattr(self._engine, "get_all_child_pids", None)
        if engine_pids is not None:  # SGLang's own list: its schedulers and detokenizer
            pids = set(engine_pids())
            started = [p for p in started if p.pid in pids] or started
        probe = death_probe(started)

        def once() -> str | None:
            if not _sigquit_armed.is_set():
                return None
            what = probe()
            if what is not None:
                _sigquit_armed.clear()
            return what

        return once

    def _count_retractions(self, marker: str) -> None:
        """Add the requests SGLang retracted since ``marker`` to the running count (None once
        no log was captured to count them from)."""
        text = logcapture.current_text()
        if not text:
            self._retracted = None
            return
        at = text.rfind(marker)  # not found: the marker scrolled out of the tail kept
        if self._retracted is not None:
            self._retracted += _retractions(text[at:] if at >= 0 else text)


class _LoopFailures:
    """Ends a blocked engine call with what a signal handler raised while the engine's
    loop ran (``_on_sigquit``'s or the watch's ``EngineDied``; pytest-timeout's failure).

    uvloop hands such an exception to the loop's exception handler, which only logs it
    ("Exception in callback Loop._read_from_self"). ``watch`` installs a handler that keeps
    it and stops the loop instead; ``call`` runs an engine method and raises what was kept
    (the stopped loop's ``RuntimeError`` is only its consequence). Main thread only.
    """

    def __init__(self) -> None:
        self._kept: BaseException | None = None

    def watch(self, loop: asyncio.AbstractEventLoop) -> None:
        def on_exception(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            exc = context.get("exception")
            from_signal = "_read_from_self" in str(context.get("message", ""))
            if exc is None or not (from_signal or isinstance(exc, EngineDied)):
                loop.default_exception_handler(context)
                return
            if self._kept is None:
                self._kept = exc
            loop.stop()

        loop.set_exception_handler(on_exception)

    def call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            result = method(*args, **kwargs)
        except BaseException:
            self._raise_kept()
            raise
        self._raise_kept()  # came in as the call finished: the engine is gone all the same
        return result

    def _raise_kept(self) -> None:
        kept, self._kept = self._kept, None
        if kept is not None:
            raise kept


def _retractions(text: str) -> int:
    return sum(int(n) for n in _RETRACTED.findall(text))


@contextlib.contextmanager
def _logging_kept() -> Iterator[None]:
    """SGLang configures the root logger of the process it starts in (``force=True``, its
    own level and format); the trial's logging is put back once the engine runs."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def _emulated(spec: TrialSpec) -> tuple[float, float] | None:
    """(capacity, held) GiB when the trial's GPU stands in for a smaller one, else None."""
    cap, physical = spec.device_memory_cap_gib, gpu_total_gib()
    if cap is None or physical is None or cap >= physical:
        return None
    readings = gpu_readings()
    held = max((r.used_gib for r in readings), default=0.0) if readings else 0.0
    return cap, held


def _kv_cache_tokens(engine: Any) -> int | None:
    """The scheduler's ``max_total_num_tokens``: from its start-up report, else the server info."""
    infos = getattr(getattr(engine, "_scheduler_init_result", None), "scheduler_infos", None)
    value = infos[0].get("max_total_num_tokens") if infos else None
    if value is None:
        try:
            value = engine.get_server_info().get("max_total_num_tokens")
        except Exception:  # an older or newer SGLang without it: the metric is left out
            log.warning("SGLang did not report its KV cache size", exc_info=True)
    return int(value) if value else None
