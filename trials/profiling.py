"""A profile of a few micro-batches of one pass, the trial's and verl's alike (opt-in).

With ``AUTOTUNER_PROFILE`` naming a folder, torch's profiler records the host's calls and
the device's kernels from the start of micro-batch ``FIRST`` of a pass to the start of
micro-batch ``FIRST + COUNT`` (or the pass's end): in a trial, its timed update pass
(``trials.train``); in a traced verl run, the actor's update pass number
``AUTOTUNER_PROFILE_PASS`` of each worker process (``trials.verl.trace``; default 5: with
four mini-batches a step, the first of the second step, the first measured one). Each
profile is written as ``profile-<label>-<pid>.json`` (``summary``: the wall seconds, the
device's kernel seconds, and every op's calls, host and device seconds) beside its trace
for a trace viewer (``.trace.json.gz``); ``python -m benchmarks.gpu.profile_compare``
sets two of them side by side, per micro-batch.

The profiler slows the host: the phase times of a profiled pass are not measurements (a
trial records ``<phase>_profiled``). ``host_cpu`` and ``busy_cores`` say how busy the whole
host was over a stretch, always cheap enough to record.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

PROFILE_ENV = "AUTOTUNER_PROFILE"
PASS_ENV = "AUTOTUNER_PROFILE_PASS"
FIRST = 2  # the first micro-batches of a pass are left out: they pay its start
COUNT = 4
TOP = 80  # ops kept in a summary, by host seconds and by device seconds
BUSY_MIN_S = 1.0  # the host's CPU counters tick every 10 ms: busy cores of a shorter stretch are noise


def folder() -> Path | None:
    """Where profiles go, when asked for."""
    named = os.environ.get(PROFILE_ENV)
    return Path(named) if named else None


def pass_number() -> int:
    """Which update pass of a verl worker process is profiled (1 for the first)."""
    return int(os.environ.get(PASS_ENV) or 5)


class MicroBatchProfiler:
    """Profiles micro-batches ``first`` to ``first + count - 1`` of one pass: call
    ``before(index)`` at each micro-batch's start and ``finish()`` at the pass's end."""

    def __init__(self, out: Path, label: str, first: int = FIRST, count: int = COUNT) -> None:
        self.out, self.label, self.first, self.count = out, label, first, count
        self.profiler: Any = None
        self.started = 0.0
        self.profiled: list[int] = []
        self.done = False

    def before(self, index: int) -> None:
        if self.done:
            return
        if self.profiler is None and index == self.first:
            import torch

            _sync()
            self.profiler = torch.profiler.profile(activities=_activities())
            self.profiler.__enter__()
            self.started = time.perf_counter()
        elif self.profiler is not None and index >= self.first + self.count:
            self.finish()
            return
        if self.profiler is not None:
            self.profiled.append(index)

    def finish(self) -> Path | None:
        """Stop and write the profile (None when no micro-batch was profiled)."""
        if self.done or self.profiler is None:
            self.done = True
            return None
        self.done = True
        _sync()
        wall = time.perf_counter() - self.started
        self.profiler.__exit__(None, None, None)
        self.out.mkdir(parents=True, exist_ok=True)
        stem = self.out / f"profile-{self.label}-{os.getpid()}"
        raw = stem.with_suffix(".trace.json")
        self.profiler.export_chrome_trace(str(raw))
        with open(raw, "rb") as src, gzip.open(f"{raw}.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()
        doc = summary(self.profiler, self.label, self.profiled, wall)
        path = stem.with_suffix(".json")
        path.write_text(json.dumps(doc, indent=1))
        return path


def summary(profiler: Any, label: str, micro_batches: list[int], wall_s: float) -> dict[str, Any]:
    """The profile in figures: wall and kernel seconds, each op's calls and seconds."""
    ops = []
    for event in profiler.key_averages():
        ops.append(
            {
                "name": event.key,
                "calls": int(event.count),
                "self_host_s": event.self_cpu_time_total / 1e6,
                "host_s": event.cpu_time_total / 1e6,
                "self_device_s": _self_device_us(event) / 1e6,
            }
        )
    by_host = sorted(ops, key=lambda o: -o["self_host_s"])[:TOP]
    by_device = sorted(ops, key=lambda o: -o["self_device_s"])[:TOP]
    kept = {o["name"]: o for o in by_host + by_device}
    return {
        "label": label,
        "pid": os.getpid(),
        "micro_batches": micro_batches,
        "wall_s": wall_s,
        "device_kernel_s": sum(o["self_device_s"] for o in ops),
        "self_host_s": sum(o["self_host_s"] for o in ops),
        "ops": sorted(kept.values(), key=lambda o: -(o["self_host_s"] + o["self_device_s"])),
    }


def _self_device_us(event: Any) -> float:
    for name in ("self_device_time_total", "self_cuda_time_total"):
        value = getattr(event, name, None)
        if value is not None:
            return float(value)
    return 0.0


def _activities() -> list[Any]:
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return activities


def _sync() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def host_cpu() -> tuple[float, float]:
    """(busy, all) CPU seconds of the whole host so far, every core summed (``/proc/stat``
    through psutil): the difference of two readings over a stretch's wall seconds is how many
    cores were busy in it, this process's and every other's."""
    import psutil

    times = psutil.cpu_times()
    idle = times.idle + getattr(times, "iowait", 0.0)
    total = sum(times)
    return total - idle, total


def busy_cores(before: tuple[float, float], after: tuple[float, float], wall_s: float) -> float:
    """Cores busy on average between two ``host_cpu`` readings ``wall_s`` apart."""
    return (after[0] - before[0]) / wall_s if wall_s > 0 else 0.0
