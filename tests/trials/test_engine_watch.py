"""EngineWatch: an engine process's death wakes the main thread wherever it blocks."""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import threading
import time

import pytest

from trials.errors import EngineDied
from trials.rollout.watch import WATCH_SIGNAL, EngineWatch, exit_text, named_deaths


def _sleep_forever() -> None:
    time.sleep(600)


def _engine() -> multiprocessing.Process:
    proc = multiprocessing.get_context("spawn").Process(target=_sleep_forever, name="EngineCore")
    proc.start()
    return proc


# A deadline for the test to fail by, never a bound it must beat: a watch that fired raises
# at once, one that did not leaves the main thread blocked until this.
BLOCKED_FOR_AT_MOST_S = 120


def _watch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "engine-watch"]


def _probe(proc: multiprocessing.Process):
    def probe() -> str | None:
        code = proc.exitcode
        return None if code is None else f"the engine process {proc.name} {exit_text(code)}"

    return probe


def test_a_killed_engine_raises_in_the_blocked_main_thread() -> None:
    engine = _engine()
    before = signal.getsignal(WATCH_SIGNAL)
    watch = EngineWatch(_probe(engine), poll_s=0.05)
    watch.start()
    threading.Timer(0.5, os.kill, (engine.pid, signal.SIGKILL)).start()
    with pytest.raises(EngineDied, match="EngineCore was killed by SIGKILL"):
        # What vLLM's LLM.generate blocks on when its engine is gone (queue.Empty: no wake-up).
        queue.Queue().get(timeout=BLOCKED_FOR_AT_MOST_S)
    watch.stop()
    assert signal.getsignal(WATCH_SIGNAL) == before  # the handler is the process's again
    assert watch.died is not None
    engine.join()


def test_a_deliberate_shutdown_after_stop_raises_nothing() -> None:
    engine = _engine()
    watch = EngineWatch(_probe(engine), poll_s=0.05)
    watch.start()
    watch.stop()
    assert _watch_threads() == []  # stopped means joined: nothing is left to fire
    engine.kill()
    engine.join()
    assert _probe(engine)() is not None  # a live watch would now see the death
    assert watch.died is None


class EngineDeadError(Exception):
    """What vLLM's front end raises when it notices first: it names no process."""


def test_an_engine_error_noticed_first_becomes_the_death_behind_it() -> None:
    # The front end saw the dead engine before the watch's next poll (a long poll here):
    # the error it raised becomes the EngineDied naming the process, and no signal follows.
    engine = _engine()
    before = signal.getsignal(WATCH_SIGNAL)
    watch = EngineWatch(_probe(engine), poll_s=30)
    watch.start()
    engine.kill()
    engine.join()
    with pytest.raises(EngineDied, match="EngineCore was killed by SIGKILL") as raised, named_deaths(watch):
        raise EngineDeadError("EngineCore encountered an issue. See stack trace (above)")
    assert isinstance(raised.value.__cause__, EngineDeadError)
    # No signal can follow: the watch's thread is gone and the handler is the process's again.
    assert _watch_threads() == [] and signal.getsignal(WATCH_SIGNAL) == before


def test_an_engine_error_without_a_death_stays_what_it_was() -> None:
    engine = _engine()
    watch = EngineWatch(_probe(engine), poll_s=0.05)
    watch.start()
    try:
        with pytest.raises(ValueError, match="a bad request"), named_deaths(watch):
            raise ValueError("a bad request")
    finally:
        engine.kill()
        engine.join()
    assert _watch_threads() == []  # confirm stopped the watch: the kill after it is no death
    assert _probe(engine)() is not None and watch.died is None


def test_exit_texts() -> None:
    assert exit_text(-9) == "was killed by SIGKILL"
    assert exit_text(1) == "exited with code 1"
