"""Jobs over HTTP end to end: real trials, the Pareto front, the best trial, config downloads,
cancelling and deleting, and the CLI as the server's client."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from autotuner.export import VERL_KEYS, load_exported_yaml
from trials.device import host_cpus, host_kind
from trials.launcher import scratch_dirs

from .conftest import MEASURED, REPO, TOKEN, A, R, submit, train_job, trials_of, wait_for

THROUGHPUT = "throughput_tokens_per_s_per_gpu"
MEMORY = "peak_memory_gib"


def test_a_train_job_runs_to_succeeded_and_reports_its_trials(server, finished_job) -> None:
    job = finished_job
    assert job["status"] == "succeeded", job
    assert job["stop_reason"] == "reached max_trials (4)"
    assert job["trials_done"] == job["trials_total"] == 4
    assert job["elapsed_s"] > 0 and job["eta_s"] is None
    assert job["url"] == f"{server.url}/v1/jobs/{job['id']}"
    with server.client() as api:
        trials = trials_of(api, job["id"])
        measured = [t for t in trials if t["status"] in MEASURED and t["repeat_of"] is None]
        assert len(measured) == 4 and all(t["measured"] for t in measured)
        # verl's defaults ran first, again mid-job and last: three runs, their spread the noise.
        defaults = next(t for t in measured if t["baseline"] == "verl-v0.9-defaults")
        assert defaults["runs"]["runs"] == 3
        assert job["noise"]["runs"] >= 3 and job["noise"]["measured_pct"] is not None
        ok = [t for t in measured if t["status"] == "ok"]
        assert ok, trials
        for t in ok:  # every metric of each trial is there
            assert t["metrics"][THROUGHPUT] > 0 and t["metrics"][MEMORY] > 0
            assert t["metrics"]["step_time_s"] > 0 and "update_actor_tokens_per_s" in t["metrics"]
            assert t["device"].startswith("cpu")
            assert t["config"][A + "ppo_micro_batch_size_per_gpu"] in (1, 2, 4)
        # What the job cost (each run's wall time; a CPU run counts as one device), and what it
        # had cost when the winner's first run ended: the runs numbered up to it.
        assert job["gpu_seconds"] == pytest.approx(sum(t["wall_s"] for t in trials))
        to_best = sum(t["wall_s"] for t in trials if t["number"] <= job["best"]["number"])
        assert job["gpu_seconds_to_best"] == pytest.approx(to_best)
        assert 0 < to_best <= job["gpu_seconds"]
        # Every run ran on this machine: one kind of host, named with its runs.
        assert job["hosts"] == {host_kind(host_cpus()): sum(t["status"] in MEASURED for t in trials)}
        # The earliest trial inside the winner's tie band, and what the job had spent by it.
        assert job["first_tied"] is not None and job["first_tied"] <= job["best"]["number"]
        to_tie = sum(t["wall_s"] for t in trials if t["number"] <= job["first_tied"])
        assert job["gpu_seconds_to_tie"] == pytest.approx(to_tie)
        # ... and the search's own first there, verl's baselines left out: the same trial unless
        # that one is a baseline.
        baselines = {t["number"] for t in measured if t["baseline"]}
        own = job["first_tied_proposed"]
        if job["first_tied"] not in baselines:
            assert own == job["first_tied"]
        elif own is None:
            assert job["best"]["number"] in baselines and job["gpu_seconds_to_tie_proposed"] is None
        else:
            assert own not in baselines and own != job["first_tied"]
            to_own = sum(t["wall_s"] for t in trials if t["number"] <= own)
            assert job["gpu_seconds_to_tie_proposed"] == pytest.approx(to_own)
        fastest = max(ok, key=lambda t: t["runs"]["median"])  # the median of its runs
        if fastest["runs"]["runs"] == 1:
            assert job["best"]["number"] == fastest["number"]
            assert job["best"][THROUGHPUT] == fastest["metrics"][THROUGHPUT]
        else:  # re-measured: a config tied with it inside the noise may win on memory
            assert job["best"]["runs"]["runs"] >= 2
        only_ok = trials_of(api, job["id"], status="ok")
        assert [t["number"] for t in only_ok] == [t["number"] for t in trials if t["status"] == "ok"]
        page = api.get(f"/v1/jobs/{job['id']}/trials", params={"offset": 1, "limit": 2}).json()
        assert page["count"] == len(trials) and [t["number"] for t in page["data"]] == [
            t["number"] for t in trials[1:3]
        ]
        listed = api.get("/v1/jobs", params={"status": "succeeded"}).json()
        assert job["id"] in [j["id"] for j in listed["data"]]
        assert all(j["status"] == "succeeded" for j in listed["data"])


def _dominates(p: dict, q: dict, objectives: list[dict]) -> bool:
    better_or_equal, strictly = True, False
    for o in objectives:
        sign = 1 if o["direction"] == "maximize" else -1
        a, b = sign * p["metrics"][o["metric"]], sign * q["metrics"][o["metric"]]
        better_or_equal &= a >= b
        strictly |= a > b
    return better_or_equal and strictly


def test_the_pareto_front_is_exactly_the_non_dominated_feasible_trials(server, finished_job) -> None:
    job_id = finished_job["id"]
    with server.client() as api:
        front = api.get(f"/v1/jobs/{job_id}/pareto").json()
        trials = trials_of(api, job_id)
    objectives = front["objectives"]
    assert objectives == [
        {"metric": THROUGHPUT, "direction": "maximize"},
        {"metric": MEMORY, "direction": "minimize"},
    ]
    feasible = [t for t in trials if t["feasible"]]  # re-runs count in their trial's median
    expected = {p["number"] for p in feasible if not any(_dominates(q, p, objectives) for q in feasible)}
    assert {p["number"] for p in front["data"]} == expected
    assert front["count"] == len(expected) >= 1
    for point in front["data"]:
        trial = next(t for t in trials if t["number"] == point["number"])
        assert point["objectives"] == {
            THROUGHPUT: trial["metrics"][THROUGHPUT],
            MEMORY: trial["metrics"][MEMORY],
        }
        assert point["config"] == trial["config"]


def test_best_under_a_memory_cap_and_the_config_download(server, finished_job) -> None:
    job_id = finished_job["id"]
    with server.client() as api:
        ok = [t for t in trials_of(api, job_id, status="ok") if t["feasible"]]  # not the re-runs
        best = api.get(f"/v1/jobs/{job_id}/best").json()
        assert best["number"] == finished_job["best"]["number"]
        cap = min(t["metrics"][MEMORY] for t in ok)
        under = [t for t in ok if t["metrics"][MEMORY] <= cap]
        capped = api.get(f"/v1/jobs/{job_id}/best", params={"max_peak_memory_gib": cap}).json()
        assert capped["number"] == max(under, key=lambda t: t["runs"]["median"])["number"]
        none = api.get(f"/v1/jobs/{job_id}/best", params={"max_peak_memory_gib": cap / 1000})
        assert none.status_code == 404 and none.json()["field"] == "max_peak_memory_gib"

        got = api.get(f"/v1/jobs/{job_id}/trials/{best['number']}/config", params={"format": "yaml"})
        assert got.status_code == 200, got.text
        assert got.headers["content-type"].startswith("application/yaml")
        assert got.headers["content-disposition"] == (
            f'attachment; filename="api-train-trial{best["number"]}.yaml"'
        )
        flat = load_exported_yaml(got.text)
        assert set(flat) <= VERL_KEYS
        for key, value in best["config"].items():
            if key in flat:
                assert flat[key] == value, key
        assert flat[A + "ppo_micro_batch_size_per_gpu"] == best["config"][A + "ppo_micro_batch_size_per_gpu"]
        assert flat["data.train_batch_size"] == 8
        assert f"# device: {best['device']}" in got.text or best["device"] in got.text

        overrides = api.get(
            f"/v1/jobs/{job_id}/trials/{best['number']}/config", params={"format": "overrides"}
        )
        assert overrides.status_code == 200
        assert overrides.headers["content-disposition"].endswith('.overrides"')
        lines = [ln for ln in overrides.text.splitlines() if ln and not ln.startswith("#")]
        assert "data.train_batch_size=8" in lines and all("=" in ln for ln in lines)


def _cli(*args: str, token: str | None = TOKEN) -> subprocess.CompletedProcess[str]:
    extra = ["--token", token] if token else []
    return subprocess.run(
        [sys.executable, "-m", "autotuner.cli", *args, *extra],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_cli_talks_to_the_server(server, finished_job, tmp_path) -> None:
    job_id = finished_job["id"]
    shown = _cli("status", job_id, "--server", server.url)
    assert shown.returncode == 0, shown.stderr
    assert f"job {job_id} (api-train): succeeded" in shown.stdout
    # One line a fact, however long (the cost line is, with both tie-band figures): piped
    # output is not wrapped at the console's width.
    assert all(line.startswith(("job ", "  ")) for line in shown.stdout.splitlines()), shown.stdout
    assert "trials: 4/4" in shown.stdout and "best so far: trial" in shown.stdout
    assert "  noise: " in shown.stdout and "tie band" in shown.stdout  # the baselines' spread
    assert re.search(r"verl-v0\.9-defaults \(trial 0\): [\d.]+ tok/s/GPU \(n=3", shown.stdout), shown.stdout
    cost = f"  cost: {finished_job['gpu_seconds'] / 60:.1f} GPU-minutes; the best was found after "
    assert f"{cost}{finished_job['gpu_seconds_to_best'] / 60:.1f}" in shown.stdout, shown.stdout
    tie = f"; a config inside its tie band (trial {finished_job['first_tied']}) after "
    if finished_job["first_tied"] == finished_job["best"]["number"]:
        assert tie not in shown.stdout, shown.stdout
    else:
        assert f"{tie}{finished_job['gpu_seconds_to_tie'] / 60:.1f}" in shown.stdout, shown.stdout
    own = finished_job["first_tied_proposed"]
    said = f"; the search's first config inside its tie band (trial {own}) after "
    if own in (None, finished_job["first_tied"], finished_job["best"]["number"]):
        assert "the search's first" not in shown.stdout, shown.stdout
    else:
        assert f"{said}{finished_job['gpu_seconds_to_tie_proposed'] / 60:.1f}" in shown.stdout, shown.stdout

    exported = _cli("export", job_id, "--server", server.url)
    assert exported.returncode == 0, exported.stderr
    with server.client() as api:
        best = api.get(f"/v1/jobs/{job_id}/best").json()
        expected = api.get(f"/v1/jobs/{job_id}/trials/{best['number']}/config").text
    assert exported.stdout == expected
    overrides = _cli("export", job_id, "--trial", "0", "--format", "overrides", "--server", server.url)
    assert overrides.returncode == 0 and "data.train_batch_size=8" in overrides.stdout

    missing = _cli("status", "0" * 32, "--server", server.url)
    assert missing.returncode == 2 and "404" in missing.stderr

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"workload": {"model": "tiny", "n": 0}}))
    refused = _cli("submit", str(bad), "--server", server.url)
    assert refused.returncode == 2 and "workload.n" in refused.stderr
    unauthorised = _cli("submit", str(bad), "--server", server.url, token="wrong")
    assert unauthorised.returncode == 2 and "401" in unauthorised.stderr

    good = tmp_path / "job.yaml"
    good.write_text(yaml.safe_dump(train_job(name="cli-submitted", budget={"max_trials": 1})))
    submitted = _cli("submit", str(good), "--server", server.url)
    assert submitted.returncode == 0, submitted.stderr
    new_id = re.search(r"job ([0-9a-f]{32}) queued", submitted.stdout).group(1)
    with server.client() as api:
        assert api.get(f"/v1/jobs/{new_id}").json()["name"] == "cli-submitted"
        api.post(f"/v1/jobs/{new_id}/cancel")
        wait_for(api, new_id, lambda j: j["status"] in ("cancelled", "succeeded"), 120)
        assert api.delete(f"/v1/jobs/{new_id}").status_code == 204


def test_a_yaml_body_is_accepted(api) -> None:
    body = yaml.safe_dump(train_job(name="yaml-job", budget={"max_trials": 1}))
    created = api.post("/v1/jobs", content=body, headers={"Content-Type": "application/yaml"})
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    assert created.headers["location"] == created.json()["url"]
    assert created.headers["location"].endswith(f"/v1/jobs/{job_id}")
    job = api.get(created.headers["location"]).json()
    assert job["name"] == "yaml-job" and job["spec"]["budget"]["max_trials"] == 1
    api.post(f"/v1/jobs/{job_id}/cancel")
    wait_for(api, job_id, lambda j: j["status"] in ("cancelled", "succeeded"), 120)
    assert api.delete(f"/v1/jobs/{job_id}").status_code == 204
    assert api.get(f"/v1/jobs/{job_id}").status_code == 404


def test_cancel_stops_a_running_job_and_keeps_what_it_measured(api, models_dir) -> None:
    # The model is given as a path inside the server's models directory.
    job = train_job(name="to-cancel", budget={"max_trials": 40})
    job["workload"]["model"] = "tiny-copy"
    job_id = submit(api, job)
    stored = api.get(f"/v1/jobs/{job_id}").json()
    assert stored["spec"]["workload"]["model"] == str((models_dir / "tiny-copy").resolve())
    wait_for(
        api,
        job_id,
        lambda j: j["status"] == "running" and j["trials_done"] >= 1,
        120,
        "running with a measured trial",
    )
    refused = api.delete(f"/v1/jobs/{job_id}")
    assert refused.status_code == 409 and "cancel" in refused.json()["detail"]
    before = {t["number"]: t for t in trials_of(api, job_id) if t["status"] in MEASURED}
    # Cancel while a trial runs (its scratch folder exists): it is recorded as cancelled.
    deadline = time.monotonic() + 60
    while not (running := [t for t in trials_of(api, job_id) if t["status"] == "running"]) or not (
        scratch_dirs(f"job-{job_id}")
    ):
        assert time.monotonic() < deadline, "no trial of the job was seen running"
        time.sleep(0.05)

    cancelled = api.post(f"/v1/jobs/{job_id}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["cancel_requested"] is True
    job = wait_for(api, job_id, lambda j: j["status"] == "cancelled", 60, "cancelled")
    assert job["stop_reason"] == "cancelled" and job["eta_s"] is None
    after = {t["number"]: t for t in trials_of(api, job_id)}
    for number, trial in before.items():  # what was measured is kept as it was
        assert after[number]["status"] == trial["status"]
        assert after[number]["metrics"] == trial["metrics"]
    assert not [t for t in after.values() if t["status"] == "running"]
    assert job["trials_done"] < 40
    assert not [t for t in after.values() if t["status"] == "infra_error"], after
    assert after[running[0]["number"]]["status"] in (*MEASURED, "cancelled")
    assert scratch_dirs(f"job-{job_id}") == []  # the killed trial's folder went with it

    again = api.post(f"/v1/jobs/{job_id}/cancel")  # a finished job stays as it is
    assert again.status_code == 200 and again.json()["status"] == "cancelled"
    # What a trial whose worker was killed on this host would leave: deleted with the job.
    left = Path(tempfile.gettempdir()) / f"trial-job-{job_id}-7-leftover"
    (left / "engine").mkdir(parents=True)
    assert scratch_dirs(f"job-{job_id}") == [left]
    assert api.delete(f"/v1/jobs/{job_id}").status_code == 204
    assert not left.exists()
    assert api.get(f"/v1/jobs/{job_id}/trials").status_code == 404


@pytest.mark.engine
def test_a_rollout_and_train_job_with_real_vllm(api) -> None:
    job = {
        "name": "api-both",
        "workload": {
            "model": "tiny",
            "dtype": "float32",
            "phases": "both",
            "prompt_length": {"kind": "uniform", "low": 8, "high": 32},
            "response_length": {"kind": "uniform", "low": 8, "high": 48},
            "max_prompt_length": 32,
            "max_response_length": 48,
            "train_batch_size": 8,
            "n": 2,
            "ppo_mini_batch_size": 4,
        },
        "cluster": {"device": "cpu", "device_memory_gib": 2},
        # The engine's knobs are fixed: the second trial takes the first's rollout over
        # (one engine start in all, as in tests/autotuner/test_cli.py).
        "search": {
            R + "enforce_eager": True,
            R + "max_num_seqs": 8,
            R + "gpu_memory_utilization": 0.5,
            R + "max_num_batched_tokens": 1024,
            R + "checkpoint_engine.update_weights_bucket_megabytes": 2048,
            A + "use_dynamic_bsz": False,
        },
        "budget": {"max_trials": 2, "trial_timeout_s": 240, "baseline_runs": 1},  # noise: the train job
        "sampler": "random",
    }
    job_id = submit(api, job)
    done = wait_for(
        api, job_id, lambda j: j["status"] in ("succeeded", "failed", "cancelled"), 600, "finished"
    )
    trials = trials_of(api, job_id)
    assert done["status"] == "succeeded", (done, [(t["status"], t["error_message"]) for t in trials])
    assert [t["metrics"].get("rollout_reused_from_trial") for t in trials] == [None, 0], trials
    best = api.get(f"/v1/jobs/{job_id}/best").json()
    assert best["metrics"]["rollout_generated_tokens_per_s"] > 0
    assert best["metrics"]["throughput_tokens_per_s_per_gpu"] > 0
    got = api.get(f"/v1/jobs/{job_id}/trials/{best['number']}/config")
    flat = load_exported_yaml(got.text)
    assert flat[R + "enforce_eager"] is True
    assert flat[R + "max_num_seqs"] == 8
    assert flat[R + "name"] == "vllm"
