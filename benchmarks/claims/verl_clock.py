"""Parts of benchmarks/README.md from verl's example run in verl beside trials that time each
micro-batch as verl's trace does (``run``, one H200), and from trials of the example on the
trials' transformers and on verl's, side by side on two GPUs of one host (``lanes``)."""

from __future__ import annotations

import statistics
from typing import Any

from autotuner.noise import Verdict, compare, spread_pct
from benchmarks.claims.data import Line, error_pct, generated_from, load, table, trial_timer
from trials.verl.trace import PASS_PHASES, measured_passes, micro_batches

CLOCK = "results/verl-qwen2.5-1.5b-h200-clock.json"
# The trial's timers set beside verl's (verl's name: the trial's, in ``as_verl_timers``).
TIMERS = {
    "old_log_prob": "timing_s/old_log_prob",
    "ref": "timing_s/ref",
    "update_actor": "timing_s/update_actor",
    "step": "timing_s/step",
}


def _ok(part: str, kind: str, config: str) -> list[dict[str, Any]]:
    return [
        r
        for r in load(CLOCK)[part]["runs"]
        if r["kind"] == kind and r["config"] == config and r["status"] == "ok"
    ]


def verl_clock() -> list[Line]:
    """The example in verl and its trials on the same H200: step throughput, each phase, and
    each sub-phase's micro-batch (the trials' own clock against verl's trace)."""
    (verl,) = _ok("run", "verl", "example")
    trials = _ok("run", "trial", "example")
    steps = verl["steps"][verl.get("warmup_steps", 1) :]
    mbs = micro_batches(verl["trace"], len(verl["steps"]), verl.get("warmup_steps", 1))

    def trials_cell(values: list[float], spec: str) -> str:
        return f"{statistics.median(values):{spec}} ({', '.join(f'{v:{spec}}' for v in values)})"

    rows = []
    measured = [s["perf/throughput"] for s in steps]
    spread = spread_pct(measured) or 0.0
    predicted = [t["throughput"] for t in trials]
    rows.append(
        (
            [
                "step throughput, tok/s/GPU",
                trials_cell(predicted, ".0f"),
                f"{statistics.median(measured):.0f} (n={len(measured)}, spread {spread:.1f}%)",
                error_pct(statistics.median(predicted), statistics.median(measured)),
            ],
            (CLOCK,),
        )
    )
    for name, key in TIMERS.items():
        mine = [trial_timer(t, key) for t in trials]
        theirs = statistics.median(s[key] for s in steps)
        rows.append(
            (
                [
                    f"{name}, s",
                    trials_cell(mine, ".2f"),
                    f"{theirs:.2f}",
                    error_pct(statistics.median(mine), theirs),
                ],
                (CLOCK,),
            )
        )
    for phase in PASS_PHASES.values():
        seconds, _ = mbs[phase]
        mine = [t["metrics"][f"{phase}_micro_batch_s_mean"] for t in trials]
        theirs = statistics.mean(seconds)
        rows.append(
            (
                [
                    f"{phase}: one micro-batch, s (mean)",
                    trials_cell(mine, ".3f"),
                    f"{theirs:.3f} (n={len(seconds)})",
                    error_pct(statistics.median(mine), theirs),
                ],
                (CLOCK,),
            )
        )
    header = ["figure", "trials (median; each, in order)", "verl (median of steps)", "error"]
    return [generated_from(CLOCK), Line(""), *table(header, rows)]


def _lane(gpu: str) -> dict[str, Any]:
    (trial,) = [r for r in _ok("lanes", "trial", "example") if r["gpus"] == gpu]
    return trial


def verl_clock_transformers() -> list[Line]:
    """The example's trial on the trials' transformers against verl's, one GPU each of one
    host, read against the spread of the example's trials on the one-H200 host."""
    mine, verls = _lane("0"), _lane("1")
    theirs = [t["throughput"] for t in _ok("run", "trial", "example")]
    band = spread_pct(theirs) or 0.0
    verdict = compare(verls["throughput"], mine["throughput"], band)
    if verdict is Verdict.TIE:
        said = "a tie; verl's transformers does not make the trial's update slower"
    else:
        said = f"no tie: the trial on verl's transformers is {verdict}"

    def figures(t: dict[str, Any]) -> str:
        return (
            f"{t['throughput']:.0f} tok/s/GPU, update {t['phase_timings_s']['update_actor']:.2f} s, "
            f"{t['metrics']['update_actor_micro_batch_s_mean']:.3f} s per update micro-batch"
        )

    return [
        Line(
            f"The example's trial on transformers {mine['software']['transformers']} (GPU 0): "
            f"{figures(mine)}; on verl's transformers {verls['software']['transformers']} (GPU 1): "
            f"{figures(verls)}. The difference, "
            f"{100 * (verls['throughput'] / mine['throughput'] - 1):+.1f}%, is {said} (the example's "
            f"two trials on the one-H200 host were {band:.1f}% apart).",
            (CLOCK,),
        )
    ]


def _update_passes(verl: dict[str, Any]) -> list[list[float]]:
    """The micro-batch seconds of each update pass (one per mini-batch) of verl's measured steps."""
    passes = measured_passes(verl["trace"], len(verl["steps"]), verl.get("warmup_steps", 1))
    return [r["micro_batch_s"] for r in passes["update_actor"]]


def verl_clock_passes() -> list[Line]:
    """verl's update passes one by one: the median micro-batch of each, lowest, median and
    highest over the measured steps, against the trials' medians on the same host."""
    three = "results/verl-qwen2.5-1.5b-h200-three.json"
    runs: list[tuple[str, dict[str, Any], list[dict[str, Any]], str]] = []
    (verl,) = _ok("run", "verl", "example")
    runs.append((f"example, `{CLOCK}` run", verl, _ok("run", "trial", "example"), CLOCK))
    doc = load(three)
    for host in ("host_a", "host_b"):
        for row in doc[host]["runs"]:
            if row["kind"] == "verl" and row["status"] == "ok":
                trials = [
                    t
                    for t in doc[host]["runs"]
                    if t["kind"] == "trial" and t["config"] == row["config"] and t["status"] == "ok"
                ]
                runs.append((f"{row['config']}, `{three}` {host}", row, trials, three))
    rows = []
    for label, run, trials, rel in runs:
        medians = sorted(statistics.median(p) for p in _update_passes(run))
        clocked = [
            t["metrics"]["update_actor_micro_batch_s_median"]
            for t in trials
            if "update_actor_micro_batch_s_median" in t["metrics"]
        ]
        rows.append(
            (
                [
                    label,
                    str(len(medians)),
                    f"{medians[0]:.3f} / {statistics.median(medians):.3f} / {medians[-1]:.3f}",
                    ", ".join(f"{v:.3f}" for v in clocked) if clocked else "-",
                ],
                (rel,),
            )
        )
    header = [
        "config, run",
        "verl's update passes (measured steps)",
        "verl: median micro-batch of a pass, s (lowest / median / highest pass)",
        "trials on that host: median micro-batch, s (timed as verl's)",
    ]
    return [generated_from(CLOCK, three), Line(""), *table(header, rows)]
