"""The verl step runner's metric parser on what verl's own loggers write, its per-sample
response lengths, and a real ``main_ppo`` whose processes (its private Ray included) die
with the run. The ``gpu`` test runs two steps of a small model end to end."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from verl_helpers import DEMO, ROOT, SMALL_GPU_WORKLOAD, job_run_spec, verl_python

from trials.launcher import kill_session, session_processes
from trials.verl.dataset import sample_length
from trials.verl.launch import launch_verl, ray_processes, sweep_ray
from trials.verl.metrics import StepClock, parse_console, parse_jsonl, read_arrivals, summarize
from trials.verl.types import VerlRunResult

# Three steps as verl's trainer logs them: numpy scalars (verl's np.mean) and plain floats.
_LOG_STEPS = """
import numpy as np, os
from verl.utils.logger.aggregate_logger import LocalLogger
from verl.utils.tracking import FileLogger
file_logger = FileLogger("autotuner", "t")
for step, (gen, thr) in enumerate([(9.0, 100.0), (3.0, 400.0), (2.0, 500.0)], start=1):
    data = {"timing_s/gen": np.float64(gen), "timing_s/step": gen + 1.5, "perf/throughput": thr,
            "timing_s/update_weights": np.float32(0.25), "actor/perf/max_memory_allocated_gb": 3,
            "response_length/mean": np.int64(48), "actor/pg_loss": float("nan"), "note": "text"}
    LocalLogger(print_to_console=True).log(data, step)
    file_logger.log(data, step)
file_logger.finish()
"""


def _verl_logs(tmp_path: Path) -> tuple[str, Path]:
    jsonl = tmp_path / "metrics.jsonl"
    env = dict(os.environ) | {"VERL_FILE_LOGGER_PATH": str(jsonl), "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [verl_python(), "-c", _LOG_STEPS], capture_output=True, text=True, env=env, cwd=tmp_path, check=True
    )
    return out.stdout, jsonl


def test_parser_reads_verls_console_and_file_loggers(tmp_path: Path) -> None:
    console, jsonl = _verl_logs(tmp_path)
    assert "np.float64(9.0)" in console  # what the parser must see through
    from_console = parse_console(console.splitlines())
    from_file = parse_jsonl(jsonl.read_text().splitlines())
    for steps in (from_console, from_file):
        assert sorted(steps) == [1, 2, 3]
        assert steps[1]["timing_s/gen"] == 9.0 and steps[3]["perf/throughput"] == 500.0
        assert steps[2]["timing_s/update_weights"] == 0.25
        assert steps[2]["response_length/mean"] == 48.0
        assert "note" not in steps[1]
    ordered, measured = summarize(from_console, warmup_steps=1)
    assert [s["timing_s/gen"] for s in ordered] == [9.0, 3.0, 2.0]
    assert "actor/pg_loss" not in ordered[0]  # not one of the kept metrics
    # Medians over steps 2-3 only: the warm-up's 9 s rollout does not count.
    assert measured["timing_s/gen"] == 2.5 and measured["perf/throughput"] == 450.0
    assert measured["actor/perf/max_memory_allocated_gb"] == 3.0


# verl's file logger writing three steps, a pause before each (a set-up, then the steps).
_PACED_STEPS = """
import time
from verl.utils.tracking import FileLogger
file_logger = FileLogger("autotuner", "t")
for step, pause in enumerate([1.5, 0.6, 0.6], start=1):
    time.sleep(pause)
    file_logger.log({"timing_s/step": 0.5}, step)
