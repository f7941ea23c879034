"""The service's job runner: queued jobs start in order, up to a concurrency limit.

``JobRunner`` contract:

- ``start()`` once, from the thread that initialised Ray (``executor.ensure_ray``), after
  the database is migrated. It first recovers the jobs a dead runner left ``running``
  (``jobs.recover_orphans``), then starts one dispatcher thread.
- The dispatcher claims the oldest queued job whenever fewer than ``concurrency`` jobs
  run, and runs each claimed job in its own worker thread with ``jobs.execute``, which
  resumes the job's Optuna study (finished trials are kept, not re-run). Every
  ``orphan_check_s`` it also requeues jobs whose runner (on any host) stopped
  heartbeating.
- A cancel request reaches a worker through ``JobStore.is_cancel_requested``, polled by
  ``execute``: in-flight trials are cancelled, measured ones kept, the job ends
  ``cancelled``.
- A job whose run fails because the database cannot be reached is not marked failed: it
  goes back to the queue once the database answers, and resumes.
- ``stop()`` once, on shutdown: no new job is claimed, each worker cancels its in-flight
  trial tasks without recording them and puts its job back in the queue (the next
  service resumes it; the cancelled trials become ``interrupted``), and the threads are
  joined.
"""

from __future__ import annotations

import logging
import threading
import time

from autotuner.errors import AutotunerError
from autotuner.jobs import JobContext, execute, recover_orphans, runner_id
from autotuner.recovery import database_unavailable, root_cause
from storage import JobStateError, StorageError

log = logging.getLogger(__name__)
# Longest wait between two tries to requeue a job whose database went away.
REQUEUE_MAX_WAIT_S = 10.0


class JobRunner:
    """Runs the queued jobs of one database in background threads of this process."""

    def __init__(
        self, ctx: JobContext, concurrency: int = 1, poll_s: float = 1.0, orphan_check_s: float = 60.0
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency={concurrency}: must be at least 1")
        self.ctx = ctx
        self.concurrency = concurrency
        self.poll_s = poll_s
        self.orphan_check_s = orphan_check_s
        self._stopping = threading.Event()
        self._workers: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()
        self._dispatcher: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> list[str]:
        """Recover orphaned jobs, then start dispatching; return the recovered job ids."""
        if self._dispatcher is not None:
            raise RuntimeError("JobRunner.start() was already called")
        recovered = recover_orphans(self.ctx, self.ctx.settings.orphan_after_s)
        if recovered:
            log.warning(
                "resuming %d job(s) left running by a dead runner: %s", len(recovered), ", ".join(recovered)
            )
        self._dispatcher = threading.Thread(target=self._dispatch, name="job-dispatcher", daemon=True)
        self._dispatcher.start()
        return recovered

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop claiming, hand running jobs back to the queue, join the threads."""
        self._stopping.set()
        deadline = time.monotonic() + timeout_s
        if self._dispatcher is not None:
            self._dispatcher.join(max(0.0, deadline - time.monotonic()))
        for job_id, worker in self.running():
            worker.join(max(0.0, deadline - time.monotonic()))
            if worker.is_alive():
                log.error(
                    "job %s did not stop within %.0f s; a later service resumes it "
                    "once its heartbeat is stale",
                    job_id,
                    timeout_s,
                )

    @property
    def alive(self) -> bool:
        return self._dispatcher is not None and self._dispatcher.is_alive()

    def running(self) -> list[tuple[str, threading.Thread]]:
        with self._lock:
            return list(self._workers.items())

    # ------------------------------------------------------------------ threads

    def _dispatch(self) -> None:
        next_orphan_check = time.monotonic() + self.orphan_check_s
        while not self._stopping.is_set():
            try:
                if time.monotonic() >= next_orphan_check:
                    next_orphan_check = time.monotonic() + self.orphan_check_s
                    self.ctx.store.requeue_orphans(self.ctx.settings.orphan_after_s)
                if self._claim_one():
                    continue
            except StorageError as exc:
                log.error("job runner: the database failed (%s); retrying", exc)
            except Exception:  # keep dispatching whatever one claim did
                log.exception("job runner: unexpected error while claiming a job")
            self._stopping.wait(self.poll_s)

    def _claim_one(self) -> bool:
        """Start the oldest queued job if there is room; True when one started."""
        with self._lock:
            for job_id, worker in list(self._workers.items()):
                if not worker.is_alive():
                    del self._workers[job_id]
            if len(self._workers) >= self.concurrency:
                return False
        job = self.ctx.store.claim_next(runner_id())
        if job is None:
            return False
        worker = threading.Thread(target=self._work, args=(job.id,), name=f"job-{job.id[:8]}", daemon=True)
        with self._lock:
            self._workers[job.id] = worker
        worker.start()
        log.info("job %s (%s) started", job.id, job.name)
        return True

    def _work(self, job_id: str) -> None:
        try:
            summary = execute(self.ctx, job_id, shutdown=self._stopping.is_set)
            log.info("job %s stopped: %s", job_id, summary.stop_reason)
        except Exception as exc:
            if database_unavailable(exc):
                log.error(
                    "job %s: the database failed (%s); the job goes back to the queue once it answers",
                    job_id,
                    root_cause(exc),
                )
                self._requeue_when_reachable(job_id)
            elif isinstance(exc, (AutotunerError, StorageError)):
                log.error("job %s failed: %s", job_id, exc)
                self._mark_failed(job_id, str(exc))
            else:
                log.exception("job %s failed", job_id)
                self._mark_failed(job_id, f"{type(exc).__name__}: {exc}")

    def _requeue_when_reachable(self, job_id: str) -> None:
        """Put a job whose run lost its database back in the queue as soon as the database
        answers again; the next claim resumes it (its cut-off trial is retried once). If this
        service stops first, the next one finds the job orphaned and resumes it."""
        delay_s = self.poll_s
        while not self._stopping.is_set():
            try:
                self.ctx.store.release(job_id, runner_id())
                log.warning("job %s: the database answers again; back in the queue", job_id)
                return
            except JobStateError:
                return  # finished, or requeued by another service meanwhile
            except StorageError as exc:
                log.warning(
                    "job %s: the database is still unavailable (%s); retrying in %.0f s", job_id, exc, delay_s
                )
            self._stopping.wait(delay_s)
            delay_s = min(2 * delay_s, REQUEUE_MAX_WAIT_S)

    def _mark_failed(self, job_id: str, error: str) -> None:
        """A job that failed before its run began (its spec no longer resolves, say) must
        not stay running: it would be requeued as an orphan and fail again, forever."""
        try:
            self.ctx.store.finish(job_id, "failed", stop_reason="error", error=error, runner_id=runner_id())
        except JobStateError:
            pass  # execute already recorded the end, or the job is another runner's now
        except StorageError as exc:
            log.error("job %s: cannot record its failure: %s", job_id, exc)
