"""Turn the death of an engine's process into an exception in the trial's main thread.

vLLM's offline ``LLM`` (0.32) blocks for ever when its EngineCore process dies while it
generates: its monitor thread marks the engine dead and shuts the client down, but
nothing wakes the main thread waiting for outputs. The trial would sit there until its
deadline and be recorded as ``timeout`` (a verdict on the config: too slow) instead of
an ``error`` naming the death.

``EngineWatch`` polls ``probe`` from a thread; once it reports a death it sends this
process ``SIGUSR2``, whose handler raises ``EngineDied`` in the main thread: a signal
wakes a thread blocked on a lock or a queue, where an exception set from another thread
would wait for the next bytecode. Contract: ``start`` and ``stop`` from the main thread
(anywhere else the watch only logs); ``stop`` before a deliberate shutdown, which would
otherwise look like a death; a watch fires at most once.

The engine's front end may notice the death first and raise its own error in the main
thread (vLLM's ``EngineDeadError``: "EngineCore encountered an issue"), which names no
process. ``named_deaths`` turns such an error into the ``EngineDied`` behind it.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from trials.errors import EngineDied

log = logging.getLogger(__name__)

WATCH_SIGNAL = signal.SIGUSR2
POLL_S = 0.2


def exit_text(exitcode: int | None) -> str:
    """``was killed by SIGKILL`` or ``exited with code 1``, as multiprocessing reports it."""
    if exitcode is None:
        return "exited"
    if exitcode < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-exitcode).name}"
    return f"exited with code {exitcode}"


class EngineWatch:
    """Raises ``EngineDied(probe())`` in the main thread once ``probe`` returns a text.

    ``probe`` runs in the watch's thread every ``poll_s`` and returns None while every
    engine process lives, else what happened (``the engine process EngineCore (pid 7)
    was killed by SIGKILL``).
    """

    def __init__(self, probe: Callable[[], str | None], poll_s: float = POLL_S) -> None:
        self._probe = probe
        self._poll_s = poll_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: EngineDied | None = None
        self._previous: Any = None
        self._armed = False

    def start(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(WATCH_SIGNAL, self._raise)
            self._armed = True
        self._thread = threading.Thread(target=self._watch, name="engine-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._disarm()

    def confirm(self, attempts: int = 5) -> EngineDied | None:
        """The death behind an error the engine raised in the main thread, if a process died:
        the one seen, else what ``probe`` finds now (a few polls: the exit status can trail
        the front end's notice). Stops the watch, so that no signal follows."""
        self.stop()
        for attempt in range(attempts):
            if self._error is not None:
                break
            if attempt:
                time.sleep(self._poll_s)
            try:
                what = self._probe()
            except Exception:  # a probe that cannot look is no death
                log.exception("engine watch: probe failed")
                what = None
            if what is not None:
                self._error = _died(what)
        return self._error

    @property
    def died(self) -> EngineDied | None:
        """The death seen, if any (also after ``stop``)."""
        return self._error

    def _watch(self) -> None:
        while not self._stop.wait(self._poll_s):
            try:
                what = self._probe()
            except Exception:  # a probe that cannot look is no death
                log.exception("engine watch: probe failed")
                continue
            if what is None:
                continue
            self._error = _died(what)
            log.error("%s", self._error)
            if self._armed and not self._stop.is_set():
                signal.pthread_kill(threading.main_thread().ident or 0, WATCH_SIGNAL)
            return

    def _raise(self, signum: int, frame: object) -> None:
        self._disarm()
        if self._error is not None:
            raise self._error

    def _disarm(self) -> None:
        if self._armed:
            signal.signal(WATCH_SIGNAL, self._previous or signal.SIG_DFL)
            self._armed = False


def _died(what: str) -> EngineDied:
    return EngineDied(f"{what} while the trial ran; the engine cannot finish")


@contextlib.contextmanager
def named_deaths(watch: EngineWatch | None) -> Iterator[None]:
    """Around a call into the engine from the main thread: an error it raises because one of
    its processes died becomes that ``EngineDied`` (see the module docstring)."""
    try:
        yield
    except EngineDied:
        raise
    except Exception as exc:
        died = watch.confirm() if watch is not None else None
        if died is None:
            raise
        raise died from exc