file_logger.finish()
"""


def test_the_runner_stamps_each_step_as_verl_logs_it(tmp_path: Path) -> None:
    jsonl, record = tmp_path / "metrics.jsonl", tmp_path / "arrivals.json"
    env = dict(os.environ) | {"VERL_FILE_LOGGER_PATH": str(jsonl), "PYTHONPATH": str(ROOT)}
    start = time.monotonic()
    clock = StepClock(jsonl, record, start)
    proc = subprocess.Popen([verl_python(), "-c", _PACED_STEPS], env=env, cwd=tmp_path)
    while proc.poll() is None:
        clock.poll(time.monotonic())
        time.sleep(0.05)
    clock.poll(time.monotonic())
    arrived = clock.ordered()
    assert len(arrived) == 3
    assert arrived[0] >= 1.5  # not before verl wrote it
    assert arrived[1] - arrived[0] >= 0.5 and arrived[2] - arrived[1] >= 0.5  # each when it came
    # What a killed run leaves is read back, and the start-up follows from the first step.
    assert read_arrivals(record) == arrived
    assert read_arrivals(tmp_path / "missing.json") == []
    steps, _ = summarize(parse_jsonl(jsonl.read_text().splitlines()), warmup_steps=1)
    result = VerlRunResult("r", "ok", steps=steps, step_logged_at_s=arrived)
    assert result.startup_s == pytest.approx(arrived[0] - 0.5)
    assert VerlRunResult("r", "error").startup_s is None


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    lines = ['{"step": 1, "data": {"timing_s/step": 2.0}}', '{"step": 2, "data": {"timing_s/st']
    assert parse_jsonl(lines) == {1: {"timing_s/step": 2.0}}


def test_each_sample_of_a_prompt_takes_its_own_length() -> None:
    info = {"index": 7, "response_lengths": [5, 9, 2]}
    assert [sample_length(info, s) for s in range(3)] == [5, 9, 2]
    other = {"index": 8, "response_lengths": [4, 6]}
    assert [sample_length(other, None) for _ in range(2)] == [4, 6]  # legacy trainer: arrival order


def _wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.5)
    return False


@pytest.mark.slow
def test_verls_processes_and_its_private_ray_die_with_the_run(tmp_path: Path) -> None:
    """A real main_ppo (on CPU it gets as far as its Ray and trainer actor): verl's Ray starts
    in the run's own temp folder even with RAY_ADDRESS pointing elsewhere, and the
    launcher's kill leaves no process of the session nor of that Ray."""
    python = verl_python()
    _, run = job_run_spec(DEMO, "demo-kill")
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(run.to_json())
    ray_temp = Path(f"/tmp/vr-test-{os.getpid()}")
    cmd = [python, "-m", "trials.verl", "run", "--spec", str(spec_path), "--out", str(tmp_path / "out.json")]
    cmd += [
        "--workdir",
        str(tmp_path / "w"),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--ray-temp-dir",
        str(ray_temp),
    ]
    env = dict(os.environ) | {"PYTHONPATH": str(ROOT), "RAY_ADDRESS": "127.0.0.1:9"}  # the "tuner's" cluster
    proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, start_new_session=True, stdout=subprocess.DEVNULL)
    try:
        assert _wait_for(lambda: len(ray_processes(ray_temp)) >= 2, 240), "verl's private Ray never started"
        os.kill(proc.pid, signal.SIGTERM)  # as the launcher's deadline does
        kill_session(proc, grace_s=10)
        sweep_ray(ray_temp)
        assert session_processes(proc.pid) == []
        assert ray_processes(ray_temp) == []
    finally:
        if proc.poll() is None:
            kill_session(proc, grace_s=1)
        sweep_ray(ray_temp)
        shutil.rmtree(ray_temp, ignore_errors=True)


@pytest.mark.gpu
def test_two_verl_steps_of_a_small_model(tmp_path: Path) -> None:
    """Two steps (one measured) of Qwen2.5-0.5B in real verl on one GPU."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU with CUDA")
    from autotuner.jobs import build_space
    from autotuner.settings import Settings
    from autotuner.spec import parse_job_spec
    from autotuner.verl_run import verl_run_spec

    job = parse_job_spec(
        {
            "name": "verl-two-steps",
            "workload": SMALL_GPU_WORKLOAD,
            "cluster": {"device": "cuda", "n_gpus_per_node": 1},
        }
    )
    space = build_space(job, "cuda", Settings())
    run = verl_run_spec(job, job.validate_model(), space.baseline_config(), "two-steps", steps=2)
    run.trace = True
    result = launch_verl(run, 900, tmp_path / "cache", python=verl_python())
    assert result.status == "ok", f"{result.error_type}: {result.error_message}\n{result.log_tail[-3000:]}"
    assert len(result.steps) == 2
    assert result.measured["perf/throughput"] > 0 and result.measured["timing_s/gen"] > 0
    assert "timing_s/update_weights" in result.steps[1]
    assert result.versions["verl"].startswith("0.9.") and "torch" in result.versions
    # Each response had the length drawn for it (ignore_eos): the mean matches the draw.
    from trials.verl.runner import drawn

    first = [x for r in drawn(run).response_lengths[: job.workload.train_batch_size] for x in r]
    assert abs(result.steps[0]["response_length/mean"] - sum(first) / len(first)) < 1e-6
    assert json.loads(result.to_json())["run_id"] == "two-steps"
    # The trace: per step one actor and one reference log-prob pass, one update, each pass's
    # micro-batches with their tokens and GPU seconds, all the step's tokens in them.
    calls = [(r["call"], r["role"]) for r in result.trace if r["call"] in ("infer_batch", "train_mini_batch")]
    assert calls == [("infer_batch", "actor"), ("infer_batch", "ref"), ("train_mini_batch", "actor")] * 2
    passes = [r for r in result.trace if r["call"] == "forward_backward_batch"]
    step_tokens = result.steps[0]["perf/total_num_tokens"]
    first_old = next(r for r in passes if r["forward_only"] and r["role"] == "actor")
    assert sum(first_old["micro_batch_tokens"]) == step_tokens
    assert len(first_old["micro_batch_s"]) == first_old["micro_batches"] >= 1
    assert all(s > 0 for s in first_old["micro_batch_s"])
    assert sum(first_old["micro_batch_s"]) <= first_old["wall_s"]
    assert len(first_old["micro_batch_cpu_s"]) == first_old["micro_batches"]
    assert 0 < sum(first_old["micro_batch_cpu_s"]) <= first_old["wall_s"]
    assert first_old["pass_gc_s"] >= 0 and first_old["prepare_gc_s"] <= first_old["prepare_s"]
