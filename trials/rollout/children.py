"""The processes an engine starts under this one: noted before ``start``, watched while it
runs, reaped after ``shutdown``.

Engines spawn their workers as children of the trial process (vLLM's EngineCore, SGLang's
schedulers and detokenizer). ``child_pids`` notes who was there before; ``new_children``
are the engine's; ``death_probe`` tells ``EngineWatch`` when one of them is gone; and
``reap_new_children`` makes sure none outlives the engine's shutdown.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


def child_pids() -> set[int]:
    """This process's descendants now."""
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


def new_children(before: set[int]) -> list[Any]:
    """This process's direct children that were not there ``before`` (psutil processes)."""
    import psutil

    return [p for p in psutil.Process().children() if p.pid not in before]


def death_probe(processes: list[Any]) -> Callable[[], str | None]:
    """An ``EngineWatch`` probe over psutil ``processes``: a text once one has exited."""
    import psutil

    def probe() -> str | None:
        for proc in processes:
            try:
                gone = proc.status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                gone = True
            if gone:
                return f"the engine process {proc.pid} exited"
        return None

    return probe


def reap_new_children(before: set[int], wait_s: float) -> None:
    """Wait for the engine's processes to exit; kill those still alive after ``wait_s``.

    Python's multiprocessing resource tracker is left alone: it holds no engine memory
    and exits with this process.
    """
    import psutil

    def engine_children() -> list[psutil.Process]:
        out = []
        for p in psutil.Process().children(recursive=True):
            try:
                if p.pid in before or "resource_tracker" in " ".join(p.cmdline()):
                    continue
                if p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.Error:
                continue
        return out

    _, alive = psutil.wait_procs(engine_children(), timeout=wait_s)
    for p in alive:
        log.warning("engine process %s outlived shutdown; killing it", p.pid)
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=5)
