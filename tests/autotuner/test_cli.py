"""The CLI end to end: a real job (vLLM rollout + torch train on the CPU) to exported YAML.
Its engine knobs are fixed, so the second trial, which differs from the first in train knobs
only, takes over the first's rollout: one engine start in all (``budget.reuse_rollouts``)."""

from __future__ import annotations

import re

import optuna
import pytest
import yaml

from autotuner.export import VERL_KEYS, load_exported_yaml
from autotuner.knobs import A, R
from autotuner.records import records
from autotuner.reuse import rollout_key

from .conftest import run_cli, write_job

JOB = {
    "name": "cli-e2e",
    "workload": {
        "model": "tiny",
        "dtype": "float32",
        "phases": "both",
        "prompt_length": {"kind": "uniform", "low": 8, "high": 32},
        "response_length": {"kind": "lognormal", "median": 24, "max": 48},
        "max_prompt_length": 32,
        "max_response_length": 48,
        "train_batch_size": 8,
        "n": 2,
        "ppo_mini_batch_size": 4,
    },
    "cluster": {"device": "cpu", "device_memory_gib": 2},
    "search": {
        R + "enforce_eager": True,
        R + "max_num_seqs": 8,
        R + "gpu_memory_utilization": 0.5,
        R + "max_num_batched_tokens": 1024,
        R + "checkpoint_engine.update_weights_bucket_megabytes": 2048,
        A + "use_dynamic_bsz": False,
    },
    # One run of each baseline: this test is about the CLI and the export (tests/autotuner/
    # test_study.py runs a real job's baselines three times).
    "budget": {"max_trials": 2, "trial_timeout_s": 240, "baseline_runs": 1},
    "sampler": "random",
}


@pytest.mark.engine
def test_tune_runs_real_trials_and_writes_a_verl_config(tmp_path, cli_env) -> None:
    job = write_job(tmp_path / "job.json", JOB)
    out = tmp_path / "out"
    done = run_cli(["tune", str(job), "-o", str(out)], cli_env)
    assert done.returncode == 0, done.stdout + done.stderr
    text = done.stdout
    assert re.search(r"trial\s+0\s+ok", text) and re.search(r"trial\s+1\s+ok", text), text
    assert "Pareto front" in text and "stopped: reached max_trials (2)" in text
    assert re.search(
        r"cost: [\d.]+ GPU-seconds \([\d.]+ GPU-minutes\) in all; the winner \(trial \d\) was found after",
        text,
    )
    assert "noise not measured (no baseline ran twice); tie band 2% (assumed)" in text
    written = sorted(out.glob("cli-e2e-trial*.yaml"))
    assert len(written) == 1
    exported = written[0].read_text()
    assert "# measured on: cpu:" in exported and "throughput_tokens_per_s_per_gpu" in exported
    flat = load_exported_yaml(exported)
    assert set(flat) <= VERL_KEYS
    assert flat[R + "max_model_len"] == 80 and flat[R + "enforce_eager"] is True
    assert flat[R + "max_num_seqs"] == 8
    nested = yaml.safe_load(exported)
    assert nested["actor_rollout_ref"]["rollout"]["name"] == "vllm"

    storage = f"sqlite:///{cli_env['AUTOTUNER_DATA_DIR']}/autotuner.db"
    (name,) = optuna.get_all_study_names(storage)
    first, second = records(optuna.load_study(study_name=name, storage=storage))
    assert (first.status, second.status) == ("ok", "ok"), (first.error_message, second.error_message)
    # The second trial differs from the first in train knobs only: it takes the first's
    # rollout over instead of starting an engine, and its step is composed from both.
    assert second.config != first.config and rollout_key(second.config) == rollout_key(first.config)
    assert "rollout_reused_from_trial" not in first.metrics and "engine_startup_s" in first.metrics
    m = second.metrics
    assert m["rollout_reused_from_trial"] == first.number == 0  # no second engine start
    assert "engine_startup_s" not in m and "engine_start_at_s" not in m
    for key in ("rollout_makespan_s", "rollout_generated_tokens", "kv_cache_tokens"):
        assert m[key] == first.metrics[key], key
    assert second.phase_timings_s["rollout"] == first.phase_timings_s["rollout"]
    # The weight sync into the engine is a rollout-side part: adopted with the rollout.
    assert second.phase_timings_s["weight_sync"] == first.phase_timings_s["weight_sync"] > 0
    assert m["weight_sync_bytes"] == first.metrics["weight_sync_bytes"] > 0
    assert m["step_time_s"] == pytest.approx(
        sum(v for k, v in second.phase_timings_s.items() if k != "startup")
    )
    assert second.wall_s < first.wall_s - first.metrics["engine_startup_s"] / 2
    # The engine's own start-up timings are kept from the trial's log, for the trial that
    # started one.
    assert any("init engine" in line and "took" in line for line in first.timing_lines), first.timing_lines
    assert not any("init engine" in line for line in second.timing_lines), second.timing_lines

    job_id = re.search(r"job ([0-9a-f]{32})", text).group(1)
    listed = run_cli(["jobs"], cli_env)
    assert job_id in listed.stdout and "succeeded" in listed.stdout
    shown = run_cli(["jobs", job_id], cli_env)
    assert "[pareto]" in shown.stdout
    overrides = run_cli(["export", job_id, "--trial", "1", "--format", "overrides"], cli_env)
    assert overrides.returncode == 0, overrides.stderr
    lines = [ln for ln in overrides.stdout.splitlines() if ln and not ln.startswith("#")]
    assert "actor_rollout_ref.rollout.name=vllm" in lines
    assert all("=" in ln for ln in lines)
    missing = run_cli(["export", job_id, "--trial", "99"], cli_env)
    assert missing.returncode == 2 and "has no trial 99" in missing.stderr


def test_a_bad_job_file_fails_fast_with_the_field(tmp_path, cli_env) -> None:
    job = write_job(tmp_path / "bad.json", {"workload": {"model": "tiny", "n": 0}})
    done = run_cli(["tune", str(job)], cli_env, timeout=120)
    assert done.returncode == 2
    assert "workload.n" in done.stderr and "greater than or equal to 1" in done.stderr


def test_models_lists_the_catalog(cli_env) -> None:
    done = run_cli(["models"], cli_env, timeout=120)
    assert done.returncode == 0
    for name in (
        "qwen2.5-0.5b",
        "qwen2.5-1.5b",
        "qwen2.5-7b",
        "qwen2-7b",
        "llama-3.1-8b",
        "qwen3-8b",
        "tiny",
    ):
        assert name in done.stdout


def test_doctor_checks_engines_database_and_ray(cli_env) -> None:
    done = run_cli(["doctor"], cli_env, timeout=300)
    assert "database: ok" in done.stdout, done.stdout + done.stderr
    assert "ray: ok" in done.stdout
    assert "vllm: ok" in done.stdout and "torch: ok" in done.stdout
    assert "GPUs: none" in done.stdout
    assert done.returncode == 0
