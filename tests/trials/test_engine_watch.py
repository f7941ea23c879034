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
    started = time.monotonic()
    with pytest.raises(EngineDied, match="EngineCore was killed by SIGKILL"):
        queue.Queue().get()  # what vLLM's LLM.generate blocks on when its engine is gone
    assert time.monotonic() - started < 10
    watch.stop()
    assert signal.getsignal(WATCH_SIGNAL) == before  # the handler is the process's again
    assert watch.died is not None
    engine.join()


def test_a_deliberate_shutdown_after_stop_raises_nothing() -> None:
    engine = _engine()
    watch = EngineWatch(_probe(engine), poll_s=0.05)
    watch.start()
    watch.stop()
    engine.kill()
    engine.join()
    time.sleep(0.3)  # a watch still running would have fired by now
    assert watch.died is None


class EngineDeadError(Exception):
    """What vLLM's front end raises when it notices first: it names no process."""


def test_an_engine_error_noticed_first_becomes_the_death_behind_it() -> None:
    # The front end saw the dead engine before the watch's next poll (a long poll here):
    # the error it raised becomes the EngineDied naming the process, and no signal follows.
    engine = _engine()
    watch = EngineWatch(_probe(engine), poll_s=30)
    watch.start()
    engine.kill()
    engine.join()
    with pytest.raises(EngineDied, match="EngineCore was killed by SIGKILL") as raised, named_deaths(watch):
        raise EngineDeadError("EngineCore encountered an issue. See stack trace (above)")
    assert isinstance(raised.value.__cause__, EngineDeadError)
    time.sleep(0.1)  # a signal still on its way would raise here


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
    time.sleep(0.3)
    assert watch.died is None  # confirm stopped the watch: the kill after it is no death


def test_exit_texts() -> None:
    assert exit_text(-9) == "was killed by SIGKILL"
    assert exit_text(1) == "exited with code 1"
