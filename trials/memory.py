"""Peak memory of a phase, sampled on a background thread.

``PeakMemorySampler`` is a context manager: entering starts a daemon thread that samples
every ``interval_s`` (default 50 ms) until exit; ``peak_gib`` is then the phase's peak.

- ``cuda``: the device is the resource, so the peak is absolute and per device: the
  larger of NVML's used memory on the fullest visible GPU (the vLLM engine allocates
  from its own processes, which torch in this process cannot see; with tensor
  parallelism it spans several GPUs, each of which must fit) and this process's
  ``torch.cuda.max_memory_allocated`` (reset on entry).
- ``cpu``: the growth of this process and all its descendants (recursive) over a
  baseline, process by process: each process's RSS over its own RSS in the baseline (one
  that shrank counts nothing), a process started since counted whole, one of the baseline
  that has exited counted not at all, so that an unrelated process ending mid-phase does
  not hide the phase's growth. The baseline is the tree's RSS on entry, or ``baseline``
  when given (the runner passes the trial's own, taken before the actor is built, so every
  phase's peak counts what the trial holds on its 'device', as NVML does on a GPU); its
  sum is kept in ``baseline_gib``.

One sampler per phase; not reusable. Sampling errors (a child exiting mid-read) are
skipped, never raised.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

GIB = float(1 << 30)


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on a GPU (``used_gib`` None where NVML does not say)."""

    pid: int
    name: str
    used_gib: float | None


@dataclass(frozen=True)
class GpuReading:
    """One visible GPU's memory and the compute processes on it."""

    gpu: str  # e.g. "GPU 0 (NVIDIA H200)"
    used_gib: float
    total_gib: float
    processes: tuple[GpuProcess, ...] = ()


# Child processes that are not the trial's work (verl's environment timing its cut,
# ``trials.verl.cut.PreparedCut``): their memory is not the trial's.
_NOT_THE_TRIALS: set[int] = set()


def not_the_trials(pid: int, leaves: bool = False) -> None:
    """Count the child ``pid`` out of ``process_tree_rss_bytes`` (``leaves``: in again, it ended)."""
    if leaves:
        _NOT_THE_TRIALS.discard(pid)
    else:
        _NOT_THE_TRIALS.add(pid)


def process_tree_rss() -> dict[int, int]:
    """RSS of this process and of each of its descendants, in bytes, by pid (those
    ``not_the_trials`` names and theirs left out).

    Walks the tree down from this process through ``/proc/<pid>/task/<tid>/children``, so a
    sample reads the trial's own processes only (psutil's ``children`` reads the whole
    process table, a cost that grows with every process on the host, paid every sample).
    psutil's walk where the kernel lacks those files (``CONFIG_PROC_CHILDREN``)."""
    if not _CHILDREN_LISTED:
        return _psutil_tree_rss()
    out: dict[int, int] = {}
    todo = [os.getpid()]
    while todo:
        pid = todo.pop()
        rss = _rss_bytes(pid)
        if rss is None:  # gone mid-walk: neither it nor its children count
            continue
        out[pid] = rss
        todo.extend(child for child in _children(pid) if child not in _NOT_THE_TRIALS)
    return out


def process_tree_rss_bytes() -> int:
    """RSS of this process plus all of its descendants, in bytes (``process_tree_rss``)."""
    return sum(process_tree_rss().values())


def held_bytes(baseline: Mapping[int, int]) -> int:
    """What the process tree holds beyond ``baseline`` (a ``process_tree_rss`` taken
    earlier), process by process: each one's growth over its own baseline RSS, none below
    zero, and a process started since counted whole."""
    return sum(max(0, rss - baseline.get(pid, 0)) for pid, rss in process_tree_rss().items())


_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_CHILDREN_LISTED = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def _children(pid: int) -> list[int]:
    """``pid``'s children: each of its threads lists the ones it started."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    out: list[int] = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(child) for child in f.read().split())
        except (OSError, ValueError):
            continue
    return out


def _rss_bytes(pid: int) -> int | None:
    """Resident set of ``pid`` (``/proc/<pid>/statm``, as psutil reads it), None if gone."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * _PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return None


def _psutil_tree_rss() -> dict[int, int]:
    import psutil

    me = psutil.Process()
    out = {me.pid: me.memory_info().rss}
    for child in me.children(recursive=True):
        try:
            if _NOT_THE_TRIALS and _not_the_trials(child):
                continue
            out[child.pid] = child.memory_info().rss
        except psutil.Error:
            continue
    return out


def _not_the_trials(process: Any) -> bool:
    return process.pid in _NOT_THE_TRIALS or any(p.pid in _NOT_THE_TRIALS for p in process.parents())


