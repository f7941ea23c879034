"""``run_trial``: run a spec's phases in this process and report what they measured.

Phases run in ``spec.phases`` order. ``rollout`` starts the engine (phase ``startup``),
measures the replica's requests (``rollout``) and shuts the engine down before the
train phase, unless ``free_cache_engine`` is off, in which case the engine and its
memory stay up through training as in verl (the train phase's cap then shrinks to
``cap * (1 - gpu_memory_utilization)``). ``train`` runs under the device memory cap
(see ``memory_cap``).

``run_trial`` never raises: a failure becomes a ``TrialResult`` with ``status``
``oom`` or ``error`` (see ``failures``), the ``phase`` it happened in, the exception's
type and message, the tail of everything written to stderr (the engine's processes
included) and the metrics measured before it. Step metrics are composed as described
in ``trials.step`` when every requested phase completed.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable

from trials import failures
from trials.device import compute_dtype, describe_device, dtype_bits, hostname
from trials.errors import InvalidTrialSpec
from trials.logcapture import StderrTail
from trials.memory import PeakMemorySampler
from trials.memory_cap import device_memory_cap
from trials.phases import in_phase, listening, phase_of
from trials.rollout import RolloutBackend, get_backend
from trials.rollout.phase import check_rollout_spec, measure_rollout
from trials.step import step_metrics
from trials.types import TrialResult, TrialSpec

log = logging.getLogger(__name__)

KNOWN_PHASES = ("rollout", "train")
LOG_TAIL_CHARS = 12_000


def run_trial(
    spec: TrialSpec, on_progress: Callable[[TrialResult], None] | None = None
) -> TrialResult:
    """Run ``spec`` here; ``on_progress(result)`` hears each phase entry (``result.phase``)."""
    start = time.perf_counter()
    result = TrialResult(trial_id=spec.trial_id, status="ok", hostname=hostname())

    def entered(phase: str) -> None:
        if phase == result.phase:  # e.g. the train phase's own start-up after the engine's
            return
        result.phase = phase
        if on_progress is not None:
            on_progress(result)

    with StderrTail() as tail, listening(entered):
        try:
            result.device = describe_device(spec.device)
            _run_phases(spec, result)
            result.phase = None
            result.metrics.update(step_metrics(spec, result.metrics, result.phase_timings_s))
        except Exception as exc:
            trace = traceback.format_exc()
            log.error("trial %s failed:\n%s", spec.trial_id, trace)
            _record_failure(result, exc, tail.text(), trace)
    result.wall_s = time.perf_counter() - start
    return result


def _record_failure(result: TrialResult, exc: BaseException, log_text: str, trace: str) -> None:
    result.status = failures.classify(exc, log_text)  # type: ignore[assignment]
    result.phase = phase_of(exc)
    result.error_type = type(exc).__name__
    result.error_message = str(exc)[:4000]
    if trace.strip().splitlines()[-1] not in log_text:  # logging did not reach stderr
        log_text = f"{log_text}\n{trace}"
    result.log_tail = log_text[-LOG_TAIL_CHARS:]


def _check_spec(spec: TrialSpec) -> None:
    unknown = [p for p in spec.phases if p not in KNOWN_PHASES]
    if unknown or not spec.phases:
        raise InvalidTrialSpec(
            f"phases must be a non-empty list of {KNOWN_PHASES}, got {spec.phases}"
        )
    if spec.device not in ("cuda", "cpu"):
        raise InvalidTrialSpec(f"device must be 'cuda' or 'cpu', got {spec.device!r}")
    if "rollout" in spec.phases:
        check_rollout_spec(spec)
    if "train" in spec.phases:
        from trials.train import check_train_spec

        check_train_spec(spec)


def _run_phases(spec: TrialSpec, result: TrialResult) -> None:
    _check_spec(spec)
    dtype = compute_dtype(spec.device, spec.dtype)
    backend: RolloutBackend | None = None
    peaks: list[float] = []
    try:
        for phase in spec.phases:
            if phase == "rollout":
                with in_phase("startup"):
                    backend = get_backend(spec.rollout.engine)
                _rollout(spec, dtype, backend, result, peaks)
                if spec.rollout.free_cache_engine:
                    _shutdown(backend, result)
                    backend = None
            else:
                _train(spec, dtype, result, peaks, engine_alive=backend is not None)
    finally:
        if backend is not None:
            _shutdown(backend, result)
        if peaks:
            result.metrics["peak_memory_gib"] = max(peaks)


def _rollout(
    spec: TrialSpec, dtype: str, backend: RolloutBackend, result: TrialResult, peaks: list[float]
) -> None:
    metrics = result.metrics
    metrics["rollout_dtype_bits"] = dtype_bits(dtype)
    with PeakMemorySampler(spec.device) as memory:
        try:
            with in_phase("startup"):
                startup_s = backend.start(spec, dtype)
            metrics["engine_startup_s"] = result.phase_timings_s["startup"] = startup_s
            metrics["engine_import_s"] = float(getattr(backend, "import_s", 0.0))
            with in_phase("rollout"):
                metrics.update(measure_rollout(backend, spec))
            result.phase_timings_s["rollout"] = metrics["rollout_makespan_s"]
        finally:
            metrics["rollout_peak_memory_gib"] = memory.peak_gib
            peaks.append(memory.peak_gib)


def _train(
    spec: TrialSpec, dtype: str, result: TrialResult, peaks: list[float], engine_alive: bool
) -> None:
    from trials.train import prepare_train, run_train

    with in_phase("startup"):
        prepare_train(spec, dtype)
    cap = spec.device_memory_cap_gib
    if cap is not None and engine_alive:  # the engine keeps its share of the device
        cap *= max(0.0, 1.0 - spec.rollout.gpu_memory_utilization)
    with PeakMemorySampler(spec.device) as memory:
        try:
            with device_memory_cap(spec.device, cap):
                run_train(spec, dtype, result.metrics, result.phase_timings_s)
        finally:
            result.metrics["train_peak_memory_gib"] = memory.peak_gib
            peaks.append(memory.peak_gib)


def _shutdown(backend: RolloutBackend, result: TrialResult) -> None:
    t0 = time.perf_counter()
    try:
        backend.shutdown()
    except Exception:  # never mask the phase's own outcome
        log.exception("rollout engine shutdown failed")
    result.metrics["engine_shutdown_s"] = time.perf_counter() - t0
