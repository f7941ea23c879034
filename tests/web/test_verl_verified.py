"""A job verified in verl, end to end on a CPU: the recorded H200 landscape of the
Qwen2.5-1.5B job replayed into a real job's study, its baselines and fastest front trials run
through the study loop's verification in real Ray tasks that hold the job's (logical) GPU,
recorded in the job's database, and read back through the JSON API, the web page, the
export header and the CLI.

verl cannot run a training step on a CPU: the verification's launch function (its seam,
``launch_verl`` by default) is ``_stand_in_for_verl`` here, which returns the
``VerlRunResult`` the runner's own parser reads from the lines verl's console logger prints
(``tests/verl_logs.py``, checked against verl's logger in tests/autotuner/test_verification.py).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import markupsafe
import optuna
import pytest
import ray
from fastapi.testclient import TestClient
from ray import cloudpickle

from autotuner.api.errors import ConflictError, NotFoundError
from autotuner.records import TrialRecord, TrialStatus
from autotuner.replay import Landscape
from autotuner.settings import Settings
from autotuner.spec import JobSpec
from autotuner.summary import pick
from autotuner.verification import VerlRunner, interleave, job_verification
from storage import VerlRunStore
from trials.step import replay_poll_wait_s
from trials.verl.types import VerlRunResult, VerlRunSpec

from .. import verl_logs
from ..verl_logs import step_metrics, verl_result
from .conftest import app_with_job, replay_runner

REPO = Path(__file__).resolve().parents[2]
LANDSCAPE = REPO / "benchmarks" / "search" / "landscapes" / "qwen2.5-1.5b-h200.json"
optuna.logging.set_verbosity(optuna.logging.WARNING)
# Ray pickles the stand-in by value: its workers need not import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(verl_logs)


def _stand_in_for_verl(
    spec: VerlRunSpec, timeout_s: float, cache_dir: Path, python: str, env: dict[str, str] | None
) -> VerlRunResult:
    """What verl would log for ``spec``'s config: faster with the rollout's larger memory
    share (so verl ranks the configs its own way), slower in the warm-up step."""
    if (env or {}).get("STAND_IN_SLEEP_S"):
        time.sleep(float((env or {})["STAND_IN_SLEEP_S"]))
    share = next(
        float(line.split("=")[1]) for line in spec.overrides if "rollout.gpu_memory_utilization=" in line
    )
    micro = next(
        int(line.split("=")[1]) for line in spec.overrides if "actor.ppo_micro_batch_size_per_gpu=" in line
    )
    throughput = 2000.0 + 1000.0 * share + 2.0 * micro
    phases = {
        "gen": 30.0 / share,
        "old_log_prob": 3.0,
        "ref": 2.5,
        "update_actor": 8.0,
        "update_weights": 0.7,
    }
    steps = [step_metrics(throughput / 4, phases)] + [
        step_metrics(throughput + k, phases) for k in range(spec.steps - 1)
    ]
    result = verl_result(spec.run_id, steps, spec.warmup_steps)
    result.device = f"stand-in for verl ({len(ray.get_gpu_ids())} GPU)"
    return result


@pytest.fixture(scope="module")
def ray_with_a_gpu() -> Iterator[None]:
    """A local Ray of this module's own with one logical GPU (the job's world)."""
    ray.init(
        address="local", num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False,
        configure_logging=False,
    )  # fmt: skip
    yield
    ray.shutdown()


def _spec() -> JobSpec:
    data = Landscape.load(LANDSCAPE).spec.model_dump(mode="json")
    data["budget"] |= {
        "max_trials": 8, "remeasure_finalists": 1, "remeasure_runs": 2, "patience_trials": 0,
        "verify_in_verl": 2, "verify_rounds": 2,
    }  # fmt: skip
    return JobSpec.model_validate(data)


def test_verified_trials_are_recorded_and_shown_everywhere(
    tmp_path: Path, ray_with_a_gpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    landscape, spec = Landscape.load(LANDSCAPE), _spec()
    app, job, study = app_with_job(tmp_path, spec)
    service = app.state.service
    store = VerlRunStore(service.ctx.database)
    runner = replay_runner(spec, study, landscape)
    runner.verification = job_verification(
        store, job.id, spec, landscape.arch, service.ctx.settings, 2, lambda: False, launch=_stand_in_for_verl
    )
    runner.enqueue_baseline()
    result = runner.run()

    source = runner.verification.source
    chosen = [r.number for r in source.chosen]
    assert source.chosen[0].baseline == "verl-v0.9-defaults"
    assert len(chosen) >= 3 and len(set(chosen)) == len(chosen)
    stored = store.list(job.id)
    expected = [(r.number, k) for r, k in interleave(source.chosen, 2, {})]
    assert [(s.trial_number, s.round) for s in stored] == expected  # A-B-C-A-B-C
    assert all(s.status == "ok" for s in stored)
    assert f"verified in verl ({len(expected)} runs)" in result.stop_reason

    view = service.get_job(job.id)
    medians = {n: v.median for n, v in view.verl.items()}
    verl_best = max(medians, key=lambda n: (medians[n], -n))
    assert view.best is not None and view.best.number == verl_best
    assert pick(spec, view.records)[0] is not None  # the trials' own pick still exists
    device = view.verl[verl_best].device()
    assert device == "stand-in for verl (1 GPU)"  # each run held the job's world of GPUs

    client = TestClient(app, base_url="http://127.0.0.1")
    shown = client.get(f"/v1/jobs/{job.id}").json()["best"]
    assert shown["number"] == verl_best and shown["picked_by"] == "verl"
    assert shown["verl"]["throughput_median"] == medians[verl_best]
    trials = {t["number"]: t for t in client.get(f"/v1/jobs/{job.id}/trials").json()["data"]}
    for number in chosen:
        verl = trials[number]["verl"]
        assert verl["status"] == "ok" and verl["runs"] == 2 and verl["ok_runs"] == 2
        assert set(verl["medians"]) >= {"perf/throughput", "timing_s/gen", "timing_s/update_weights"}
        assert verl["versions"]["verl"] == "0.9.1"
        errors = verl["prediction_error_pct"]
        trial = trials[number]
        timed = {"rollout", "old_log_prob", "ref_log_prob", "update_actor", "weight_sync"}
        assert set(errors) == (timed & set(trial["phase_timings_s"])) | {"step", "throughput"}
        # The trial's gen is its rollout, the replay buffer's poll after it and the engine's
        # sleep (none on the CPU: there the engine is shut down), as verl times it.
        # (replayed trials were recorded before the poll was a part: it is derived for them)
        gen, t = verl["medians"]["timing_s/gen"], trial["phase_timings_s"]
        poll = t.get("rollout_poll", replay_poll_wait_s(t["rollout"]))
        slept = t.get("engine_sleep", 0.0)
        assert errors["rollout"] == pytest.approx(100 * (t["rollout"] + poll + slept - gen) / gen)
    assert all(t["verl"] is None for n, t in trials.items() if n not in chosen)
    # verl's own noise: each verdict's measured steps (2 runs of verify_steps - 1), and the
    # winner against the others inside the wider of two verdicts' noises (or the floor).
    verls = {n: trials[n]["verl"] for n in chosen}
    for verl in verls.values():
        assert verl["steps"] == 2 * (spec.budget.verify_steps - 1)
        assert verl["noise_pct"] == max(verl["spread_pct"], verl["steps_spread_pct"])
        # The stand-in's phases do not move from step to step; its throughput does.
        assert verl["phase_spread_pct"]["rollout"] == 0.0
        assert verl["phase_spread_pct"]["throughput"] == verl["steps_spread_pct"] > 0
    verl_pick = client.get(f"/v1/jobs/{job.id}").json()["verl_pick"]
    assert verl_pick["trial"] == verl_best and verl_pick["summary"]
    top = verls[verl_best]
    for number in chosen:
        if number == verl_best:
            continue
        band = max(spec.budget.noise_band_pct, top["noise_pct"], verls[number]["noise_pct"])
        gap = top["throughput_median"] - verls[number]["throughput_median"]
        assert (number in verl_pick["tied_with"]) == (gap <= top["throughput_median"] * band / 100)
    defaults = verls[source.chosen[0].number]
    assert verl_pick["over_defaults"] == pytest.approx(
        top["throughput_median"] / defaults["throughput_median"]
    )
    best = client.get(f"/v1/jobs/{job.id}/best").json()
    assert best["number"] == verl_best and best["verl"]["ok_runs"] == 2

    exported = client.get(f"/v1/jobs/{job.id}/trials/{verl_best}/config").text
    verdict = view.verl[verl_best]
    assert f"# verl: {medians[verl_best]:.1f} tok/s/GPU in verl (median of 2 runs, spread" in exported
    assert f"on {verdict.device()}" in exported

    page = client.get(f"/jobs/{job.id}").text
    assert page.count('class="tag verl-tag"') == len(chosen)
    assert "verl tokens/s/GPU" in page and "verl prediction error %" in page
    assert "fastest in verl" in page and "picked by verl" in page
    assert str(markupsafe.escape(verl_pick["summary"])) in page  # as the page escapes it

    # The CLI's report of the job, from the same database.
    from typer.testing import CliRunner

    from autotuner import settings as settings_module
    from autotuner.cli import app as cli

    monkeypatch.setenv("AUTOTUNER_DATABASE_URL", service.ctx.settings.resolved_database_url)
    monkeypatch.setenv("AUTOTUNER_DATA_DIR", str(tmp_path))
    settings_module.get_settings.cache_clear()
    try:
        report = CliRunner().invoke(cli, ["jobs", job.id], env={"COLUMNS": "200"})
    finally:
        settings_module.get_settings.cache_clear()
    assert report.exit_code == 0, report.output
    assert report.output.count("[verl]") == len(chosen)
    assert f"{medians[verl_best]:10.1f} tok/s/GPU (median of 2 runs" in report.output
    assert "trial off by: rollout" in report.output
    assert f"winner: trial {verl_best}, picked by verl" in report.output
    assert f"in verl, trial {verl_best}: {verl_pick['summary']}" in report.output

    # `autotuner verify JOB --trial N` through the service: a finished job only; then two
    # more runs, numbered after the ones it has.
    with pytest.raises(ConflictError, match="is queued: verify a finished job"):
        service.verify(job.id, [chosen[-1]], launch=_stand_in_for_verl)
    service.ctx.store.claim(job.id, "test:1")
    service.ctx.store.finish(job.id, "succeeded", stop_reason=result.stop_reason, runner_id="test:1")
    with pytest.raises(NotFoundError, match="has no trial 999 with a config"):
        service.verify(job.id, [999], launch=_stand_in_for_verl)
    again = service.verify(job.id, [chosen[-1]], launch=_stand_in_for_verl)
    assert [(s.trial_number, s.round) for s in store.list(job.id)][len(expected) :] == [
        (chosen[-1], 2),
        (chosen[-1], 3),
    ]
    assert len(again.verl[chosen[-1]].runs) == 4


def test_a_cancelled_job_stops_verifying_and_records_nothing(tmp_path: Path, ray_with_a_gpu: None) -> None:
    landscape, spec = Landscape.load(LANDSCAPE), _spec()
    app, job, study = app_with_job(tmp_path, spec)
    service = app.state.service
    store = VerlRunStore(service.ctx.database)
    runner = replay_runner(spec, study, landscape)
    runner.enqueue_baseline()
    runner.run()  # the search and the finalists, no verification
    cancel_at = time.monotonic() + 3.0
    verification = job_verification(
        store, job.id, spec, landscape.arch, service.ctx.settings, 2,
        stop_requested=lambda: time.monotonic() > cancel_at, launch=_stand_in_for_verl,
    )  # fmt: skip
    verification.runner.env["STAND_IN_SLEEP_S"] = "120"
    started = time.monotonic()
    from autotuner.proposals import SearchState

    note = verification.run(SearchState(spec, runner.space, study))
    assert note is None  # cancelled: the study loop ends the job as cancelled
    assert time.monotonic() - started < 60  # the run in flight was killed, not waited for
    assert store.list(job.id) == []
    assert ray.available_resources().get("GPU", 0) == pytest.approx(1.0) or _gpu_freed()


def _gpu_freed(timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ray.available_resources().get("GPU", 0) >= 1.0:
            return True
        time.sleep(0.5)
    return False


def test_the_verify_command_refuses_a_cpu_job(tmp_path: Path) -> None:
    env: dict[str, Any] = dict(os.environ) | {"AUTOTUNER_DATA_DIR": str(tmp_path / "data")}
    env.pop("AUTOTUNER_DATABASE_URL", None)
    settings = Settings(data_dir=tmp_path / "data")
    from autotuner.jobs import JobContext
    from autotuner.spec import load_job_spec

    ctx = JobContext.open(settings)
    job = ctx.submit(load_job_spec(REPO / "autotuner" / "examples" / "demo.yaml"))
    ctx.store.claim(job.id, "test:1")
    ctx.store.finish(job.id, "succeeded", stop_reason="done", runner_id="test:1")
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "autotuner.cli", "verify", job.id], env=env, cwd=REPO,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    said = " ".join(done.stderr.split())
    assert "runs on cpu, where verl cannot run a training step; verify it on a host whose GPUs" in said


def test_a_world_larger_than_every_node_is_not_run(tmp_path: Path, ray_with_a_gpu: None) -> None:
    landscape = Landscape.load(LANDSCAPE)
    data = _spec().model_dump(mode="json")
    data["cluster"]["n_gpus_per_node"] = 2
    spec = JobSpec.model_validate(data)
    trial = TrialRecord(0, TrialStatus.OK, config=landscape.points[0].config)
    runner = VerlRunner(spec, landscape.arch, sys.executable, tmp_path, launch=_stand_in_for_verl)
    started = time.monotonic()
    result = runner.run(trial, "too-big", timeout_s=600)
    assert result is not None and result.status == "error" and result.error_type == "NotEnoughGpus"
    assert "on 2 GPUs of one node, but the Ray cluster's largest node has 1" in (result.error_message or "")
    assert time.monotonic() - started < 10
