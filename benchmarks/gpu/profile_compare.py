"""Two profiles of update micro-batches side by side, per micro-batch (``trials.profiling``).

For a trial's profile and verl's of the same config (``verl_compare --trace --profile DIR``
writes them under ``DIR/<config>-<round>-trial`` and ``-verl``): the wall seconds of a
micro-batch, the device's kernel seconds in it (and so how long the device sat idle), the
host's own seconds in ops, then the ops whose host or device seconds per micro-batch differ
most between the two, with their calls per micro-batch.

usage: python -m benchmarks.gpu.profile_compare A.json B.json [--top 40]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def per_micro_batch(doc: dict[str, Any]) -> dict[str, Any]:
    """The profile's totals and ops, each divided by its micro-batches."""
    n = max(len(doc["micro_batches"]), 1)
    ops = {
        o["name"]: {
            "calls": o["calls"] / n,
            "self_host_ms": 1000 * o["self_host_s"] / n,
            "self_device_ms": 1000 * o["self_device_s"] / n,
        }
        for o in doc["ops"]
    }
    return {
        "label": doc["label"],
        "micro_batches": n,
        "wall_ms": 1000 * doc["wall_s"] / n,
        "device_kernel_ms": 1000 * doc["device_kernel_s"] / n,
        "self_host_ms": 1000 * doc["self_host_s"] / n,
        "ops": ops,
    }


def compare(a: dict[str, Any], b: dict[str, Any], top: int = 40) -> str:
    """The table of two profiles (``per_micro_batch`` of each)."""
    lines = [
        f"{'per micro-batch':<44} {a['label'][:18]:>18} {b['label'][:18]:>18}",
        f"{'micro-batches profiled':<44} {a['micro_batches']:>18} {b['micro_batches']:>18}",
    ]
    for label, key in (
        ("wall, ms", "wall_ms"),
        ("device kernels, ms", "device_kernel_ms"),
        ("host in ops (self), ms", "self_host_ms"),
    ):
        lines.append(f"{label:<44} {a[key]:>18.1f} {b[key]:>18.1f}")
    idle = [100 * (1 - p["device_kernel_ms"] / p["wall_ms"]) if p["wall_ms"] else 0.0 for p in (a, b)]
    lines.append(f"{'device idle, % of wall':<44} {idle[0]:>18.0f} {idle[1]:>18.0f}")
    empty = {"calls": 0.0, "self_host_ms": 0.0, "self_device_ms": 0.0}

    def gap(name: str) -> float:
        x, y = a["ops"].get(name, empty), b["ops"].get(name, empty)
        return abs(x["self_host_ms"] - y["self_host_ms"]) + abs(x["self_device_ms"] - y["self_device_ms"])

    names = sorted(set(a["ops"]) | set(b["ops"]), key=gap, reverse=True)[:top]
    lines += [
        "",
        f"{'op':<44} {'calls':>8} {'calls':>8} {'host ms':>9} {'host ms':>9} {'dev ms':>8} {'dev ms':>8}",
    ]
    for name in names:
        x, y = a["ops"].get(name, empty), b["ops"].get(name, empty)
        lines.append(
            f"{name[:44]:<44} {x['calls']:>8.1f} {y['calls']:>8.1f} {x['self_host_ms']:>9.2f} "
            f"{y['self_host_ms']:>9.2f} {x['self_device_ms']:>8.2f} {y['self_device_ms']:>8.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args(argv)
    docs = [per_micro_batch(json.loads(p.read_text())) for p in (args.a, args.b)]
    print(compare(*docs, top=args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
