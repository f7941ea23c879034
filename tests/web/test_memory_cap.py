"""The job page's memory cap is the job's own (its spec's, else the one its runner recorded),
never one computed from the API host's devices: an API without GPUs (the compose deployment)
shows an H200 job's cap. The job's trials are replayed from the recorded H200 landscape."""

from __future__ import annotations

from pathlib import Path

import optuna
from fastapi.testclient import TestClient

from autotuner import hardware
from autotuner.api import web
from autotuner.replay import Landscape
from autotuner.spec import JobSpec

from .conftest import REPO, app_with_job, replay_runner

LANDSCAPE = REPO / "benchmarks" / "search" / "landscapes" / "qwen2.5-1.5b-h200.json"
optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_the_page_shows_the_cap_the_jobs_trials_ran_under(tmp_path: Path) -> None:
    landscape = Landscape.load(LANDSCAPE)
    data = landscape.spec.model_dump(mode="json")
    data["budget"] |= {"max_trials": 4, "remeasure_finalists": 0, "patience_trials": 0}
    spec = JobSpec.model_validate(data)
    assert spec.cluster.device_memory_gib is None and not hardware.gpus()  # none here to read
    app, job, study = app_with_job(tmp_path, spec)
    client = TestClient(app, base_url="http://127.0.0.1")
    cap = f"memory cap {web.fmt(landscape.memory_cap_gib)} GiB"
    assert cap not in client.get(f"/jobs/{job.id}").text  # not run yet: no cap known

    replay_runner(spec, study, landscape).run()

    assert app.state.service.get_job(job.id).memory_cap_gib == landscape.memory_cap_gib
    assert cap in client.get(f"/jobs/{job.id}").text
