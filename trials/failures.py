"""Classify a failure as ``oom`` (the configuration needs more memory than it has) or ``error``.

The table is data: ``(regex, status)`` rows matched against the exception's text (its
type name, message and chained causes). Engines often fail one level removed: vLLM's
front end raises "Engine core initialization failed. See root cause above." while the
real reason is in the engine process's log. For those wrapper errors (``WRAPPER_PATTERNS``)
the captured log text is searched too. Texts below are the ones the engines and
allocators really print (vLLM 0.24/0.32, SGLang 0.5, PyTorch 2.x, glibc).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

OOM = "oom"
ERROR = "error"

# (pattern, status): the first matching row wins.
PATTERNS: tuple[tuple[str, str], ...] = (
    # PyTorch, CUDA and the host allocator.
    (r"OutOfMemoryError", OOM),  # torch.OutOfMemoryError / torch.cuda.OutOfMemoryError
    (r"CUDA out of memory", OOM),
    (r"CUDA error: out of memory", OOM),
    (r"CUBLAS_STATUS_ALLOC_FAILED", OOM),
    (r"DefaultCPUAllocator: can't allocate memory", OOM),
    (r"std::bad_alloc", OOM),
    (r"\bMemoryError\b", OOM),
    (r"\[Errno 12\] Cannot allocate memory", OOM),
    (r"OpenBLAS error: Memory allocation still failed", OOM),  # then exit(1)
    # vLLM start-up refusals (GPU worker, CPU worker, KV-cache sizing).
    (r"less than desired GPU memory utilization", OOM),
    (r"less than desired CPU memory utilization", OOM),
    (r"less than requested memory for kv", OOM),
    (r"No available memory for the cache blocks", OOM),
    (r"larger than the available KV cache memory", OOM),
    (r"Cannot auto-fit max_model_len: not enough GPU memory", OOM),
    (r"insufficient KV cache", OOM),
    # SGLang start-up refusal.
    (r"Not enough memory\. Please try to increase --mem-fraction-static", OOM),
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
)

_COMPILED = tuple((re.compile(p, re.IGNORECASE), status) for p, status in PATTERNS)
_WRAPPERS = tuple(re.compile(p, re.IGNORECASE) for p in WRAPPER_PATTERNS)


def classify_text(text: str) -> str | None:
    """The status of the first table row matching ``text``, or None."""
    for pattern, status in _COMPILED:
        if pattern.search(text):
            return status
    return None


def exception_text(exc: BaseException) -> str:
    """``Type: message`` of ``exc`` and of every exception it was raised from."""
    return "\n".join(f"{type(e).__name__}: {e}" for e in _chain(exc))


def classify(exc: BaseException | None, log_text: str = "") -> str:
    """``oom`` or ``error`` for an exception and the log captured around it.

    The log is only consulted when the exception is a wrapper (see module docstring)
    or when there is no exception (a process that died without one).
    """
    own = exception_text(exc) if exc is not None else ""
    status = classify_text(own)
    if status is not None:
        return status
    if (exc is None or any(w.search(own) for w in _WRAPPERS)) and log_text:
        return classify_text(log_text) or ERROR
    return ERROR


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__
