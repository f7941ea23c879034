"""Where verl's training phases went, step by step, from a traced run (``trials.verl.trace``).

For each step of each traced verl run in a ``verl_compare`` result file: verl's own phase
timing (its driver's), the worker's seconds for the call, the engine's passes, the GPU
seconds of their micro-batches, how many there were and their tokens, the seconds verl
took to cut them, and the allocator's retries. A driver figure well above the worker's is
time outside the worker (batch conversion, Ray); a worker figure well above its micro-batches'
is time around the passes; micro-batches slower per token than the trial's are the model.
Where the trace has them, the seconds the pass's thread ran on a CPU in its micro-batches
(their forwards and losses; the backward runs on PyTorch's own thread) and the most cores
the host kept busy over a pass of the call.

usage: python -m benchmarks.gpu.verl_trace RESULTS.json [--run run_b]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

# verl's driver timing of each worker call the trace records.
CALLS = {
    ("infer_batch", "actor"): "timing_s/old_log_prob",
    ("infer_batch", "ref"): "timing_s/ref",
    ("train_mini_batch", "actor"): "timing_s/update_actor",
}


def steps_of(trace: list[dict[str, Any]]) -> list[dict[str, dict[str, Any]]]:
    """The trace cut into steps (a step starts at the actor's log-prob call): per call
    (``old_log_prob``, ``ref``, ``update_actor``), its worker record and its passes."""
    steps: list[dict[str, dict[str, Any]]] = []
    passes: list[dict[str, Any]] = []
    for record in trace:
        if record.get("call") == "forward_backward_batch":
            passes.append(record)
            continue
        key = (record.get("call"), record.get("role"))
        if key not in CALLS:
            continue
        if key == ("infer_batch", "actor"):
            steps.append({})
        if steps:
            steps[-1][CALLS[key]] = {"call": record, "passes": passes}
        passes = []
    return steps


def rows(run: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per step and traced call of one verl run (``verl_compare``'s row)."""
    out = []
    for index, (step, metrics) in enumerate(zip(steps_of(run.get("trace", [])), run["steps"], strict=False)):
        for timing, entry in step.items():
            passes = entry["passes"]
            tokens = [t for p in passes for t in p.get("micro_batch_tokens", [])]
            seconds = [s for p in passes for s in p.get("micro_batch_s", [])]
            out.append(
                {
                    "config": run["config"],
                    "step": index + 1,
                    "phase": timing.removeprefix("timing_s/"),
                    "verl_s": metrics.get(timing),
                    "worker_s": entry["call"]["wall_s"],
                    "passes_s": sum(p["wall_s"] for p in passes),
                    "micro_batches_s": sum(seconds),
                    "micro_batches": len(seconds),
                    "tokens": sum(tokens),
                    "prepare_s": sum(p.get("prepare_s", 0.0) for p in passes),
                    "alloc_retries": entry["call"].get("alloc_retries", 0),
                    "slowest_micro_batch_s": max(seconds, default=0.0),
                    # where the trace holds them: the pass thread's CPU seconds in
                    # its micro-batches, and the host's busy cores over the passes
                    "thread_s": sum(t for p in passes for t in p.get("micro_batch_thread_s", [])),
                    "busy_cores": max(
                        (p["host_busy_cores"] for p in passes if "host_busy_cores" in p), default=None
                    ),
                }
            )
    return out


def table(all_rows: list[dict[str, Any]]) -> str:
    head = (
        "| config | step | phase | verl s | worker s | passes s | micro-batches s | n | tokens | "
        "prepare s | alloc retries | slowest mb s | thread s | busy cores |"
    )
    lines = [head, "|" + "---|" * 14]
    for r in all_rows:
        lines.append(
            f"| {r['config']} | {r['step']} | {r['phase']} | {r['verl_s'] or 0:.2f} | {r['worker_s']:.2f} | "
            f"{r['passes_s']:.2f} | {r['micro_batches_s']:.2f} | {r['micro_batches']} | {r['tokens']} | "
            f"{r['prepare_s']:.3f} | {r['alloc_retries']} | {r['slowest_micro_batch_s']:.3f} | "
            f"{r['thread_s']:.2f} | {'-' if r['busy_cores'] is None else format(r['busy_cores'], '.1f')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results")
    parser.add_argument("--run", help="the key of one comparison in a file holding several")
    args = parser.parse_args(argv)
    doc = json.loads(Path(args.results).read_text())
    doc = doc[args.run] if args.run else doc
    traced = [run for run in doc["runs"] if run.get("kind") == "verl" and run.get("trace")]
    print(table([row for run in traced for row in rows(run)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
