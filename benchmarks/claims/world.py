"""Parts of benchmarks/README.md from the Qwen2-7B GRPO-like job in one world of four H200s:
the world-scope trials and verl's own trainer on the same host, what ran and what did not;
then verl's own runs of the configs the one-GPU job compared, on a later host."""

from __future__ import annotations

import re
from typing import Any

from benchmarks.claims.data import Line, generated_from, load, median_runs, verl_median, verl_steps

WORLD_X4 = "results/verl-qwen2-7b-h200x4-world.json"
WORLD_X4_VERL = "results/verl-qwen2-7b-h200x4-world-verl.json"
VERL_PHASES = (
    ("weight sync", "timing_s/update_weights"),
    ("rollout", "timing_s/gen"),
    ("old log-prob", "timing_s/old_log_prob"),
    ("reference", "timing_s/ref"),
    ("update", "timing_s/update_actor"),
)


def _first_line(text: str | None) -> str:
    return text.strip().splitlines()[0] if text and text.strip() else ""


def _outcome(row: dict[str, Any]) -> str:
    what = f"{row['config']}: {'trial' if row['kind'] == 'trial' else 'verl'}"
    if row["status"] == "ok":
        return f"{what} ran"
    nccl = re.search(r"Duplicate GPU detected[^\n\x1b]*", row.get("log_tail") or "")
    said = f" (NCCL: {nccl.group(0).strip()})" if nccl else ""
    return f"{what} {row['status']}: {_first_line(row['error']).rstrip(':')}{said}"


def world_x4() -> list[Line]:
    """Each run of the comparison and how it ended; then verl's defaults run alone: its
    measured step's throughput and phases, counted as one step (no comparison rests on it)."""
    doc = load(WORLD_X4)
    lines = [generated_from(WORLD_X4)]
    lines += [Line(f"- {_outcome(row)}", (WORLD_X4,)) for row in doc["run"]["runs"]]
    (alone,) = doc["verl-alone"]["runs"]
    measured = alone["steps"][alone["warmup_steps"] :]
    if measured:
        step = measured[0]
        phases = ", ".join(f"{name} {step[key]:.1f} s" for name, key in VERL_PHASES)
        logged = alone["step_logged_at_s"]
        ended = (
            ""
            if alone["status"] == "ok"
            else f" Its last step was logged {logged[-1]:.0f} s after launch; the run then "
            f"ended `{alone['status']}` ({_first_line(alone['error'])})."
        )
        lines += [
            Line(""),
            Line(
                f"verl's defaults alone on the same host: start-up {alone['startup_s']:.0f} s, "
                f"{len(measured)} measured step after {alone['warmup_steps']} warm-up: "
                f"{step['perf/throughput']:.0f} tokens/s/GPU, step {step['timing_s/step']:.1f} s "
                f"({phases}); peak allocated {step['actor/perf/max_memory_allocated_gb']:.1f} GB "
                f"per GPU.{ended}",
                (WORLD_X4,),
            ),
        ]
    return lines


def world_x4_verl() -> list[Line]:
    """verl's runs of the world of four: each config's outcome; for a run that measured
    steps, their throughput (median, n, spread), start-up, the phases' medians and the
    peak memory. No ratio: a config measured by one run only is no comparison."""
    doc = load(WORLD_X4_VERL)
    lines = [generated_from(WORLD_X4_VERL)]
    for row in doc["run"]["runs"]:
        steps = verl_steps(row)
        if not steps:
            lines.append(Line(f"- {_outcome(row)}", (WORLD_X4_VERL,)))
            continue
        per_step = ", ".join(f"{step['perf/throughput']:.0f}" for step in steps)
        phases = ", ".join(f"{name} {verl_median(row, key):.1f} s" for name, key in VERL_PHASES)
        peak = max(step["actor/perf/max_memory_reserved_gb"] for step in steps)
        lines.append(
            Line(
                f"- {row['config']}: verl {row['status']}: "
                f"{median_runs([step['perf/throughput'] for step in steps])} tokens/s/GPU over its "
                f"measured steps ({per_step}) after {row['warmup_steps']} warm-up; start-up "
                f"{row['startup_s']:.0f} s; step {verl_median(row, 'timing_s/step'):.1f} s ({phases}); "
                f"peak reserved {peak:.1f} GB per GPU",
                (WORLD_X4_VERL,),
            )
        )
    return lines
