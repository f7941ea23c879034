"""Part of benchmarks/README.md on verl's own noise: verl's defaults run after one another on
one H100 (``verl_compare --skip-trial defaults --rounds N`` on
``jobs/qwen2.5-0.5b-weight-sync.yaml``), set against the trials' offset from verl measured on
another H100 (``update_weights_gc.hand_over_code_ab``)."""

from __future__ import annotations

from typing import Any

from autotuner.noise import spread_pct
from benchmarks.claims.data import Line, generated_from, load, span, table, times, verl_median, verl_steps
from benchmarks.claims.update_weights_gc import AB_TIMERS, CODE_AB_H100, code_ab_offset_pct
from benchmarks.claims.weight_sync import seconds as _s

VERL_SPREAD_H100 = "results/verl-qwen2.5-0.5b-h100-verl-spread.json"
STEP = "timing_s/step"


def _speed(data: dict[str, Any], when: str) -> float | None:
    """The host's median microseconds per small op on its GPU, measured at ``when``."""
    measured = (data.get("host_speed") or {}).get(when) or {}
    return (measured.get("median_us_per_op") or {}).get("torch_cuda")


def verl_spread(rel: str = VERL_SPREAD_H100, other: str = CODE_AB_H100) -> list[Line]:
    """verl's defaults, run after run on one host: each run's measured steps and phases, the
    runs' spread, and whether the trials' offset from verl on another host lies within it."""
    data = load(rel)
    runs = sorted(
        (r for r in data["runs"] if r["status"] == "ok" and r["kind"] == "verl"), key=lambda r: r["round"]
    )
    rows = []
    for run in runs:
        steps = verl_steps(run)
        first = run.get("warmup_steps", 1) + 1
        rows.append(
            (
                [
                    f"{run['round'] + 1}, steps {first}-{len(run['steps'])}",
                    f"{run['startup_s']:.0f}",
                    ", ".join(f"{s[STEP]:.2f}" for s in steps),
                    *(
                        f"{_s(verl_median(run, key))} ({span([s[key] for s in steps], '.3f')})"
                        for key, _ in AB_TIMERS
                    ),
                ],
                (rel,),
            )
        )
    header = [
        "run",
        "start-up s",
        "measured steps s",
        *(f"{name} s: median (range)" for _, name in AB_TIMERS),
    ]
    medians = [verl_median(run, STEP) for run in runs]
    between = spread_pct(medians)
    within = [spread_pct([s[STEP] for s in verl_steps(run)]) or 0.0 for run in runs]
    updates = [verl_median(run, "timing_s/update_actor") for run in runs]
    offset, other_speed, other_start = code_ab_offset_pct(STEP, other)
    speed = _speed(data, "start")
    lines = table(header, rows) + [Line("")]
    if between is None:  # one run: no run-to-run spread to state
        lines.append(
            Line(f"One run of verl's defaults finished; its median step was {_s(medians[0])} s.", (rel,))
        )
    else:
        tie = abs(offset) <= between
        lines += [
            Line(
                f"verl's defaults ran {times([len(runs)])} in a row on one host. Their median steps were "
                f"{', '.join(_s(m) for m in medians)} s, {between:.0f}% apart (the range over the "
                f"median); `update_actor`'s medians {', '.join(_s(u) for u in updates)} s "
                f"({spread_pct(updates) or 0.0:.0f}% apart). Within a run the measured steps spread "
                f"{', '.join(f'{w:.0f}%' for w in within)}.",
                (rel,),
            ),
            Line(""),
            Line(
                f"On the H100 of {other_start} UTC (`{other}`), the trials' median step was "
                f"{offset:+.0f}% off verl's one run of the same config. verl's own runs here differ "
                f"by {between:.0f}%: "
                + (
                    "that offset lies within verl's run-to-run spread on one host, a tie, not a gap"
                    if tie
                    else "that offset lies outside verl's run-to-run spread on one host, a gap"
                )
                + f" ({len(runs)} verl runs set the spread here)."
                + (
                    f" The hosts differ: this one drove its GPU at {speed:.2f} us per small op "
                    f"(`benchmarks/gpu/host_speed.py`, before the first run), that one at "
                    f"{other_speed:.2f} us."
                    if speed is not None
                    else ""
                ),
                (rel, other),
            ),
        ]
    versions = runs[0]["versions"]
    return lines + [
        Line(""),
        Line(
            f"Device: {data['host_speed']['start']['device']}; torch {versions['torch']}, vLLM "
            f"{versions['vllm']}, verl {versions['verl']} (transformers {versions['transformers']}).",
            (rel,),
        ),
        Line(""),
        Line(f"Command: {data['command']}", (rel,)),
        Line(""),
        generated_from(rel, other),
    ]
