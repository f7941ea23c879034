"""One owner per job: a heartbeat thread for as long as a runner holds a job.

``Ownership`` contract:

- Entered (``with Ownership(...)``) by the runner that claimed the job, before anything
  else, its set-up included (reading the spec, building the space, opening the study);
  left when the runner is done with the job. A daemon thread heartbeats the job row every
  ``every_s`` seconds meanwhile (``JobStore.heartbeat``), so the orphan check of any
  service on the database (``JobStore.requeue_orphans``) sees a live owner however long a
  step of the run takes.
- Once the store says the job is no longer this runner's (requeued as an orphan after the
  database was away longer than the orphan window, claimed by another runner, finished),
  ``lost`` is set and the thread stops. The runner must then stop touching the job: it
  cancels its trials without recording them and leaves the job row alone (never marks it
  cancelled or failed: the job is someone else's now).
- A heartbeat that fails because the database is unavailable is retried at the next beat;
  it does not lose the job (the orphan window decides that, for every service alike).
"""

from __future__ import annotations

import logging
import threading

from storage import DatabaseUnavailableError, JobNotOwnedError, JobStore, StorageError

log = logging.getLogger(__name__)


class Ownership:
    """Heartbeats ``job_id`` as ``runner_id`` from a thread of its own while entered."""

    def __init__(self, store: JobStore, job_id: str, runner_id: str, every_s: float) -> None:
        if every_s <= 0:
            raise ValueError(f"every_s={every_s}: must be positive")
        self.store, self.job_id, self.runner_id, self.every_s = store, job_id, runner_id, every_s
        self.lost = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{job_id[:8]}", daemon=True)

    def __enter__(self) -> Ownership:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=max(5.0, 2 * self.every_s))

    @property
    def held(self) -> bool:
        return not self.lost.is_set()

    def _beat(self) -> None:
        while not self._done.wait(self.every_s):
            try:
                self.store.heartbeat(self.job_id, self.runner_id)
            except JobNotOwnedError as exc:
                log.error("job %s: no longer owned by %s (%s); stopping", self.job_id, self.runner_id, exc)
                self.lost.set()
                return
            except DatabaseUnavailableError as exc:
                log.warning(
                    "job %s: heartbeat failed (%s); retrying in %.0f s", self.job_id, exc, self.every_s
                )
            except StorageError as exc:  # the row is gone (deleted) or unreadable: not ours
                log.error("job %s: heartbeat failed (%s); stopping", self.job_id, exc)
                self.lost.set()
                return
