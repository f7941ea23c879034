"""On an NVIDIA GPU: the same trials with device ``cuda`` (skipped without one)."""

from __future__ import annotations

import importlib.util

import pytest
from trial_helpers import make_spec

from trials.launcher import launch_trial


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _has_cuda(), reason="needs an NVIDIA GPU with CUDA"),
]


@pytest.mark.parametrize("offload", [False, True])
def test_train_trial_on_cuda(tiny_config, offload):
    spec = make_spec(
        tiny_config,
        trial_id=f"gpu-train-{offload}",
        phases=["train"],
        device="cuda",
        dtype="bfloat16",
        device_memory_cap_gib=None,
    )
    spec.train.param_offload = spec.train.optimizer_offload = offload
    result = launch_trial(spec, timeout_s=300)
    assert result.status == "ok", (result.error_message, result.log_tail[-3000:])
    assert result.metrics["train_dtype_bits"] == 16
    assert result.metrics["train_peak_memory_gib"] > 0
    assert not result.device.startswith("cpu")


def test_train_trial_on_cuda_hits_a_real_oom_under_a_cap(tiny_config):
    spec = make_spec(
        tiny_config,
        trial_id="gpu-oom",
        phases=["train"],
        device="cuda",
        requests=64,
        train_prompt_lengths=[2000] * 64,
        train_response_lengths=[2000] * 64,
        local_mini_batch_size=64,
        device_memory_cap_gib=1.0,
    )
    spec.train.ppo_micro_batch_size_per_gpu = 64
    spec.train.log_prob_micro_batch_size_per_gpu = 1
    spec.train.ref_log_prob_micro_batch_size_per_gpu = 1
    result = launch_trial(spec, timeout_s=300)
    assert (result.status, result.phase) == ("oom", "update_actor"), result.error_message


@pytest.mark.engine
def test_full_trial_on_cuda(tiny_config):
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed here")
    spec = make_spec(
        tiny_config, trial_id="gpu-e2e", device="cuda", dtype="bfloat16", device_memory_cap_gib=None
    )
    spec.rollout.gpu_memory_utilization = 0.3
    result = launch_trial(spec, timeout_s=600)
    assert result.status == "ok", (result.error_message, result.log_tail[-3000:])
    assert result.metrics["rollout_generated_tokens"] == sum(spec.response_lengths)
    assert result.metrics["kv_cache_tokens"] > 0