class NvmlProbe:
    """Memory of the GPUs this process may use (``CUDA_VISIBLE_DEVICES``, or ``visible``
    when given), via NVML. Initialises no CUDA context."""

    def __init__(self, visible: str | None = None) -> None:
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        self._tokens = visible_gpu_tokens(pynvml, visible)
        self._handles = [self._handle(token) for token in self._tokens]

    def _handle(self, token: str):  # type: ignore[no-untyped-def]
        if token.startswith(("GPU-", "MIG-")):
            return self._nvml.nvmlDeviceGetHandleByUUID(token)
        return self._nvml.nvmlDeviceGetHandleByIndex(int(token))

    def used_bytes(self) -> int:
        """Used memory of the fullest visible GPU (a tensor-parallel engine spans several)."""
        return max((self._nvml.nvmlDeviceGetMemoryInfo(h).used for h in self._handles), default=0)

    def total_bytes(self) -> int:
        """Capacity of the smallest visible GPU."""
        return min((self._nvml.nvmlDeviceGetMemoryInfo(h).total for h in self._handles), default=0)

    def names(self) -> list[str]:
        names = [self._nvml.nvmlDeviceGetName(h) for h in self._handles]
        return [n.decode() if isinstance(n, bytes) else n for n in names]

    def readings(self) -> list[GpuReading]:
        """Each visible GPU's used memory and the compute processes holding it."""
        out = []
        for token, name, handle in zip(self._tokens, self.names(), self._handles, strict=True):
            info = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            try:
                procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except self._nvml.NVMLError:
                procs = []
            out.append(
                GpuReading(
                    gpu=f"GPU {token} ({name})",
                    used_gib=info.used / GIB,
                    total_gib=info.total / GIB,
                    processes=tuple(_gpu_process(p) for p in procs),
                )
            )
        return out

    def close(self) -> None:
        self._nvml.nvmlShutdown()


def _gpu_process(proc) -> GpuProcess:  # type: ignore[no-untyped-def]
    import psutil

    used = getattr(proc, "usedGpuMemory", None)
    try:
        name = psutil.Process(proc.pid).name()
    except psutil.Error:  # another PID namespace (containers), or gone
        name = "?"
    return GpuProcess(proc.pid, name, used / GIB if isinstance(used, int) else None)


def visible_gpu_tokens(pynvml, visible: str | None = None) -> list[str]:  # type: ignore[no-untyped-def]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    if visible is None:
        return [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
    return [t.strip() for t in visible.split(",") if t.strip()]


class PeakMemorySampler:
    """Samples memory while a phase runs (see the module docstring for what is counted)."""

    def __init__(
        self, device: str, interval_s: float = 0.05, baseline: Mapping[int, int] | None = None
    ) -> None:
        self.device = device
        self.interval_s = interval_s
        self.baseline_gib = 0.0
        self._peak_bytes = 0
        self._baseline: Mapping[int, int] = {}
        self._given_baseline = baseline
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: NvmlProbe | None = None

    @property
    def peak_gib(self) -> float:
        return self._peak_bytes / GIB

    def __enter__(self) -> PeakMemorySampler:
        if self.device == "cuda":
            self._start_cuda()
        else:
            given = self._given_baseline
            self._baseline = process_tree_rss() if given is None else given
            self.baseline_gib = sum(self._baseline.values()) / GIB
        self._sample()
        self._thread = threading.Thread(target=self._run, name="peak-memory", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._sample()
        if self._nvml is not None:
            self._nvml.close()

    def _start_cuda(self) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats()
        try:
            self._nvml = NvmlProbe()
        except Exception:  # no NVML (driver mismatch, container): torch's view only
            self._nvml = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        try:
            now = self._read()
        except Exception:
            return
        self._peak_bytes = max(self._peak_bytes, now)

    def _read(self) -> int:
        if self.device != "cuda":
            return held_bytes(self._baseline)
        import torch

        used = self._nvml.used_bytes() if self._nvml is not None else 0
        return max(used, torch.cuda.max_memory_allocated())


def gpu_total_gib() -> float | None:
    """Capacity of the smallest visible GPU in GiB (NVML: CUDA stays uninitialised), or None."""
    try:
        probe = NvmlProbe()
    except Exception:
        return None
    try:
        return probe.total_bytes() / GIB or None
    finally:
        probe.close()


def gpu_readings(visible: str | None = None) -> list[GpuReading] | None:
    """Each visible GPU's memory and processes (NVML), or None where NVML cannot be read."""
    try:
        probe = NvmlProbe(visible)
    except Exception:
        return None
    try:
        return probe.readings()
    except Exception:
        return None
    finally:
        probe.close()
