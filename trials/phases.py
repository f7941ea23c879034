"""Which phase the trial is in: exceptions are tagged with it, a listener hears each entry.

``in_phase(name)`` wraps a phase's code: an exception escaping it gets
``trial_phase = name`` (the innermost phase wins), and the listener installed with
``listening(fn)`` is called with ``name`` on entry (the runner uses it to report
progress, so a trial killed at its deadline still says where it was).
Single-threaded: one trial per process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_listeners: list[Callable[[str], None]] = []


@contextmanager
def listening(listener: Callable[[str], None]) -> Iterator[None]:
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)


@contextmanager
def in_phase(name: str) -> Iterator[None]:
    for listener in list(_listeners):
        listener(name)
    try:
        yield
    except BaseException as exc:
        if getattr(exc, "trial_phase", None) is None:
            with contextlib.suppress(AttributeError):  # exceptions with __slots__
                exc.trial_phase = name  # type: ignore[attr-defined]
        raise


def phase_of(exc: BaseException) -> str | None:
    """The phase ``in_phase`` tagged ``exc`` with, or None."""
    return getattr(exc, "trial_phase", None)
