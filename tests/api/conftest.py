"""A real autotuner server for the API tests: `autotuner serve` in its own process session
on a free loopback port, with its own SQLite file and local Ray, talked to over HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from trials.distributed import free_port
from trials.launcher import session_processes

REPO = Path(__file__).resolve().parents[2]
TOKEN = "test-token-5f1c"
A = "actor_rollout_ref.actor."
R = "actor_rollout_ref.rollout."
FINISHED = ("succeeded", "failed", "cancelled")
MEASURED = ("ok", "oom", "error", "timeout")

# A train-only job on the tiny model: each trial is a few seconds of real torch steps.
TRAIN_JOB: dict[str, Any] = {
    "name": "api-train",
    "workload": {
        "model": "tiny",
        "dtype": "float32",
        "phases": "train",
        "prompt_length": {"kind": "fixed", "value": 16},
        "response_length": {"kind": "uniform", "low": 8, "high": 16},
        "max_prompt_length": 16,
        "max_response_length": 16,
        "train_batch_size": 8,
        "n": 1,
        "ppo_mini_batch_size": 4,
        "use_kl_loss": False,
    },
    "cluster": {"device": "cpu", "device_memory_gib": 2},
    "search": {
        A + "use_dynamic_bsz": False,
        A + "ppo_micro_batch_size_per_gpu": [1, 2, 4],
        R + "log_prob_micro_batch_size_per_gpu": [1, 2, 4],
        "actor_rollout_ref.model.enable_gradient_checkpointing": [True, False],
    },
    "budget": {"max_trials": 4, "trial_timeout_s": 120},
    "sampler": "random",
}


def train_job(**changes: Any) -> dict[str, Any]:
    """TRAIN_JOB with top-level sections updated (``budget={"max_trials": 2}``)."""
    job = json.loads(json.dumps(TRAIN_JOB))
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(job.get(key), dict):
            job[key].update(value)
        else:
            job[key] = value
    return job


class Server:
    """One `autotuner serve` process (and its Ray) in a process session of its own."""

    def __init__(self, data_dir: Path, log_path: Path, **env: str) -> None:
        self.data_dir, self.log_path = data_dir, log_path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = dict(os.environ)
        for key in (
            "AUTOTUNER_DATABASE_URL",
            "AUTOTUNER_HOST",
            "AUTOTUNER_PORT",
            "AUTOTUNER_API_TOKEN",
            "AUTOTUNER_MODELS_DIR",
            "AUTOTUNER_RAY_ADDRESS",
        ):
            self.env.pop(key, None)
        self.env.update({"AUTOTUNER_DATA_DIR": str(data_dir), "AUTOTUNER_RAY_NUM_CPUS": "2", **env})
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 120) -> Server:
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
                raise AssertionError(f"the server exited ({self.proc.returncode}):\n{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    return self
            time.sleep(0.5)
        self.kill()
        raise AssertionError(f"the server did not answer in {timeout_s} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def client(self, token: str | None = TOKEN) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)

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
    client: httpx.Client, job_id: str, until: Any, timeout_s: float = 300, what: str = ""
) -> dict[str, Any]:
    """Poll GET /v1/jobs/{id} until ``until(job)`` holds; return that job."""
    deadline = time.monotonic() + timeout_s
    job: dict[str, Any] = {}
    while time.monotonic() < deadline:
        response = client.get(f"/v1/jobs/{job_id}")
        assert response.status_code == 200, response.text
        job = response.json()
        if until(job):
            return job
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} never got {what or until}: {job}")


def trials_of(client: httpx.Client, job_id: str, **params: Any) -> list[dict[str, Any]]:
    response = client.get(f"/v1/jobs/{job_id}/trials", params=params)
    assert response.status_code == 200, response.text
    page = response.json()
    assert page["count"] == len(page["data"])
    return page["data"]


def submit(client: httpx.Client, job: dict[str, Any]) -> str:
    response = client.post("/v1/jobs", json=job)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The server's AUTOTUNER_MODELS_DIR, holding a copy of the tiny model's config."""
    root = tmp_path_factory.mktemp("models")
    (root / "tiny-copy").mkdir()
    shutil.copy(REPO / "autotuner" / "catalog" / "tiny.json", root / "tiny-copy" / "config.json")
    return root


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory, models_dir: Path) -> Iterator[Server]:
    """One server for the session's API tests: token set, models dir set, job caps low."""
    base = tmp_path_factory.mktemp("server")
    srv = Server(
        base / "data",
        base / "server.log",
        AUTOTUNER_API_TOKEN=TOKEN,
        AUTOTUNER_MODELS_DIR=str(models_dir),
        AUTOTUNER_MAX_JOB_TRIALS="50",
        AUTOTUNER_MAX_JOB_MINUTES="600",
        AUTOTUNER_MAX_REQUEST_BYTES="65536",
    )
    srv.start()
    yield srv
    srv.stop(require_clean_log=False)
    errors = [ln for ln in srv.log_path.read_text().splitlines() if re.search(r'HTTP/1\.1" 5\d\d', ln)]
    assert not errors, errors  # no request of the whole session got a 5xx


@pytest.fixture
def api(server: Server) -> Iterator[httpx.Client]:
    """A client with the token; jobs a test leaves unfinished are cancelled after it."""
    with server.client() as client:
        before = {j["id"] for j in client.get("/v1/jobs", params={"limit": 1000}).json()["data"]}
        yield client
        for job in client.get("/v1/jobs", params={"limit": 1000}).json()["data"]:
            if job["id"] not in before and job["status"] not in FINISHED:
                client.post(f"/v1/jobs/{job['id']}/cancel")
                wait_for(client, job["id"], lambda j: j["status"] in FINISHED, 120, "finished")


@pytest.fixture(scope="session")
def finished_job(server: Server) -> dict[str, Any]:
    """A train-only job of 4 trials, run to the end over HTTP."""
    with server.client() as client:
        job_id = submit(client, TRAIN_JOB)
        return wait_for(client, job_id, lambda j: j["status"] in FINISHED, 300, "finished")
