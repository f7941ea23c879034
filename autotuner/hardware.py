"""What hardware this process sees: NVIDIA GPUs through NVML, else the CPU.

The control plane never imports torch or CUDA; NVML is enough to count and name GPUs.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_gib: float


def gpus() -> list[Gpu]:
    """The GPUs NVML reports here; empty when there is no driver or no GPU."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else name
            total = pynvml.nvmlDeviceGetMemoryInfo(handle).total
            out.append(Gpu(i, name, total / 2**30))
        return out
    finally:
        pynvml.nvmlShutdown()


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def describe_cpu() -> str:
    return f"cpu: {cpu_name()} ({os.cpu_count()} cores)"


def detect_device() -> str:
    """``cuda`` when at least one GPU is visible, else ``cpu``."""
    return "cuda" if gpus() else "cpu"
