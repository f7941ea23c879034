"""Watch the trial processes ``launch_trial`` starts, to check none outlives it."""

from __future__ import annotations

import os
import threading

from trials.launcher import proc_stats, session_processes


class Poller:
    """Calls ``poll`` every ``interval_s`` in a thread while the ``with`` block runs."""

    interval_s = 0.05

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
    """Records the sessions led by children of this process while the block runs."""

    def __init__(self) -> None:
        super().__init__()
        self.sids: set[int] = set()
        self._me = os.getpid()

    def poll(self) -> None:
        for pid, fields in proc_stats():
            if int(fields[1]) == self._me and int(fields[3]) == pid:
                self.sids.add(pid)

    def leftovers(self) -> list[int]:
        """Live processes still in any recorded session."""
        return [pid for sid in self.sids for pid in session_processes(sid)]
