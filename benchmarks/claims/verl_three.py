"""Parts of the READMEs from verl's defaults, example and the winner run in verl on one host,
beside the trials of the same configs (``benchmarks/gpu/verl-lanes.sh``)."""

from __future__ import annotations

import statistics
from typing import Any

from autotuner.noise import Verdict, compare, spread_pct
from benchmarks.claims.data import Line, error_pct, generated_from, load, span, table
from benchmarks.claims.verl_trace import cut_medians
from trials.step import VERL_REPLAY_POLL_S, as_verl_timers, replay_poll_wait_s
from trials.verl.cut import PHASES as CUT_PHASES

VERL_THREE = "results/verl-qwen2.5-1.5b-h100x2-three.json"
CONFIGS = ("defaults", "example", "winner")
# verl's step timers the table sets beside the trial's, by the trial's name for them.
# (gen: the trial's rollout, the poll and the engine's sleep, ``trials.step.VERL_TIMERS``)
TIMERS = {
    "gen": "timing_s/gen",
    "old_log_prob": "timing_s/old_log_prob",
    "ref_log_prob": "timing_s/ref",
    "update_actor": "timing_s/update_actor",
}


def _run(kind: str, config: str) -> dict[str, Any]:
    return next(r for r in load(VERL_THREE)["run"]["runs"] if r["kind"] == kind and r["config"] == config)


def _steps(verl: dict[str, Any]) -> list[dict[str, float]]:
    return verl["steps"][verl.get("warmup_steps", 1) :]


def _verl_median(verl: dict[str, Any], key: str) -> float:
    return statistics.median(s[key] for s in _steps(verl))


def _with_poll(trial: dict[str, Any]) -> float:
    """The trial's throughput with verl's replay-buffer poll added to its step (the trials of
    this run were recorded before ``rollout_poll`` was a part of the step)."""
    t = trial["phase_timings_s"]
    if "rollout_poll" in t:
        return float(trial["throughput"])
    step = trial["step_time_s"]
    return float(trial["throughput"]) * step / (step + replay_poll_wait_s(t["rollout"]))


def verl_three() -> list[Line]:
    """Per config: the trial's step throughput (as recorded, and with verl's poll), verl's
    median over its measured steps, and the phases as verl's timers time them."""
    header = [
        "config",
        "trial tok/s/GPU",
        "with verl's poll",
        "verl tok/s/GPU (median of steps)",
        "trial error (with poll)",
    ]
    header += [f"{name} s, trial / verl" for name in TIMERS]
    rows = []
    for config in CONFIGS:
        trial, verl = _run("trial", config), _run("verl", config)
        throughputs = [s["perf/throughput"] for s in _steps(verl)]
        measured = statistics.median(throughputs)
        polled = _with_poll(trial)
        status = "" if verl["status"] == "ok" else f", {verl['status']} run"
        cells = [
            config,
            f"{trial['throughput']:.0f}",
            f"{polled:.0f}",
            f"{measured:.0f} (n={len(throughputs)}, spread {spread_pct(throughputs) or 0:.1f}%{status})",
            f"{error_pct(trial['throughput'], measured, 0)} ({error_pct(polled, measured, 0)})",
        ]
        predicted = as_verl_timers(trial["phase_timings_s"])
        for key in TIMERS.values():
            t, v = predicted[key], _verl_median(verl, key)
            cells.append(f"{t:.1f} / {v:.1f} ({error_pct(t, v, 0)})")
        rows.append((cells, (VERL_THREE,)))
    return [generated_from(VERL_THREE), Line(""), *table(header, rows)]


def _throughputs() -> tuple[dict[str, float], dict[str, float]]:
    """Per config: verl's median step throughput, and the trial's with verl's poll."""
    verl = {c: _verl_median(_run("verl", c), "perf/throughput") for c in CONFIGS}
    return verl, {c: _with_poll(_run("trial", c)) for c in CONFIGS}


