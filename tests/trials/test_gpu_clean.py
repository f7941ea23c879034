"""The rule that a CUDA trial starts only on clean GPUs (pure; the NVML reader is in test_gpu)."""

from __future__ import annotations

import time

import pytest

from trials.errors import GpuNotClean
from trials.failures import classify
from trials.gpu_clean import unclean_message, wait_for_clean_gpus
from trials.memory import GpuProcess, GpuReading

CLEAN = GpuReading("GPU 0 (NVIDIA H200)", used_gib=0.5, total_gib=139.8)
HELD = GpuReading(
    "GPU 1 (NVIDIA H200)",
    used_gib=71.25,
    total_gib=139.8,
    processes=(GpuProcess(4242, "VLLM::EngineCore", 70.5), GpuProcess(77, "?", None)),
)


def test_clean_gpus_pass():
    assert unclean_message([CLEAN], threshold_gib=2.0) is None
    assert unclean_message([], threshold_gib=2.0) is None


def test_the_message_names_the_gpu_its_memory_and_its_holders():
    message = unclean_message([CLEAN, HELD], threshold_gib=2.0)
    assert message is not None
    assert "GPU 1 (NVIDIA H200) has 71.25 of 139.80 GiB in use" in message
    assert "pid 4242 (VLLM::EngineCore, 70.50 GiB)" in message and "pid 77 (?)" in message
    assert "GPU 0" not in message


def test_memory_nobody_visible_holds_is_still_reported():
    ghost = GpuReading("GPU 0 (NVIDIA H100)", used_gib=5.0, total_gib=79.2)
    assert "no process this container can see" in unclean_message([ghost], 2.0)


def test_waits_for_a_previous_trial_to_let_go():
    readings = iter([[HELD], [HELD], [CLEAN]])
    assert wait_for_clean_gpus(2.0, wait_s=5.0, read=lambda: next(readings), poll_s=0.01) == [CLEAN]


def test_refuses_after_the_wait_and_is_an_error_not_an_oom():
    reads: list[float] = []

    def read() -> list[GpuReading]:
        reads.append(time.monotonic())
        return [HELD]

    t0 = time.monotonic()
    with pytest.raises(GpuNotClean) as info:
        wait_for_clean_gpus(2.0, wait_s=0.2, read=read, poll_s=0.05)
    # It gave up only once the wait was over, and looked again meanwhile.
    assert time.monotonic() - t0 >= 0.2 and len(reads) >= 2
    assert "waited 0.2 s" in str(info.value) and "pid 4242" in str(info.value)
    assert classify(info.value) == "error"


def test_without_nvml_nothing_is_checked():
    assert wait_for_clean_gpus(2.0, wait_s=0.0, read=lambda: None) is None
