"""How busy the host was over a stretch (``trials.profiling``)."""

from __future__ import annotations

import threading
import time

from trials.profiling import busy_cores, host_cpu


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_thread_spinning_through_a_stretch_shows_as_a_busy_core() -> None:
    before, t0 = host_cpu(), time.perf_counter()
    spinner = threading.Thread(target=_spin, args=(1.5,))
    spinner.start()
    spinner.join()
    after, wall = host_cpu(), time.perf_counter() - t0
    assert after[1] > before[1] and after[0] >= before[0]
    assert busy_cores(before, after, wall) >= 0.8  # the spinner's core, whatever else ran
    assert busy_cores(before, after, 0.0) == 0.0
