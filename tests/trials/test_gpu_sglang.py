"""On an NVIDIA GPU with SGLang's environment: the sglang rollout backend (skipped without).

The trials run where a job's sglang trials run: the Python and package folder the settings
name for sglang (``AUTOTUNER_ENGINE_PYTHON__SGLANG``, ``AUTOTUNER_ENGINE_PYTHONPATH__SGLANG``;
on the air-gapped host ``/tmp/site-sglang`` from ``benchmarks/gpu/setup-sglang.sh``), with
the Qwen2.5-0.5B-shaped model of ``test_gpu.py``: a real generation whose lengths are
checked, the co-located step (the engine asleep for training, woken for the next step),
a KV pool too small for the requests and an engine budget too small for its weights.
"""

from __future__ import annotations

import sys

import pytest
from test_gpu import _has_cuda, qwen_spec
from trial_helpers import with_engine

from autotuner.settings import Settings
from trials.launcher import engine_importable, launch_trial


def _environment() -> tuple[str, dict[str, str]]:
    settings = Settings()
    return settings.python_for("sglang") or sys.executable, settings.trial_env_for("sglang")


def _sglang_missing() -> str | None:
    python, env = _environment()
    return engine_importable("sglang", python, env)


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _has_cuda(), reason="needs an NVIDIA GPU with CUDA"),
    pytest.mark.skipif(
        _sglang_missing() is not None,
        reason="no SGLang environment: set AUTOTUNER_ENGINE_PYTHONPATH__SGLANG (or ..._PYTHON__SGLANG)",
    ),
]


def _sglang_spec(trial_id: str, **overrides):
    spec = qwen_spec(trial_id, **overrides)
    with_engine(spec, "sglang")
    return spec


def _launch(spec, timeout_s: float):
    python, env = _environment()
    return launch_trial(spec, timeout_s=timeout_s, python=python, env=env)


def test_a_rollout_generates_every_token_asked():
    spec = _sglang_spec("sglang-rollout", phases=["rollout"])
    result = _launch(spec, 600)
    assert result.status == "ok", (result.error_message, result.log_tail[-3000:])
    m = result.metrics
    assert m["rollout_generated_tokens"] == sum(spec.response_lengths)
    assert m["rollout_requests"] == len(spec.prompt_lengths)
    longest = max(p + r for p, r in zip(spec.prompt_lengths, spec.response_lengths, strict=True))
    assert m["kv_cache_tokens"] >= longest
    assert m["rollout_preemptions"] >= 0 and m["engine_startup_s"] > 0
    assert "NVIDIA" in result.device
    assert m["gpu_memory_after_gib"] < 2.0  # the engine's processes are gone with the trial


def test_the_engine_sleeps_for_training_and_wakes_for_the_next_step():
    spec = _sglang_spec("sglang-colocated")
    result = _launch(spec, 900)
    assert result.status == "ok", (result.error_message, result.log_tail[-3000:])
    m = result.metrics
    assert m["rollout_generated_tokens"] == sum(spec.response_lengths)
    assert m["engine_sleep_s"] > 0 and m["engine_wake_s"] > 0
    assert m["engine_resident_in_train"] == 0.0
    # Asleep, the engine gave back its weights and KV cache (a quarter of the free GPU).
    assert m["train_peak_memory_gib"] < m["rollout_peak_memory_gib"] - 10, m
    assert m["throughput_tokens_per_s_per_gpu"] > 0


def test_a_kv_pool_too_small_for_the_requests_is_an_oom_not_a_fast_success():
    # SGLang cuts max_new_tokens to what its pool holds and returns without an error.
    spec = _sglang_spec("sglang-kv-short", phases=["rollout"])
    spec.rollout.engine_kwargs = {"max_total_tokens": 300}
    result = _launch(spec, 600)
    assert (result.status, result.phase, result.error_type) == ("oom", "rollout", "KvCacheExhausted"), (
        result.error_message,
        result.log_tail[-3000:],
    )
    assert "the KV cache ran out" in result.error_message


def test_a_budget_too_small_for_the_weights_is_an_oom_at_startup():
    spec = _sglang_spec("sglang-no-room", phases=["rollout"])
    spec.rollout.gpu_memory_utilization = 0.002  # ~0.3 GiB of an H100/H200: less than the weights
    result = _launch(spec, 600)
    assert (result.status, result.phase) == ("oom", "startup"), (
        result.error_type,
        result.error_message,
        result.log_tail[-3000:],
    )
    assert result.error_type != "TrialProcessDied"  # the trial recorded it, SGLang did not kill it
    assert result.metrics["gpu_memory_after_gib"] < 2.0
