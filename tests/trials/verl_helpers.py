"""Helpers for the verl step runner's tests: verl's environment, and runs of the runner's
own command (``python -m trials.verl``) there."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from autotuner.jobs import build_space
from autotuner.settings import Settings
from autotuner.spec import JobSpec, load_job_spec
from autotuner.verl_run import verl_run_spec
from trials.launcher import engine_importable
from trials.verl import VERL
from trials.verl.types import VerlRunSpec

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "autotuner" / "examples" / "demo.yaml"
GPU_JOBS = sorted((ROOT / "benchmarks" / "jobs").glob("*.yaml"))
# A small real workload for verl's runs on one GPU (the ``gpu`` tests): Qwen2.5-0.5B, short
# sequences, 16 prompts x 2 a step.
SMALL_GPU_WORKLOAD: dict[str, Any] = {
    "model": "qwen2.5-0.5b",
    "prompt_length": {"kind": "uniform", "low": 64, "high": 128},
    "response_length": {"kind": "uniform", "low": 32, "high": 128},
    "max_prompt_length": 128,
    "max_response_length": 128,
    "train_batch_size": 16,
    "n": 2,
    "ppo_mini_batch_size": 8,
}


def verl_python() -> str:
    """The Python of verl's environment; skips the test without one (fails it on CI, where
    scripts/setup.sh makes it)."""
    settings = Settings()
    python = settings.verl_python()
    missing = engine_importable(VERL, python, settings.trial_env_for(VERL))
    if missing is not None:
        reason = f"verl's environment ({python}) has no verl: {missing}; run scripts/setup.sh"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return python


def job_run_spec(path: Path, run_id: str) -> tuple[JobSpec, VerlRunSpec]:
    """The runner's spec for a job's verl-defaults baseline with the job's fixed knobs."""
    spec = load_job_spec(path)
    arch = spec.validate_model()
    device = "cpu" if spec.cluster.device == "cpu" else "cuda"
    space = build_space(spec, device, Settings())
    config = space.baseline_config() | space.fixed
    return spec, verl_run_spec(spec, arch, config, run_id, device=device)


def preflight(
    specs: list[VerlRunSpec], tmp_path: Path, cache_dir: Path, config_only: bool = False
) -> list[dict[str, Any]]:
    """``python -m trials.verl preflight`` in verl's environment over ``specs``."""
    python = verl_python()
    args = []
    for spec in specs:
        path = tmp_path / f"{spec.run_id}.json"
        path.write_text(spec.to_json())
        args += ["--spec", str(path)]
    out = tmp_path / "preflight.json"
    cmd = [
        python,
        "-m",
        "trials.verl",
        "preflight",
        *args,
        "--out",
        str(out),
        "--workdir",
        str(tmp_path / "w"),
    ]
    cmd += ["--cache-dir", str(cache_dir), "--ray-temp-dir", str(tmp_path / "ray")]
    if config_only:
        cmd.append("--config-only")
    env = dict(os.environ) | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    reports: list[dict[str, Any]] = json.loads(out.read_text())
    return reports
