"""How fast a host's CPU drives a GPU: the host's seconds per small op, one thread.

A micro-batch whose GPU work is short waits on the host: Python, torch's dispatcher and the
kernel launches of each op. This times that path alone, on tiny tensors, so the GPU's own
time is negligible: ``N`` element-wise ops on a one-element tensor on the GPU (each a
dispatch and a launch), the same ops on the CPU (dispatch and a tiny kernel), and a plain
Python loop. Each figure is measured ``--repeats`` times; the JSON holds every run, the host's
processor (``trials.device.host_cpus``) and the GPU.

Usage, on a GPU host (torch with CUDA; nothing else needed)::

    python3 -m benchmarks.gpu.host_speed --out /tmp/at/host-speed.json
    taskset -c 0-15 python3 -m benchmarks.gpu.host_speed --out ...   # confined to 16 CPUs
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trials.device import describe_device, host_cpus

OPS = 20_000


def _python_loop(n: int) -> float:
    t0 = time.perf_counter()
    x = 0
    for i in range(n):
        x += i
    return time.perf_counter() - t0


def _torch_ops(device: str) -> Callable[[int], float]:
    import torch

    def run(n: int) -> float:
        x = torch.ones(1, device=device)
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            x = x + 1
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    return run


def measure(ops: int, repeats: int) -> dict[str, Any]:
    """Microseconds per op of each path, every run, after one warm-up run of each."""
    import torch

    paths: dict[str, Callable[[int], float]] = {"python_loop": _python_loop, "torch_cpu": _torch_ops("cpu")}
    if torch.cuda.is_available():
        paths["torch_cuda"] = _torch_ops("cuda")
    runs: dict[str, list[float]] = {name: [] for name in paths}
    for path in paths.values():
        path(ops // 10)  # warm-up: first launches, allocator
    for _ in range(repeats):
        for name, path in paths.items():  # interleaved
            runs[name].append(1e6 * path(ops) / ops)
    return {
        "ops": ops,
        "us_per_op": runs,
        "median_us_per_op": {name: statistics.median(values) for name, values in runs.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu.host_speed")
    parser.add_argument("--ops", type=int, default=OPS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    import torch

    doc = {
        "command": "python3 -m benchmarks.gpu.host_speed " + " ".join(sys.argv[1:] if argv is None else argv),
        "host": host_cpus(),
        "device": describe_device("cuda" if torch.cuda.is_available() else "cpu"),
        "torch": torch.__version__,
        **measure(args.ops, args.repeats),
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1))
    host = doc["host"]
    print(f"{doc['device']} | {host['cpu']} | {host['cpu_cores']} of {host['host_cpus']} CPUs")
    for name, values in doc["us_per_op"].items():
        each = ", ".join(f"{v:.2f}" for v in values)
        print(f"{name:<12} {doc['median_us_per_op'][name]:8.2f} us/op  ({each})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
