"""Trial processes on one host share vLLM's and torch's compile caches (a settings-controlled
directory passed in each trial's environment), so only the first trial compiles."""

from __future__ import annotations

import stat

from autotuner.executor import RayExecutor
from autotuner.settings import Settings
from trials.launcher import launch_trial
from trials.types import TrialSpec

CACHE_VARS = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")

# Stands in for the trial's Python (``python -m trials run --spec S --out O ...``): it writes
# a result naming the cache directories it was given.
FAKE_PYTHON = """#!/bin/sh
out=""
while [ $# -gt 0 ]; do
  if [ "$1" = "--out" ]; then out="$2"; fi
  shift
done
printf '{"trial_id": "t", "status": "ok", "error_message": "%s|%s|%s"}' \\
  "$VLLM_CACHE_ROOT" "$TORCHINDUCTOR_CACHE_DIR" "$TRITON_CACHE_DIR" > "$out"
"""


def test_every_trial_process_gets_the_same_compile_cache_dirs(tmp_path, monkeypatch) -> None:
    for name in CACHE_VARS:
        monkeypatch.delenv(name, raising=False)
    settings = Settings(data_dir=tmp_path / "data")
    env = settings.trial_env()
    root = tmp_path / "data" / "compile-cache"
    assert env == {
        "VLLM_CACHE_ROOT": str(root / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
        "TRITON_CACHE_DIR": str(root / "triton"),
    }
    assert Settings(compile_cache_dir=tmp_path / "elsewhere").trial_env()["VLLM_CACHE_ROOT"] == str(
        tmp_path / "elsewhere" / "vllm"
    )
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    seen = {
        launch_trial(
            TrialSpec(trial_id=f"t{k}", model_name="m", model_config={}, device="cpu"),
            timeout_s=30,
            python=str(fake),
            env=env,
        ).error_message
        for k in range(2)
    }
    assert seen == {"|".join(env[name] for name in CACHE_VARS)}
    assert RayExecutor(trial_env=env).trial_env == env


def test_a_cache_dir_the_environment_already_sets_is_left_alone(tmp_path, monkeypatch) -> None:
    for name in CACHE_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VLLM_CACHE_ROOT", "/somewhere/else")
    env = Settings(data_dir=tmp_path).trial_env()
    assert "VLLM_CACHE_ROOT" not in env and "TORCHINDUCTOR_CACHE_DIR" in env
