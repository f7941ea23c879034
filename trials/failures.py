"""Classify a failure: ``oom`` (the configuration needs more memory than it has) or ``error``.

The table is data: ``Rule(pattern, status, error_type)`` rows matched against the
exception's text (its type name, message and chained causes); the first row that matches
anywhere wins, so the rows for memory come first (an NCCL error whose last CUDA failure
was 'out of memory' is an OOM). A row's ``error_type`` names the failure where the
exception's own type would not (a ``RuntimeError`` raised for an NCCL failure becomes
``NcclError``); None keeps the exception's type.

Engines often fail one level removed: vLLM's front end raises "Engine core
initialization failed. See root cause above." while the real reason is in the engine
process's log. For those wrapper errors (``WRAPPER_PATTERNS``) the captured log text is
searched too, and the line that says what failed (``logged_cause``) joins the trial's
error message. Texts below are the ones the engines, NCCL, the driver and the allocators
really print (vLLM 0.24/0.32, SGLang 0.5.17, PyTorch 2.x, NCCL 2.x, glibc).
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from typing import NamedTuple

OOM = "oom"
ERROR = "error"
NCCL_ERROR = "NcclError"
CUDA_DRIVER_ERROR = "CudaDriverError"


class Rule(NamedTuple):
    pattern: str
    status: str
    error_type: str | None = None


class Failure(NamedTuple):
    """How a failure is recorded: its status and, when a rule names it, its type."""

    status: str
    error_type: str | None = None


# The first matching row wins.
PATTERNS: tuple[Rule, ...] = (
    # PyTorch, CUDA and the host allocator.
    Rule(r"OutOfMemoryError", OOM),  # torch.OutOfMemoryError / torch.cuda.OutOfMemoryError
    Rule(r"CUDA out of memory", OOM),
    Rule(r"CUDA error: out of memory", OOM),  # also vLLM's cumem allocator on wake-up
    Rule(r"cudaErrorMemoryAllocation", OOM),
    Rule(r"CUDA_ERROR_OUT_OF_MEMORY", OOM),
    Rule(r"CUDA driver error: out of memory", OOM),  # expandable segments (cuMemCreate)
    Rule(r"Cuda failure (\d+ )?'out of memory'", OOM),  # NCCL's own buffers
    Rule(r"CUBLAS_STATUS_ALLOC_FAILED", OOM),
    Rule(r"DefaultCPUAllocator: can't allocate memory", OOM),
    Rule(r"std::bad_alloc", OOM),
    Rule(r"\bMemoryError\b", OOM),
    Rule(r"\[Errno 12\] Cannot allocate memory", OOM),
    Rule(r"OpenBLAS error: Memory allocation still failed", OOM),  # then exit(1)
    # vLLM start-up refusals (GPU worker, CPU worker, KV-cache sizing).
    Rule(r"Free memory on device .* is less than desired", OOM),
    Rule(r"less than desired GPU memory utilization", OOM),
    Rule(r"less than desired CPU memory utilization", OOM),
    Rule(r"less than requested memory for kv", OOM),
    Rule(r"No available memory for the cache blocks", OOM),
    Rule(r"larger than the available KV cache memory", OOM),
    Rule(r"Cannot auto-fit max_model_len: not enough GPU memory", OOM),
    Rule(r"insufficient KV cache", OOM),
    # SGLang: start-up refusals (its KV pool is what mem_fraction_static leaves after the
    # weights), and the KV cache running out while it generates (``KvCacheExhausted``:
    # requests cut short, see ``trials.rollout.phase``).
    Rule(r"Not enough memory\. Please try to increase --mem-fraction-static", OOM),
    Rule(r"Loaded weights leave no GPU memory for the KV cache", OOM),
    Rule(r"Not enough GPU memory for hybrid", OOM),
    Rule(r"state cache is too small to serve any requests", OOM),
    Rule(r"Memory pool size is too small", OOM),
    Rule(r"Input length \(\d+ tokens\) exceeds the maximum allowed length", OOM),  # > the pool
    Rule(r"Out of memory even after retracting", OOM),
    Rule(r"\bKvCacheExhausted\b", OOM),
    # NCCL (collectives of the actor's process group or of a tensor-parallel engine).
    Rule(r"NCCL error", ERROR, NCCL_ERROR),
    Rule(r"\bnccl[A-Z]\w*Error\b", ERROR, NCCL_ERROR),  # ncclSystemError, ncclUnhandledCudaError
    Rule(r"unhandled cuda error", ERROR, NCCL_ERROR),
    Rule(r"unhandled system error", ERROR, NCCL_ERROR),
    # The driver or the GPU itself.
    Rule(r"CUDA driver error", ERROR, CUDA_DRIVER_ERROR),
    Rule(r"\bXid\b", ERROR, CUDA_DRIVER_ERROR),
    Rule(r"GPU has fallen off the bus", ERROR, CUDA_DRIVER_ERROR),
    Rule(r"uncorrectable ECC error", ERROR, CUDA_DRIVER_ERROR),
)

# Errors that only say "something died, see above": the log decides what it was.
WRAPPER_PATTERNS: tuple[str, ...] = (
    r"Engine core initialization failed",
    r"Frontend process failed during engine core initialization",
    r"EngineDeadError",
    r"Engine core proc .* died unexpectedly",
    r"EngineCore encountered an issue",
    r"See root cause above",
    r"Scheduler hit an exception",  # SGLang
    r"Rank \d+ scheduler is dead",  # SGLang
    r"Rank \d+ scheduler died during initialization",  # SGLang
    r"Initialization failed\. Please see the error messages above",  # SGLang
    r"see the engine's log",  # trials.rollout.sglang: SGLang signalled a failed child
)

# What an engine logs when its KV cache ran out under the requests (SGLang retracts
# requests, then aborts the last one it cannot fit). With requests that came back short,
# any of these says why: ``KvCacheExhausted`` rather than a plain ``GenerationMismatch``.
KV_EXHAUSTION_PATTERNS: tuple[str, ...] = (
    r"Out of memory even after retracting",
    r"retract_decode: aborted last request",
    r"KV cache pool is full\. Retract requests",
    r"Request length is longer than the KV cache pool size",
)

# Case matters where NCCL spells its error codes in camel case (``ncclSystemError``).
_CASE_SENSITIVE = {r"\bnccl[A-Z]\w*Error\b", r"\bXid\b"}
_COMPILED = tuple(
    (re.compile(r.pattern, 0 if r.pattern in _CASE_SENSITIVE else re.IGNORECASE), r) for r in PATTERNS
)
_WRAPPERS = tuple(re.compile(p, re.IGNORECASE) for p in WRAPPER_PATTERNS)
_KV_EXHAUSTION = tuple(re.compile(p) for p in KV_EXHAUSTION_PATTERNS)


def match_text(text: str) -> Rule | None:
    """The first table row matching ``text``, or None."""
    for pattern, rule in _COMPILED:
        if pattern.search(text):
            return rule
    return None


def classify_text(text: str) -> str | None:
    """The status of the first table row matching ``text``, or None."""
    rule = match_text(text)
    return rule.status if rule is not None else None


def kv_exhaustion_marker(text: str) -> str | None:
    """The last line of ``text`` saying that the KV cache ran out (see
    ``KV_EXHAUSTION_PATTERNS``), or None."""
    for line in reversed(text.splitlines()):
        if any(p.search(line) for p in _KV_EXHAUSTION):
            return line.strip()
    return None


def exception_text(exc: BaseException) -> str:
    """``Type: message`` of ``exc`` and of every exception it was raised from."""
    return "\n".join(f"{type(e).__name__}: {e}" for e in _chain(exc))


def classify_failure(exc: BaseException | None, log_text: str = "") -> Failure:
    """Status and error type for an exception and the log captured around it.

    The log is only consulted when the exception is a wrapper (see module docstring)
    or when there is no exception (a process that died without one).
    """
    own = exception_text(exc) if exc is not None else ""
    rule = match_text(own)
    if rule is None and (exc is None or any(w.search(own) for w in _WRAPPERS)) and log_text:
        rule = match_text(log_text)
    if rule is None:
        return Failure(ERROR)
    return Failure(rule.status, rule.error_type)


# A line of a process's log that raises: ``Type: message`` (a dotted type included), after
# the process's prefix (vLLM's ``(EngineCore pid=7)``, Ray's ``(pid=7)``).
_RAISED_LINE = re.compile(
    r"^(?:\([^)]*\)\s*)?((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Died|Exhausted)\b: .+)$"
)
_LOG_PREFIX = re.compile(r"^\([^)]*\)\s*")


def logged_cause(exc: BaseException | None, log_text: str) -> str | None:
    """For a wrapper error (or none), the line of the log that says what really failed: the
    last line matching the table's row that classifies the log, else the last line that
    raises; its process prefix dropped. None for an error that explains itself."""
    if exc is not None and not any(w.search(exception_text(exc)) for w in _WRAPPERS):
        return None
    lines = [_LOG_PREFIX.sub("", line).strip() for line in log_text.splitlines()]
    rule = match_text(log_text)
    if rule is not None:
        pattern = next(p for p, r in _COMPILED if r is rule)
        hits = [line for line in lines if pattern.search(line)]
        if hits:
            return hits[-1][:1000]
    raised = [m.group(1) for line in lines if (m := _RAISED_LINE.match(line))]
    wrappers = [line for line in raised if not any(w.search(line) for w in _WRAPPERS)]
    return wrappers[-1][:1000] if wrappers else None


def classify(exc: BaseException | None, log_text: str = "") -> str:
    """``oom`` or ``error`` (see ``classify_failure``)."""
    return classify_failure(exc, log_text).status


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def exit_text(returncode: int | None) -> str:
    """How a process ended, for an error message: "was killed by SIGKILL", "exited with code 1"."""
    if returncode is not None and returncode < 0:
        return f"was killed by {signal.Signals(-returncode).name}"
    return f"exited with code {returncode}"
