"""Why a trial ran, shown where the trial is: a job replayed from the recorded H200
landscape into its own study, read through the page and the API."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
from fastapi.testclient import TestClient

from autotuner.replay import Landscape
from autotuner.spec import JobSpec

from .conftest import app_with_job, replay_runner

REPO = Path(__file__).resolve().parents[2]
LANDSCAPE = REPO / "benchmarks" / "search" / "landscapes" / "qwen2.5-1.5b-h200.json"
optuna.logging.set_verbosity(optuna.logging.WARNING)
GMU, SEQS = "actor_rollout_ref.rollout.gpu_memory_utilization", "actor_rollout_ref.rollout.max_num_seqs"
ROLLOUT = (GMU, SEQS)


def test_a_trial_run_to_try_a_new_rollout_setting_says_so_on_the_page_and_in_the_api(tmp_path: Path) -> None:
    """On this landscape the study pairs each of its 4 rollout settings with verl's defaults'
    train side right after the baselines (the best one here, so no composition beats them afterwards: the
    compositions' own record is tested in tests/autotuner/test_compose.py)."""
    landscape = Landscape.load(LANDSCAPE)
    data = landscape.spec.model_dump(mode="json")
    data["budget"] |= {"max_trials": 12, "remeasure_finalists": 0, "patience_trials": 0}
    spec = JobSpec.model_validate(data)
    app, job, study = app_with_job(tmp_path, spec)
    runner = replay_runner(spec, study, landscape)
    runner.enqueue_baseline()
    runner.run()

    client = TestClient(app, base_url="http://127.0.0.1")
    trials = client.get(f"/v1/jobs/{job.id}/trials").json()["data"]
    exploring = [t for t in trials if t["explores_with"] is not None]
    baselines = len([t for t in trials if t["baseline"]])  # verl's defaults and its example
    assert baselines >= 1 and trials[0]["baseline"] == "verl-v0.9-defaults"
    expected = list(range(baselines, baselines + 3))
    assert [t["number"] for t in exploring] == expected, [(t["number"], t["status"]) for t in trials]
    firsts = [trials[0]] + exploring  # the defaults' rollout setting, then the three others
    assert {json.dumps({k: t["config"][k] for k in ROLLOUT}) for t in firsts} == {
        json.dumps({GMU: g, SEQS: n}) for g in (0.5, 0.8) for n in (256, 1024)
    }
    page = client.get(f"/jobs/{job.id}").text
    for t in exploring:
        assert f"new rollout + #{t['explores_with']}</span>" in page
