"""Each engine's trials run in that engine's environment; a job that has none fails at once.

The engines pin different versions of shared packages, so each gets its own Python and/or
package folder (``AUTOTUNER_ENGINE_PYTHON__<ENGINE>``, ``AUTOTUNER_ENGINE_PYTHONPATH__<ENGINE>``).
The second interpreter here is a real one started through a wrapper script that notes how
it was called; the SGLang it finds is the stand-in of ``tests/trials/stand_in_sglang``
(SGLang runs on CUDA GPUs only).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from autotuner.errors import EngineUnavailableError
from autotuner.jobs import JobContext, check_engine_environment, execute, runner_id
from autotuner.knobs import engine_arguments
from autotuner.settings import Settings
from autotuner.spec import parse_job_spec
from trials.launcher import engine_importable, launch_trial
from trials.types import RolloutKnobs, TrialSpec

from .conftest import REPO

STAND_IN = REPO / "tests" / "trials" / "stand_in_sglang"
QWEN_05B = json.loads((REPO / "autotuner" / "catalog" / "qwen2.5-0.5b.json").read_text())


def _second_python(tmp_path: Path) -> tuple[Path, Path]:
    """A wrapper around this interpreter that appends its arguments and PYTHONPATH to a
    notes file, then runs it: (the wrapper, the notes)."""
    notes = tmp_path / "python-calls"
    wrapper = tmp_path / "sglang-python"
    wrapper.write_text(
        f'#!/bin/sh\nprintf "%s | %s\\n" "$*" "$PYTHONPATH" >> "{notes}"\nexec "{sys.executable}" "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper, notes


def _sglang_trial(trial_id: str) -> TrialSpec:
    return TrialSpec(
        trial_id=trial_id,
        model_name="qwen2.5-0.5b",
        model_config=QWEN_05B,
        device="cpu",
        phases=["rollout"],
        rollout=RolloutKnobs(engine="sglang", engine_args=engine_arguments("sglang")),
        prompt_lengths=[16] * 4,
        response_lengths=[16] * 4,
        device_memory_cap_gib=2.0,
    )


def _job(engine: str, device: str):
    return parse_job_spec(
        {
            "name": f"{engine}-{device}",
            "workload": {
                "model": "qwen2.5-0.5b",
                "engine": engine,
                "phases": "rollout",
                "train_batch_size": 8,
                "n": 1,
                "ppo_mini_batch_size": 4,
            },
            "cluster": {"device": device, "device_memory_gib": 8},
            "budget": {"max_trials": 2},
        }
    )


def test_settings_name_each_engines_environment(monkeypatch, tmp_path) -> None:
    for key in ("AUTOTUNER_TRIAL_PYTHON", "AUTOTUNER_ENGINE_PYTHON", "AUTOTUNER_ENGINE_PYTHONPATH"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AUTOTUNER_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("AUTOTUNER_ENGINE_PYTHON__SGLANG", "/opt/sglang/bin/python")
    monkeypatch.setenv("AUTOTUNER_ENGINE_PYTHONPATH", '{"sglang": "/tmp/site-sglang"}')
    settings = Settings()
    assert settings.python_for("sglang") == "/opt/sglang/bin/python"
    assert settings.trial_env_for("sglang")["PYTHONPATH"] == "/tmp/site-sglang"
    assert settings.python_for("vllm") is None and "PYTHONPATH" not in settings.trial_env_for("vllm")
    monkeypatch.setenv("AUTOTUNER_TRIAL_PYTHON", "/usr/bin/python3")
    assert Settings().python_for("vllm") == "/usr/bin/python3"  # the default of every engine
    assert Settings().python_for("sglang") == "/opt/sglang/bin/python"
    monkeypatch.setenv("AUTOTUNER_ENGINE_PYTHON__TGI", "/opt/tgi/bin/python")
    with pytest.raises(
        ValidationError,
        match="AUTOTUNER_ENGINE_PYTHON__TGI: unknown engine 'tgi'; engines: sglang, verl, vllm",
    ):
        Settings()


def test_an_sglang_trial_runs_under_the_sglang_environment(tmp_path) -> None:
    wrapper, notes = _second_python(tmp_path)
    settings = Settings(
        data_dir=tmp_path, engine_python={"sglang": str(wrapper)}, engine_pythonpath={"sglang": str(STAND_IN)}
    )
    assert settings.python_for("vllm") is None  # vLLM's trials keep the tuner's Python
    result = launch_trial(
        _sglang_trial("in-its-env"),
        timeout_s=120,
        python=settings.python_for("sglang") or "",
        env=settings.trial_env_for("sglang"),
    )
    calls = notes.read_text().splitlines()
    # The launcher looked for the engine, then ran the trial, both with that interpreter and
    # that package folder instead of the inherited PYTHONPATH (this repository first).
    assert len(calls) == 2 and "find_spec" in calls[0] and " sglang | " in calls[0]
    assert calls[1].startswith("-m trials run --spec ")
    assert all(call.endswith(f" | {REPO}:{STAND_IN}") for call in calls)
    # The trial imported SGLang from there (the stand-in), which then refused the CPU.
    assert (result.status, result.phase, result.error_type) == ("error", "startup", "ConfigRejected")
    assert "sglang rollout backend runs on CUDA GPUs only" in result.error_message


def test_a_trial_whose_python_lacks_its_engine_is_an_infrastructure_failure(tmp_path) -> None:
    wrapper, notes = _second_python(tmp_path)
    result = launch_trial(_sglang_trial("no-engine"), timeout_s=120, python=str(wrapper))
    assert (result.status, result.phase, result.error_type) == ("error", "startup", "TrialLaunchError")
    assert f"the rollout engine 'sglang' is not importable by {wrapper}" in result.error_message
    assert "AUTOTUNER_ENGINE_PYTHON__SGLANG" in result.error_message
    assert "AUTOTUNER_ENGINE_PYTHONPATH__SGLANG" in result.error_message
    assert len(notes.read_text().splitlines()) == 1  # the probe ran; the trial never started


def test_a_job_whose_engine_is_missing_fails_before_any_trial(tmp_path) -> None:
    if engine_importable("sglang") is None:
        pytest.skip("sglang is importable here")
    ctx = JobContext.open(Settings(data_dir=tmp_path / "data"))
    job = ctx.submit(_job("sglang", "cuda"))
    ctx.store.claim(job.id, runner_id())
    with pytest.raises(EngineUnavailableError) as caught:
        execute(ctx, job.id)
    stored = ctx.store.get(job.id)
    assert stored.status == "failed" and stored.error == str(caught.value)
    assert stored.error.startswith("workload.engine: the rollout engine 'sglang' is not importable")
    assert "AUTOTUNER_ENGINE_PYTHON__SGLANG=/path/to/venv/bin/python" in stored.error
    assert stored.trials_done == 0
    ctx.database.dispose()


def test_the_check_follows_the_configured_environment_and_the_device(tmp_path) -> None:
    wrapper, notes = _second_python(tmp_path)
    ready = Settings(
        data_dir=tmp_path, engine_python={"sglang": str(wrapper)}, engine_pythonpath={"sglang": str(STAND_IN)}
    )
    check_engine_environment(_job("sglang", "cuda"), "cuda", ready)
    assert " sglang | " in notes.read_text()
    with pytest.raises(EngineUnavailableError, match="sglang runs on CUDA GPUs only"):
        check_engine_environment(_job("sglang", "cpu"), "cpu", ready)
    # On a Ray cluster the trials' nodes are checked by their launchers, not this host.
    remote = Settings(data_dir=tmp_path, ray_address="head:6379")
    check_engine_environment(_job("sglang", "cuda"), "cuda", remote)
