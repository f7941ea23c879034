"""The engine starts beside the resident actor, or is refused as vLLM refuses it."""

from __future__ import annotations

import pytest
from trial_helpers import make_spec

from trials import run_trial
from trials.colocation import check_engine_fits, emulated_capacity_gib
from trials.errors import EngineMemoryRefused
from trials.failures import classify
from trials.memory_cap import DEFAULT_CPU_CAP_GIB


def test_the_engine_fits_in_what_the_actor_leaves():
    check_engine_fits("cuda:0", capacity_gib=80.0, used_gib=30.0, gpu_memory_utilization=0.6)


def test_too_little_left_is_refused_in_vllms_words():
    with pytest.raises(EngineMemoryRefused) as info:
        check_engine_fits("cuda:0", capacity_gib=80.0, used_gib=40.0, gpu_memory_utilization=0.6)
    message = str(info.value)
    assert "Free memory on device cuda:0 (40.00/80.00 GiB)" in message
    assert "less than desired GPU memory utilization (0.6, 48.00 GiB)" in message
    assert classify(info.value) == "oom"


def test_which_devices_are_emulated(tiny_config):
    spec = make_spec(tiny_config, device_memory_cap_gib=2.0)
    assert emulated_capacity_gib(spec, None) == 2.0
    spec.device_memory_cap_gib = None
    assert emulated_capacity_gib(spec, None) == DEFAULT_CPU_CAP_GIB
    spec.device = "cuda"
    assert emulated_capacity_gib(spec, 139.8) is None  # vLLM checks the real GPU
    spec.device_memory_cap_gib = 80.0
    assert emulated_capacity_gib(spec, 139.8) == 80.0
    spec.device_memory_cap_gib = 141.0
    assert emulated_capacity_gib(spec, 139.8) is None


@pytest.mark.slow
def test_a_gpu_memory_utilization_that_cannot_fit_beside_the_actor_is_oom_at_startup(
    tiny_config,
):
    # The tiny actor holds ~0.008 GiB; 0.9 of a 0.05 GiB device is more than is left.
    spec = make_spec(tiny_config, device_memory_cap_gib=0.05, requests=8, local_mini_batch_size=8)
    spec.rollout.gpu_memory_utilization = 0.9
    progress: list[str | None] = []
    result = run_trial(spec, on_progress=lambda r: progress.append(r.phase))
    assert (result.status, result.phase, result.error_type) == (
        "oom",
        "startup",
        "EngineMemoryRefused",
    ), result.error_message
    m = result.metrics
    assert m["actor_resident_gib"] > 0 and "actor_ready_at_s" in m
    assert "engine_start_at_s" not in m  # refused before the engine was started
    assert progress == ["startup"]
    assert f"the actor holds {m['actor_resident_gib']:.2f} GiB" in result.error_message
