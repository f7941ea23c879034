"""What verl v0.9 spends cutting one rank's batch into micro-batches, by its own code.

verl's FSDP engine starts every log-prob pass (and every mini-batch of the update) with
``verl.workers.engine.utils.prepare_micro_batches``. With ``use_dynamic_bsz`` that is
``rearrange_micro_batches``: Karmarkar-Karp over the sequences' workloads into
``ceil(tokens / budget)`` partitions, then one ``index_select_tensor_dict`` per micro-batch,
which unbinds every nested tensor of the whole batch. Both grow with sequences x
micro-batches, so at a fixed token budget the cost grows with the square of a rank's
sequences. It is CPU time inside verl's timed phases, which a trial does not spend.

This script builds a rank's batch the way verl's trainer holds it at the old-log-prob pass
(``trials.verl.cut.verl_batch``, as the trials do), draws the lengths from a
job spec's distributions and seed, and times verl's ``prepare_micro_batches`` on it for each
number of sequences and token budget (``--repeats`` times each, after one untimed cut; the
median and spread are reported). A fixed micro-batch size (``use_dynamic_bsz=False``,
verl's ``chunk_tensordict``) is timed beside it. It runs in verl's environment:

    PYTHONPATH=$PWD .venv-verl/bin/python -m benchmarks.verl_batching \\
        --job benchmarks/jobs/qwen2.5-1.5b-grpo.yaml --out benchmarks/results/verl-batching-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from trials.lengths import step_lengths
from trials.types import BatchDraw
from trials.verl.cut import prepare_seconds, verl_batch

SEQUENCES = (256, 512, 1024, 2048)
BUDGETS = (3584, 7168, 14336)
FIXED_MICRO_BATCH = 4


def lengths_of(job: dict[str, Any], sequences: int) -> tuple[list[int], list[int]]:
    """``sequences`` (prompt, response) lengths of the job's step, as its trials draw them."""
    w = job["workload"]
    n = int(w.get("n", 1))
    draw = BatchDraw(
        prompt_length=w["prompt_length"],
        response_length=w["response_length"],
        max_prompt_length=int(w["max_prompt_length"]),
        max_response_length=int(w["max_response_length"]),
        prompts=-(-sequences // n),
        samples_per_prompt=n,
        seed=int(job.get("seed", 0)),
        rollout_requests=sequences,
        train_sequences=sequences,
    )
    prompts, responses = step_lengths(draw)
    return prompts[:sequences], responses[:sequences]


def time_prepare(td: Any, dynamic: bool, budget: int, micro_batch_size: int, repeats: int) -> dict[str, Any]:
    seconds, count = [], 0
    for _ in range(repeats):
        t, count = prepare_seconds(td, dynamic, budget, micro_batch_size)
        seconds.append(t)
    median = statistics.median(seconds)
    return {
        "micro_batches": count,
        "seconds": seconds,
        "median_s": median,
        "spread_pct": 100 * (max(seconds) - min(seconds)) / median,
        "per_micro_batch_ms": 1000 * median / count,
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| sequences | tokens | entries | cut | micro-batches | seconds (median) | spread "
        "| ms per micro-batch |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cut = (
            f"dynamic, {r['budget']} tokens" if r["dynamic"] else f"fixed, {r['micro_batch_size']} sequences"
        )
        lines.append(
            f"| {r['sequences']} | {r['tokens']} | {r.get('entries', 'trial')} | {cut} | "
            f"{r['micro_batches']} | {r['median_s']:.3f} | "
            f"{r['spread_pct']:.0f}% | {r['per_micro_batch_ms']:.1f} |"
        )
    return "\n".join(lines)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# The nested tensors verl's batch holds before the actor's update beyond those the trials'
# batch holds (a traced run's ``data_keys``: the rollout's log-probs and scores, the passes'
# outputs, the advantages), each one value per response token.
UPDATE_ENTRIES = (
    "advantages",
    "dummy_tensor",
    "entropy",
    "log_probs",
    "loss_mask",
    "old_log_probs",
    "ref_log_prob",
    "returns",
    "rm_scores",
    "rollout_log_probs",
)


def with_update_entries(td: Any) -> Any:
    """``td`` with the further entries verl's update batch holds, shaped as its responses."""
    for name in UPDATE_ENTRIES:
        if name not in td.keys():  # noqa: SIM118 (a TensorDict refuses `in`)
            td[name] = td["response_mask"].clone().float()
    return td


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--sequences", type=int, nargs="+", default=list(SEQUENCES))
    parser.add_argument("--budgets", type=int, nargs="+", default=list(BUDGETS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--update-entries",
        action="store_true",
        help="also time each cut with the further nested tensors verl's update batch holds",
    )
    args = parser.parse_args(argv)
    job = yaml.safe_load(Path(args.job).read_text())
    w = job["workload"]
    rows: list[dict[str, Any]] = []
    warm = True  # the first cut in a process pays for lazy imports and set-up: done untimed
    for sequences in args.sequences:
        prompts, responses = lengths_of(job, sequences)
        td = verl_batch(prompts, responses, int(w["max_prompt_length"]), int(w["max_response_length"]))
        tokens = sum(prompts) + sum(responses)
        cuts = [(True, b, FIXED_MICRO_BATCH) for b in args.budgets] + [(False, 0, FIXED_MICRO_BATCH)]
        if warm:
            time_prepare(td, True, max(args.budgets), FIXED_MICRO_BATCH, 1)
            warm = False
        batches = [("trial", td)]
        if args.update_entries:
            batches.append(("verl update", with_update_entries(td.clone())))
        for dynamic, budget, micro_batch_size in cuts:
            for entries, batch in batches:
                timing = time_prepare(batch, dynamic, budget, micro_batch_size, args.repeats)
                row = {"sequences": sequences, "tokens": tokens, "dynamic": dynamic, "budget": budget}
                row |= {"entries": entries, "nested": len(batch.keys())}
                rows.append(row | {"micro_batch_size": micro_batch_size} | timing)
                print(table(rows[-1:]).splitlines()[-1], flush=True)
    doc = {
        "what": "Seconds verl v0.9's prepare_micro_batches takes to cut one rank's batch into micro-batches "
        "(benchmarks/verl_batching.py), by its own code, on the CPU",
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "device": f"{cpu_name()}, {os.cpu_count()} cores (the cut runs on the CPU in verl's worker)",
        "software": {name: metadata.version(name) for name in ("verl", "torch", "tensordict")},
        "command": "PYTHONPATH=$PWD .venv-verl/bin/python -m benchmarks.verl_batching "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "job": args.job,
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
