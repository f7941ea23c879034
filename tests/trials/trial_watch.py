"""Watch the trial processes ``launch_trial`` starts, to check none outlives it."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from trials.launcher import proc_stats, session_processes


def kernel_name(pid: int) -> str | None:
    """A process's name as the kernel keeps it (``/proc/<pid>/comm``: the first 15
    characters of the title vLLM sets, ``VLLM::EngineCor``), None once it has ended. Read
    without the process's memory lock, which reading its command line takes and which an
    engine busy mapping memory can hold for long on a loaded machine."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def is_engine_core(pid: int) -> bool:
    """Whether ``pid`` is vLLM's EngineCore (``VLLM::EngineCore``, ``..._DP<rank>``)."""
    return "EngineCor" in (kernel_name(pid) or "")


class Poller:
    """Calls ``poll`` every ``interval_s`` in a thread while the ``with`` block runs. A poll
    reads the whole process table (several milliseconds with the few hundred processes of a
    parallel test run); the processes it looks for live for seconds."""

    interval_s = 0.2

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):  # noqa: ANN204 (returns the subclass)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    def poll(self) -> None:
        raise NotImplementedError


class TrialSessions(Poller):
    """Records the sessions led by children of this process that start while the block runs
    (not the ones an earlier test's long-lived helper, e.g. a server, already leads)."""

    def __init__(self) -> None:
        super().__init__()
        self.sids: set[int] = set()
        self._me = os.getpid()
        self._before = set(self._leaders())

    def _leaders(self) -> list[int]:
        return [pid for pid, fields in proc_stats() if int(fields[1]) == self._me and int(fields[3]) == pid]

    def poll(self) -> None:
        self.sids.update(pid for pid in self._leaders() if pid not in self._before)

    def leftovers(self) -> list[int]:
        """Live processes still in any recorded session."""
        return [pid for sid in self.sids for pid in session_processes(sid)]


class EngineCpus(Poller):
    """The CPUs each vLLM worker process under this one may run on, as last seen (the
    worker binds its threads while it starts)."""

    def __init__(self) -> None:
        super().__init__()
        self.cpus: dict[int, set[int]] = {}

    def poll(self) -> None:
        import psutil

        for proc in psutil.Process().children(recursive=True):
            try:
                if proc.name().startswith("VLLM::Worker"):
                    self.cpus[proc.pid] = set(os.sched_getaffinity(proc.pid))
            except (psutil.Error, OSError):
                continue
