"""Stands in for a GPU trial on this CPU-only machine, to watch the study's GPU admission
with Ray's logical GPUs: ``RayExecutor(trial_python=<a script running this>)`` makes the
launcher run ``<script> -m trials run --spec S --out O --progress P``, answered here by
holding the trial's GPUs for ``HOLD_S`` seconds and reporting a throughput that grows with
the rollout's TP size. Only the study's dispatching is under test: real CUDA trials are
covered by tests/trials/test_gpu.py on a GPU host."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HOLD_S = 1.5


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("-m")
    parser.add_argument("command")
    parser.add_argument("--spec")
    parser.add_argument("--out")
    parser.add_argument("--progress")
    args = parser.parse_args(argv)
    spec = json.loads(Path(args.spec).read_text())
    started = time.time()
    time.sleep(HOLD_S)
    tp = spec["rollout"]["tensor_model_parallel_size"]
    result = {
        "trial_id": spec["trial_id"],
        "status": "ok",
        "device": "stand-in GPU",
        "metrics": {
            "throughput_tokens_per_s_per_gpu": 1000.0 + 100 * tp,
            "peak_memory_gib": 40.0 + tp,
            "trial_ranks": spec["trial_gpus"],
            "standin_started_at": started,
            "standin_ended_at": time.time(),
        },
    }
    Path(args.out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