def verl_three_headline() -> list[Line]:
    verl, trial = _throughputs()
    recorded = {c: _run("trial", c)["throughput"] for c in CONFIGS}
    spreads = {c: spread_pct([s["perf/throughput"] for s in _steps(_run("verl", c))]) or 0.0 for c in CONFIGS}
    verl_order = sorted(CONFIGS, key=lambda c: -verl[c])
    trial_order = sorted(CONFIGS, key=lambda c: -trial[c])
    winner_gap = 100 * (verl["winner"] / verl["example"] - 1)
    band = max(spreads["winner"], spreads["example"])
    worst = max(CONFIGS, key=lambda c: abs(trial[c] / verl[c] - 1))
    cut_lines = []
    for c in CONFIGS:
        timed = sum(_run("trial", c)["metrics"][f"{p}_verl_cut_s"] for p in CUT_PHASES)
        in_verl = sum(median for median, _, _ in cut_medians(_run("verl", c)).values())
        cut_lines.append(f"{c} {timed:.1f} against {in_verl:.1f}")
    gens = sorted(s["timing_s/gen"] for c in CONFIGS for s in _run("verl", c)["steps"])
    ended = [r for c in CONFIGS if (r := _run("verl", c))["status"] == "ok"]
    verdict = compare(verl["winner"], verl["example"], band)
    over = all(recorded[c] > verl[c] and trial[c] > verl[c] for c in CONFIGS)
    past_poll = [g % VERL_REPLAY_POLL_S for g in gens]
    polled = max(past_poll) < 0.25 * VERL_REPLAY_POLL_S
    word = "a tie" if verdict is Verdict.TIE else f"{verdict} beyond it"
    return [
        Line(
            f"In verl, on one host: the winner {verl['winner']:.0f}, verl's example "
            f"{verl['example']:.0f} and verl's defaults {verl['defaults']:.0f} tokens/s/GPU (medians of "
            f"the steps after the warm-up). The winner is {verl['winner'] / verl['defaults']:.2f}x verl's "
            f"defaults and {winner_gap:+.0f}% against the example, against the {band:.0f}% step-to-step "
            f"spread of those two: {word}.",
            (VERL_THREE,),
        ),
        Line(""),
        Line(
            f"The trials rank the configs {', '.join(trial_order)}; verl ranks them {', '.join(verl_order)} "
            f"({'the same order' if trial_order == verl_order else 'not the same order'}). "
            + ("Every trial predicts more than verl measured: " if over else "The trials' errors: ")
            + ", ".join(
                f"{c} {error_pct(recorded[c], verl[c], 0)} "
                f"({error_pct(trial[c], verl[c], 0)} with verl's poll)"
                for c in CONFIGS
            )
            + f". The worst is {worst}.",
            (VERL_THREE,),
        ),
        Line(""),
        Line(
            f"Targets: the winner at least 1.2x verl's defaults in verl: "
            f"{'met' if verl['winner'] >= 1.2 * verl['defaults'] else 'missed'}; the same ranking: "
            f"{'met' if trial_order == verl_order else 'missed'}; every config's error within 10%: "
            f"{sum(abs(trial[c] / verl[c] - 1) <= 0.10 for c in CONFIGS)} of {len(CONFIGS)} with verl's poll "
            f"counted, {sum(abs(recorded[c] / verl[c] - 1) <= 0.10 for c in CONFIGS)} as recorded.",
            (VERL_THREE,),
        ),
        Line(""),
        Line(
            f"verl's runs that ended took {span([r['wall_s'] / 60 for r in ended], '.1f')} minutes each, "
            f"{span([r['startup_s'] / 60 for r in ended], '.1f')} of them before the first step "
            f"({' and '.join(r['config'] for r in ended)}); the first step, a warm-up, took "
            f"{span([r['steps'][0]['timing_s/step'] / 60 for r in ended], '.1f')} more.",
            (VERL_THREE,),
        ),
        Line(""),
        Line(
            "verl's cut into micro-batches, timed by each trial on the host against the median in verl's "
            "workers (seconds over the step): " + "; ".join(cut_lines) + ".",
            (VERL_THREE,),
        ),
        Line(""),
        Line(
            f"verl's gen in the {len(gens)} steps of these runs took "
            f"{', '.join(f'{g:.2f}' for g in gens)} s: "
            + (
                f"each {min(past_poll):.2f}-{max(past_poll):.2f} s past a multiple of the "
                f"{VERL_REPLAY_POLL_S:.0f} s poll of verl's replay buffer."
                if polled
                else f"not all near a multiple of the replay buffer's {VERL_REPLAY_POLL_S:.0f} s poll."
            ),
            (VERL_THREE,),
        ),
    ]


def verl_three_top() -> list[Line]:
    verl, trial = _throughputs()
    same = sorted(CONFIGS, key=lambda c: -verl[c]) == sorted(CONFIGS, key=lambda c: -trial[c])
    errors = [abs(trial[c] / verl[c] - 1) * 100 for c in CONFIGS]
    return [
        Line(
            f"On 2026-11-25 the three configs ran in verl on one host (two H100s, `verl-lanes.sh`; data in "
            f"`benchmarks/{VERL_THREE}`): the winner is {verl['winner'] / verl['defaults']:.2f}x verl's "
            f"defaults in verl, the trials rank the three {'as verl does' if same else 'unlike verl'}, and "
            f"they over-predict by {min(errors):.0f}-{max(errors):.0f}% (verl's replay-buffer poll counted).",
            (VERL_THREE,),
        )
    ]
