"""A real autotuner server for the API tests: `autotuner serve` in its own process session
on a free loopback port, with its own SQLite file and local Ray, talked to over HTTP."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ..serving import Server, wait_for

__all__ = ["Server", "wait_for"]  # the API tests import them from here

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
    # One run per baseline: these jobs test the service, not the noise (``finished_job`` and
    # tests/web/test_noise_shown.py do).
    "budget": {"max_trials": 4, "trial_timeout_s": 120, "baseline_runs": 1},
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


@contextlib.contextmanager
def postgres_server(tmp_path: Path, postgres_url: str) -> Iterator[Server]:
    """A server of the test's own on ``postgres_url`` (token set), stopped afterwards."""
    server = Server(
        tmp_path / "data",
        tmp_path / "server.log",
        AUTOTUNER_API_TOKEN=TOKEN,
        AUTOTUNER_DATABASE_URL=postgres_url,
    ).start()
    try:
        yield server
    finally:
        server.stop(require_clean_log=False)


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
    """A train-only job of 4 trials, run to the end over HTTP; its baselines run first, mid-job
    and last (the API's noise and tie figures)."""
    with server.client() as client:
        job_id = submit(client, train_job(budget={"baseline_runs": 3}))
        return wait_for(client, job_id, lambda j: j["status"] in FINISHED, 300, "finished")
