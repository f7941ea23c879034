"""The trials' train phase against verl's micro-batch layouts: the rows of
``docs/padding-vs-packing.md``'s table (packed micro-batches of 4, 8 and 16, dynamic batches
of 16,384 tokens, padded rows at 4), measured by real trials.

Each row is a train-only trial (``python -m trials run``) of the Qwen2.5-1.5B shape on 512
GRPO-like sequences (prompt ~N(300, 80) in [16, 512], response lognormal median 500 sigma 0.6
capped at 3072, one optimizer step over them all, no reference model), run ``--repeats``
times interleaved (A-B-C-A-B-C). The table gives each row's median update rate (real
tokens/s) with its spread, its ratio to packed micro-batch 4 beside the probe's ratio, and
the memory the update's activations and logits took above the resident state
(``update_actor_max_allocated_gib`` less fp32 parameters, gradients and AdamW state).
``--strategy fsdp`` builds the actor as verl v0.9's default strategy does (FSDP1), ``fsdp2``
with FSDP2; without it, the trials' own default.

    python3 -m benchmarks.gpu.layout_bench --out benchmarks/results/layout-h200.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from autotuner.knobs import A, R
from autotuner.spec import parse_job_spec
from autotuner.trialspec import build_trial_spec

MODEL = "actor_rollout_ref.model."
# The probe's table (one H200, 2026-11-24): real tokens/s and peak GiB of fwd+bwd with bf16
# parameters; ``docs/padding-vs-packing.md``.
PROBE = {
    "packed-4": (14038, 20.9),
    "packed-8": (23643, 34.3),
    "packed-16": (28617, 55.0),
    "packed-dynamic-16384": (29632, 49.0),
    "padded-4": (14651, 29.5),  # the probe's per-micro-batch padding (SDPA); see the doc
}
ROWS: dict[str, dict[str, Any]] = {
    "packed-4": {A + "ppo_micro_batch_size_per_gpu": 4},
    "packed-8": {A + "ppo_micro_batch_size_per_gpu": 8},
    "packed-16": {A + "ppo_micro_batch_size_per_gpu": 16},
    "packed-dynamic-16384": {A + "use_dynamic_bsz": True, A + "ppo_max_token_len_per_gpu": 16384},
    "padded-4": {A + "ppo_micro_batch_size_per_gpu": 4, MODEL + "use_remove_padding": False},
}


def job_spec(device: str, model: str = "qwen2.5-1.5b", prompts: int = 64) -> Any:
    return parse_job_spec(
        {
            "name": "layout-bench",
            "workload": {
                "model": model,
                "dtype": "bfloat16",
                "phases": "train",
                "prompt_length": {"kind": "normal", "mean": 300, "std": 80, "min": 16},
                "response_length": {"kind": "lognormal", "median": 500, "sigma": 0.6, "max": 3072},
                "max_prompt_length": 512,
                "max_response_length": 3072,
                "train_batch_size": prompts,
                "n": 8,
                "ppo_mini_batch_size": prompts,
                "use_kl_loss": False,
            },
            "cluster": {"device": device, "n_gpus_per_node": 1},
        }
    )


def config_for(row: dict[str, Any]) -> dict[str, Any]:
    base = {
        MODEL + "use_remove_padding": True,
        MODEL + "enable_gradient_checkpointing": True,
        A + "use_dynamic_bsz": False,
        A + "ppo_micro_batch_size_per_gpu": 4,
        A + "ppo_max_token_len_per_gpu": 16384,
        A + "fsdp_config.param_offload": False,
        A + "fsdp_config.optimizer_offload": False,
        A + "entropy_from_logits_with_chunking": False,
        R + "log_prob_micro_batch_size_per_gpu": 4,
        R + "log_prob_max_token_len_per_gpu": 16384,
        R + "max_model_len": 3584,
    }
    return (
        base
        | row
        | {R + "log_prob_micro_batch_size_per_gpu": (base | row)[A + "ppo_micro_batch_size_per_gpu"]}
    )


def run_row(name: str, run: int, args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    device = args.device
    spec = job_spec(device, args.model, args.prompts)
    arch = spec.validate_model()
    trial = build_trial_spec(spec, arch, config_for(ROWS[name]), f"{name}-{run}", device, None)
    trial.phases = ["train"]
    if args.strategy:
        trial.train.strategy = args.strategy
    spec_path = os.path.join(workdir, f"{name}-{run}.spec.json")
    out_path = os.path.join(workdir, f"{name}-{run}.result.json")
    with open(spec_path, "w") as f:
        f.write(trial.to_json())
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "trials", "run", "--spec", spec_path, "--out", out_path],
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = {"status": "error", "error_message": proc.stderr[-2000:]}
    if os.path.exists(out_path):
        with open(out_path) as f:
            result = json.load(f)
    if proc.returncode != 0 and result.get("status") == "ok":
        result["status"] = "error"
    result["row"], result["run"], result["started"] = name, run, t0
    result["strategy"] = trial.train.strategy
    result.pop("log_tail", None)
    return result


def summarise(results: list[dict[str, Any]], params: int) -> dict[str, Any]:
    state_gib = 16 * params / (1 << 30)  # fp32 parameters + gradients + AdamW's two moments
    rows: dict[str, Any] = {}
    for name in dict.fromkeys(r["row"] for r in results):
        ok = [r for r in results if r["row"] == name and r["status"] == "ok"]
        rates = [r["metrics"]["update_actor_tokens_per_s"] for r in ok]
        above = [r["metrics"].get("update_actor_max_allocated_gib", 0.0) - state_gib for r in ok]
        rows[name] = {
            "n": len(ok),
            "update_tokens_per_s": rates,
            "median": statistics.median(rates) if rates else None,
            "spread_pct": 100 * (max(rates) - min(rates)) / statistics.median(rates) if rates else None,
            "activations_gib_median": statistics.median(above) if above else None,
            "failed": [
                r.get("error_type") or r["status"]
                for r in results
                if r["row"] == name and r["status"] != "ok"
            ],
        }
    ref = rows.get("packed-4", {}).get("median")
    probe_ref = PROBE["packed-4"][0]
    for name, row in rows.items():
        row["ratio_to_packed_4"] = row["median"] / ref if row["median"] and ref else None
        row["probe_ratio_to_packed_4"] = PROBE[name][0] / probe_ref
        if row["ratio_to_packed_4"]:
            row["ratio_error_pct"] = 100 * (row["ratio_to_packed_4"] / row["probe_ratio_to_packed_4"] - 1)
    return rows


def table(rows: dict[str, Any]) -> str:
    lines = [
        "| row | n | update tok/s | spread | ratio to packed-4 | probe's | off by | act.+logits GiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        if not r["median"]:
            lines.append(f"| {name} | 0 | failed: {', '.join(map(str, r['failed']))} | | | | | |")
            continue
        lines.append(
            f"| {name} | {r['n']} | {r['median']:.0f} | {r['spread_pct']:.1f}% | "
            f"{r['ratio_to_packed_4']:.2f} | "
            f"{r['probe_ratio_to_packed_4']:.2f} | {r.get('ratio_error_pct', 0):+.1f}% | "
            f"{r['activations_gib_median']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--model", default="qwen2.5-1.5b")
    parser.add_argument("--prompts", type=int, default=64, help="prompts (x8 sequences)")
    parser.add_argument(
        "--strategy",
        choices=("fsdp", "fsdp2"),
        help="actor_rollout_ref.actor.strategy the trials build the actor with (default: the trials' own)",
    )
    args = parser.parse_args(argv)
    names = args.rows.split(",")
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="layout-bench-") as workdir:
        for run in range(args.repeats):
            for name in names:
                results.append(run_row(name, run, args, workdir))
                r = results[-1]
                rate = r.get("metrics", {}).get("update_actor_tokens_per_s")
                print(f"{name} run {run}: {r['status']} {rate or ''}", flush=True)
                _write(args, results)
    spec = job_spec(args.device, args.model, args.prompts)
    rows = summarise(results, spec.validate_model().num_parameters)
    _write(args, results, rows)
    print(table(rows))
    return 0


def _write(
    args: argparse.Namespace, results: list[dict[str, Any]], rows: dict[str, Any] | None = None
) -> None:
    doc = {
        "command": "python3 -m benchmarks.gpu.layout_bench " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "probe": {k: {"tokens_per_s": v[0], "peak_gib": v[1]} for k, v in PROBE.items()},
        "rows": rows,
        "trials": results,
    }
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    raise SystemExit(main())
