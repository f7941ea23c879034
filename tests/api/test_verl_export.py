"""Export re-checks a config with verl's own validation, in verl's environment (the real
service on loopback, its SQLite database, verl 0.9's own config code): a config verl
accepts is written with a header saying so, a second time from the cache; one verl
rejects (stored by a tuner whose own checks let it through) is refused with 422 naming
verl's complaint, from the API and the CLI; without verl's environment the header says
verl's check was not run."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from autotuner.export import verl_config
from autotuner.settings import Settings
from autotuner.spec import read_stored_spec
from autotuner.verl_check import VerlChecker

from .conftest import REPO, TOKEN, A, Server, submit, train_job, wait_for

MICRO = A + "ppo_micro_batch_size_per_gpu"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def verl_version() -> str:
    python, version, reason = VerlChecker(Settings()).environment()
    if version is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"verl's environment ({python}): {reason}; run scripts/setup.sh")
        pytest.skip(f"verl's environment ({python}): {reason}")
    return version


@pytest.fixture(scope="module")
def scene(
    tmp_path_factory: pytest.TempPathFactory, verl_version: str
) -> Iterator[tuple[Server, dict[str, Any]]]:
    """A server of its own and a finished job of two trials on it (a ``scene``: the module's
    tests run on one worker, tests/conftest.py)."""
    base = tmp_path_factory.mktemp("verl-export")
    server = Server(base / "data", base / "server.log", AUTOTUNER_API_TOKEN=TOKEN).start()
    try:
        with server.client() as api:
            job_id = submit(api, train_job(name="verl-export", budget={"max_trials": 2}))
            job = wait_for(
                api, job_id, lambda j: j["status"] in ("succeeded", "failed", "cancelled"), 300, "done"
            )
            assert job["status"] == "succeeded", job
        yield server, job
    finally:
        server.stop(require_clean_log=False)


def _config_url(job: dict[str, Any], number: int, fmt: str = "yaml") -> str:
    return f"/v1/jobs/{job['id']}/trials/{number}/config?format={fmt}"


def test_a_config_verl_accepts_is_written_saying_so(scene, verl_version) -> None:
    server, job = scene
    with server.client() as api:
        first = api.get(_config_url(job, 0))
        assert first.status_code == 200, first.text
        assert f"# verl check: passed verl {verl_version}'s own validation" in first.text
        started = time.monotonic()
        again = api.get(_config_url(job, 0, "overrides"))  # the same config: verl's verdict kept
        assert again.status_code == 200 and time.monotonic() - started < 1.0
        assert f"passed verl {verl_version}'s own validation" in again.text


def _tamper(server: Server, job: dict[str, Any], number: int) -> dict[str, Any]:
    """Drop the fixed micro-batch size from a stored trial's config (as a tuner before the
    baselines filled it would have stored it): the config the trial now holds."""
    db = sqlite3.connect(server.data_dir / "autotuner.db")
    try:
        (trial_id, value), *_ = db.execute(
            "SELECT t.trial_id, a.value_json FROM trials t JOIN studies s ON s.study_id = t.study_id "
            "JOIN trial_user_attributes a ON a.trial_id = t.trial_id "
            "WHERE s.study_name = ? AND t.number = ? AND a.key = 'config'",
            (f"job-{job['id']}", number),
        ).fetchall()
        config = json.loads(value)
        assert config[A + "use_dynamic_bsz"] is False
        del config[MICRO]
        db.execute(
            "UPDATE trial_user_attributes SET value_json = ? WHERE trial_id = ? AND key = 'config'",
            (json.dumps(config), trial_id),
        )
        db.commit()
    finally:
        db.close()
    return dict(config)


def test_a_config_verl_rejects_is_refused_naming_verls_complaint(scene, verl_version) -> None:
    server, job = scene
    config = _tamper(server, job, 1)
    verl_config(config, read_stored_spec(json.dumps(job["spec"])))  # the tuner's own checks pass it
    complaint = (
        "Please set at least one of 'actor.ppo_micro_batch_size' or 'actor.ppo_micro_batch_size_per_gpu'"
    )
    with server.client() as api:
        for fmt in ("yaml", "overrides"):
            refused = api.get(_config_url(job, 1, fmt))
            assert refused.status_code == 422, refused.text
            (item,) = refused.json()["detail"]
            assert item["loc"] == ["path", "number"] and item["type"] == "verl_rejected"
            assert f"verl {verl_version} rejects" in item["msg"] and complaint in item["msg"]
            assert str(server.data_dir) not in item["msg"] and "/tmp/" not in item["msg"]
    done = subprocess.run(
        [sys.executable, "-m", "autotuner.cli", "export", job["id"], "--trial", "1", "--server", server.url],
        env={**os.environ, "AUTOTUNER_API_TOKEN": TOKEN, "COLUMNS": "300"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0 and done.stdout == ""
    assert "422" in done.stderr + done.stdout and "ppo_micro_batch_size_per_gpu" in " ".join(
        done.stderr.split()
    )


def test_without_verls_environment_the_header_says_its_check_was_not_run(scene, tmp_path: Path) -> None:
    server, job = scene
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOTUNER_")}
    env |= {
        "AUTOTUNER_DATA_DIR": str(server.data_dir),
        "AUTOTUNER_ENGINE_PYTHON__VERL": sys.executable,  # the tuner's own Python: no verl there
        "AUTOTUNER_RAY_NUM_CPUS": "1",
    }
    done = subprocess.run(
        [sys.executable, "-m", "autotuner.cli", "export", job["id"], "--trial", "0"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "# verl check: not run (verl is not installed in its environment" in done.stdout
    assert "the config passed the tuner's own checks only" in done.stdout
    assert "ppo_micro_batch_size_per_gpu: " in done.stdout  # the config is written
