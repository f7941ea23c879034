"""Parts of the READMEs from verl's defaults, example and the winner run in verl on one H200
each, beside trials of the same configs on the same hosts (``benchmarks/gpu/strategy-h200.sh``
running ``verl_compare``): the trials with verl's loss, optimizer step and cut, vLLM with the
config's own prefill budget."""

from __future__ import annotations

import statistics
from typing import Any

from autotuner.noise import spread_pct
from benchmarks.claims.data import (
    Line,
    error_pct,
    generated_from,
    load,
    ranked,
    span,
    table,
    targets,
    trial_timer,
    verl_median,
    verl_steps,
)
from benchmarks.claims.verl_clock import CLOCK
from benchmarks.claims.verl_three import TIMERS as THREE_TIMERS
from trials.verl.trace import micro_batches

VERL_H200 = "results/verl-qwen2.5-1.5b-h200-three.json"
HOSTS = ("host_a", "host_b")
CONFIGS = ("defaults", "example", "winner")
# verl's timers the table sets beside the trial's, by the name the table gives them.
TIMERS = {
    "update_weights (weight sync + wake)": "timing_s/update_weights",
    **THREE_TIMERS,
    "step": "timing_s/step",
}


def _rows(kind: str, config: str, host: str | None = None) -> list[tuple[str, dict[str, Any]]]:
    """(host, row) of every finished run of ``kind`` for ``config``."""
    doc = load(VERL_H200)
    return [
        (h, row)
        for h in HOSTS
        if host in (None, h)
        for row in doc[h]["runs"]
        if row["kind"] == kind and row["config"] == config and row["status"] == "ok"
    ]


def _verl(config: str) -> tuple[str, dict[str, Any]]:
    (found,) = _rows("verl", config)
    return found


def _trials_beside(config: str) -> tuple[str, list[dict[str, Any]]]:
    """The host of verl's run of ``config`` and the trials of it on that host."""
    host, _ = _verl(config)
    return host, [row for _, row in _rows("trial", config, host)]


def _throughputs() -> tuple[dict[str, float], dict[str, float]]:
    """Per config: verl's median step throughput, and the median of the trials beside it."""
    verl = {c: verl_median(_verl(c)[1], "perf/throughput") for c in CONFIGS}
    trial = {c: statistics.median(t["throughput"] for t in _trials_beside(c)[1]) for c in CONFIGS}
    return verl, trial


def verl_h200() -> list[Line]:
    """Per config and figure: the trials beside verl's run (median, n), verl's median over its
    measured steps, the error; then every trial on either host."""
    header = ["config", "figure", "trials on verl's host (median, n)", "error", "verl (median of steps)"]
    rows = []
    for config in CONFIGS:
        host, verl = _verl(config)
        _, trials = _trials_beside(config)
        measured = [s["perf/throughput"] for s in verl_steps(verl)]
        predicted = statistics.median(t["throughput"] for t in trials)
        rows.append(
            (
                [
                    f"{config} ({host})",
                    "step throughput, tok/s/GPU",
                    f"{predicted:.0f} (n={len(trials)})",
                    error_pct(predicted, statistics.median(measured)),
                    f"{statistics.median(measured):.0f} "
                    f"(n={len(measured)}, spread {spread_pct(measured) or 0:.1f}%)",
                ],
                (VERL_H200,),
            )
        )
        for name, key in TIMERS.items():
            mine = statistics.median(trial_timer(t, key) for t in trials)
            theirs = verl_median(verl, key)
            rows.append(
                (
                    [config, f"{name}, s", f"{mine:.2f}", error_pct(mine, theirs), f"{theirs:.2f}"],
                    (VERL_H200,),
                )
            )
    every = []
    for config in CONFIGS:
        for host in HOSTS:
            values = [f"{row['throughput']:.0f}" for _, row in _rows("trial", config, host)]
            if values:
                every.append(f"{config} on {host} {', '.join(values)}")
    return [
        generated_from(VERL_H200),
        Line(""),
        *table(header, rows),
        Line(""),
        Line("Every trial, tok/s/GPU, in the order they ran: " + "; ".join(every) + ".", (VERL_H200,)),
    ]


