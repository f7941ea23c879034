"""A real `autotuner serve` for tests: its own process session on a free loopback port, its
own data dir (SQLite file) and local Ray. The API tests and the web tests both use it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from trials.distributed import free_port
from trials.launcher import session_processes

REPO = Path(__file__).resolve().parents[1]
# Settings of the environment the tests run in that would point the server elsewhere.
LEFT_OUT = (
    "AUTOTUNER_DATABASE_URL",
    "AUTOTUNER_HOST",
    "AUTOTUNER_PORT",
    "AUTOTUNER_API_TOKEN",
    "AUTOTUNER_MODELS_DIR",
    "AUTOTUNER_RAY_ADDRESS",
)
OWN_TOKEN = "<the server's own token>"


class Server:
    """One `autotuner serve` process (and its Ray) in a process session of its own; ``env``
    adds settings (``AUTOTUNER_API_TOKEN=...``)."""

    def __init__(self, data_dir: Path, log_path: Path, **env: str) -> None:
        self.data_dir, self.log_path = data_dir, log_path
        self.port = free_port()
        self.env = {k: v for k, v in os.environ.items() if k not in LEFT_OUT}
        self.env.update({"AUTOTUNER_DATA_DIR": str(data_dir), "AUTOTUNER_RAY_NUM_CPUS": "2", **env})
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 120, port_tries: int = 3) -> Server:
        """Start the server and wait until it answers. The port was free when chosen, but
        another process may bind it before the server
        does: then the server starts again on another free port, ``port_tries`` times."""
        for attempt in range(port_tries):
            logged = self.log_path.stat().st_size if self.log_path.exists() else 0
            if self._start(timeout_s):
                return self
            said = self.log_path.read_bytes()[logged:]
            if b"address already in use" not in said or attempt == port_tries - 1:
                break
            self.port = free_port()
        assert self.proc is not None
        raise AssertionError(f"the server exited ({self.proc.returncode}):\n{self.log()}")

    def _start(self, timeout_s: float) -> bool:
        """Launch the server; True once it answers, False if it exited first."""
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "autotuner.cli", "serve", "--port", str(self.port)],
                cwd=REPO,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._sweep()  # what it started (its Ray) goes with it
                return False
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    return True
            time.sleep(0.5)
        self.kill()
        raise AssertionError(f"the server did not answer in {timeout_s} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def client(self, token: str | None = OWN_TOKEN) -> httpx.Client:
        """A client sending ``token``: by default the server's own (its AUTOTUNER_API_TOKEN,
        if it has one); None sends none."""
        if token == OWN_TOKEN:
            token = self.env.get("AUTOTUNER_API_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)

    def wait_for_job(self, job_id: str, until: Any, timeout_s: float) -> dict[str, Any]:
        """Poll GET /v1/jobs/{id} until ``until(job)`` holds; return that job."""
        with self.client() as client:
            return wait_for(client, job_id, until, timeout_s, log=self.log)

    def stop(self, timeout_s: float = 90, require_clean_log: bool = True) -> None:
        """SIGTERM: a clean shutdown, which must complete. A fixture's teardown may skip the
        log check (test_restart asserts the clean shutdown itself): under load, a web-test
        server shared by the whole session once exited on SIGTERM without uvicorn's shutdown
        lines (seen once, at the end of a full run; not yet explained)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the server ignored SIGTERM for {timeout_s} s:\n{self.log()}") from None
        self._sweep()
        # uvicorn re-raises the signal it handled once it has shut down cleanly.
        assert code in (0, -signal.SIGTERM), (code, self.log())
        if require_clean_log:
            assert "Application shutdown complete" in self.log(), self.log()

    def kill(self) -> None:
        """kill -9 the server's process group, then whatever is left of its session."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)  # reap it: a zombie's pid still looks alive
        self._sweep()

    def _sweep(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + 20
        while (left := session_processes(self.proc.pid)) and time.monotonic() < deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)


def wait_for(
    client: httpx.Client,
    job_id: str,
    until: Any,
    timeout_s: float = 300,
    what: str = "",
    log: Any = lambda: "",
) -> dict[str, Any]:
    """Poll GET /v1/jobs/{id} until ``until(job)`` holds; return that job. ``log()``: what to
    show beside the job when it never does (a server's log)."""
    deadline = time.monotonic() + timeout_s
    job: dict[str, Any] = {}
    while time.monotonic() < deadline:
        response = client.get(f"/v1/jobs/{job_id}")
        assert response.status_code == 200, response.text
        job = response.json()
        if until(job):
            return job
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} never got {what or until} in {timeout_s:g} s: {job}\n{log()}")