def verl_h200_headline() -> list[Line]:
    verl, trial = _throughputs()
    verl_order, trial_order, errors, within = ranked(verl, trial, CONFIGS)
    hosts = {c: _verl(c)[0] for c in CONFIGS}
    ended = [_verl(c)[1] for c in CONFIGS]
    worst = max(CONFIGS, key=lambda c: abs(errors[c]))
    _, worst_verl = _verl(worst)
    worst_trials = _trials_beside(worst)[1]
    phase_errors = {
        name: statistics.median(trial_timer(t, key) for t in worst_trials) / verl_median(worst_verl, key) - 1
        for name, key in TIMERS.items()
        if name not in ("step", "update_weights (weight sync + wake)")
    }
    off = max(phase_errors, key=lambda name: abs(phase_errors[name]))
    moved = []
    for c in CONFIGS:
        by_host = {h: [row["throughput"] for _, row in _rows("trial", c, h)] for h in HOSTS}
        if all(by_host.values()):
            a, b = (statistics.median(by_host[h]) for h in HOSTS)
            moved.append(f"{c} {100 * (b / a - 1):+.0f}%")
    return [
        Line(
            f"In verl: the winner {verl['winner']:.0f}, verl's example {verl['example']:.0f} and verl's "
            f"defaults {verl['defaults']:.0f} tokens/s/GPU (medians of the steps after the warm-up; "
            + ", ".join(f"{c} on {hosts[c]}" for c in CONFIGS)
            + f"). The winner is {verl['winner'] / verl['defaults']:.2f}x verl's defaults and "
            f"{verl['winner'] / verl['example']:.2f}x verl's example in verl.",
            (VERL_H200,),
        ),
        Line(""),
        Line(
            f"The trials rank the configs {', '.join(trial_order)}; verl ranks them {', '.join(verl_order)} "
            f"({'the same order' if trial_order == verl_order else 'not the same order'}). The trials beside "
            "each verl run predicted "
            + ", ".join(f"{c} {100 * errors[c]:+.1f}%" for c in CONFIGS)
            + f". The worst is {worst}, and its phase most off is {off} ({100 * phase_errors[off]:+.0f}%).",
            (VERL_H200,),
        ),
        Line(""),
        Line(
            targets(verl, trial_order == verl_order, within, CONFIGS),
            (VERL_H200,),
        ),
        Line(""),
        Line(
            "The same configs' trials on the two hosts (host_b's median against host_a's): "
            + ", ".join(moved)
            + ". Ratios across hosts carry that much more uncertainty than those on one host.",
            (VERL_H200,),
        ),
        Line(""),
        Line(
            f"verl's runs took {span([r['wall_s'] / 60 for r in ended], '.1f')} minutes each, "
            f"{span([r['startup_s'] / 60 for r in ended], '.1f')} of them before the first step.",
            (VERL_H200,),
        ),
    ]


# Earlier runs of verl's example on other hosts of one H200, with its workers' trace and
# trials of it on the same host (their ``run`` part).
EARLIER_EXAMPLE = (
    "results/verl-qwen2.5-1.5b-h200-fsdp1-example.json",
    "results/verl-qwen2.5-1.5b-h200-cut-gc.json",
)
CLOCKED = "update_actor_micro_batch_s_mean"


def _earlier(rel: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    rows = load(rel)["run"]["runs"]
    (verl,) = [r for r in rows if r["kind"] == "verl" and r["status"] == "ok"]
    return verl, [r for r in rows if r["kind"] == "trial" and r["status"] == "ok"]


def verl_h200_micro_batches() -> list[Line]:
    """verl's update micro-batches, from its workers' trace, against the trials' update per
    micro-batch on the same host; verl's example also from its other runs on other hosts,
    the latest with trials that time each micro-batch as verl's trace does."""
    runs = [(f"{c}, {_verl(c)[0]}", _verl(c)[1], _trials_beside(c)[1], VERL_H200) for c in CONFIGS]
    runs += [(f"example, `{rel}`", *_earlier(rel), rel) for rel in (*EARLIER_EXAMPLE, CLOCK)]
    rows = []
    for label, verl, trials, rel in runs:
        seconds, tokens = micro_batches(verl["trace"], len(verl["steps"]), verl.get("warmup_steps", 1))[
            "update_actor"
        ]
        mine = [
            t["phase_timings_s"]["update_actor"] / t["metrics"]["update_actor_micro_batches"] for t in trials
        ]
        clocked = [t["metrics"][CLOCKED] for t in trials if CLOCKED in t["metrics"]]
        rows.append(
            (
                [
                    label,
                    f"{statistics.median(tokens):.0f}",
                    f"{statistics.mean(seconds):.3f} / {statistics.median(seconds):.3f} (n={len(seconds)})",
                    f"{span(mine, '.3f')} (n={len(mine)})",
                    f"{span(clocked, '.3f')} (n={len(clocked)})" if clocked else "-",
                ],
                (rel,),
            )
        )
    header = [
        "config, run",
        "verl: tokens per micro-batch (median)",
        "verl: s per micro-batch, forward and backward (mean / median)",
        "trials: update s per micro-batch, all included (mean of each trial)",
        "trials: s per micro-batch timed as verl's (mean of each trial)",
    ]
    return [generated_from(VERL_H200, *EARLIER_EXAMPLE, CLOCK), Line(""), *table(header, rows)]


def verl_h200_top() -> list[Line]:
    verl, trial = _throughputs()
    same = sorted(CONFIGS, key=lambda c: -verl[c]) == sorted(CONFIGS, key=lambda c: -trial[c])
    errors = {c: 100 * (trial[c] / verl[c] - 1) for c in CONFIGS}
    return [
        Line(
            f"On 2026-11-26 the three configs ran in verl on one H200 each (two hosts; data in "
            f"`benchmarks/{VERL_H200}`): the winner is {verl['winner'] / verl['defaults']:.2f}x verl's "
            f"defaults in verl, the trials rank the three {'as verl does' if same else 'unlike verl'}, and "
            "the trials beside each verl run are off by "
            + ", ".join(f"{errors[c]:+.0f}% ({c})" for c in CONFIGS)
            + ".",
            (VERL_H200,),
        )
    ]
