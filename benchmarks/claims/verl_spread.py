"""Part of benchmarks/README.md on verl's own noise: verl's defaults run after one another on
one H100 (``verl_compare --skip-trial defaults --rounds N`` on
``jobs/qwen2.5-0.5b-weight-sync.yaml``), set against the trials' offset from verl measured on
another H100 (``update_weights_gc.hand_over_code_ab``)."""

from __future__ import annotations

import statistics
from typing import Any

from autotuner.noise import Verdict, compare, spread_pct
from benchmarks.claims.data import (
    Line,
    generated_from,
    load,
    span,
    table,
    times,
    trial_timer,
    verl_median,
    verl_steps,
)
from benchmarks.claims.update_weights_gc import (
    AB_TIMERS,
    CODE_AB_H100,
    MICRO_BATCH,
    code_ab_offset_pct,
    verl_update_host,
    verl_update_micro_batch,
)
from benchmarks.claims.weight_sync import seconds as _s

VERL_SPREAD_H100 = "results/verl-qwen2.5-0.5b-h100-verl-spread.json"
STEP = "timing_s/step"
THREAD = "update_actor_micro_batch_thread_s_mean"  # a trial's CPU per update micro-batch, main thread


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


VERL_INTERLEAVED_H100 = "results/verl-qwen2.5-0.5b-h100-verl-interleaved.json"


def _update_cpu(verl: dict[str, Any]) -> float:
    """CPU seconds of verl's worker thread per update micro-batch (mean over its measured steps)."""
    threads, _ = verl_update_host(verl)
    return statistics.mean(threads)


def _speeds(data: dict[str, Any]) -> str:
    """The host's speed before the first run and after the last, as measured."""
    said = [
        f"{speed:.2f} us per small op {when}"
        for key, when in (("start", "before the first run"), ("end", "after the last"))
        if (speed := _speed(data, key)) is not None
    ]
    return (
        f" The host drove its GPU at {' and '.join(said)} (`benchmarks/gpu/host_speed.py`)." if said else ""
    )


def verl_interleaved(rel: str = VERL_INTERLEAVED_H100) -> list[Line]:
    """The trial and verl's defaults of one config, round after round on one host (``verl_compare
    --rounds N`` without ``--skip-trial``): each run's step and phases, both sides' run-to-run
    spreads, and whether the trials' step ties verl's inside them."""
    data = load(rel)
    ok = sorted(
        (r for r in data["runs"] if r["status"] == "ok"), key=lambda r: (r["round"], r["kind"] != "trial")
    )
    trials = [r for r in ok if r["kind"] == "trial"]
    verls = [r for r in ok if r["kind"] == "verl"]
    rows = []
    for run in ok:
        if run["kind"] == "trial":
            cells = [_s(trial_timer(run, key)) for key, _ in AB_TIMERS]
            extra = [_s(run["metrics"][MICRO_BATCH]), _s(run["metrics"][THREAD])]
            name = f"{run['round'] + 1}. trial"
        else:
            steps = verl_steps(run)
            cells = [
                f"{_s(verl_median(run, key))} ({span([s[key] for s in steps], '.3f')})"
                for key, _ in AB_TIMERS
            ]
            extra = [_s(verl_update_micro_batch(run)), _s(_update_cpu(run))]
            first = run.get("warmup_steps", 1) + 1
            name = f"{run['round'] + 1}. verl's defaults, steps {first}-{len(run['steps'])}: median (range)"
        rows.append(([name, *cells, *extra], (rel,)))
    header = [
        "round, run",
        *(f"{name} s" for _, name in AB_TIMERS),
        "update s per micro-batch (median)",
        "update CPU s per micro-batch, main thread (mean)",
    ]
    lines = table(header, rows) + [Line("")]
    trial_steps = [trial_timer(t, STEP) for t in trials]
    verl_steps_ = [verl_median(v, STEP) for v in verls]
    if not trial_steps or not verl_steps_:
        return lines + [
            Line("No round finished both a trial and a verl run.", (rel,)),
            Line(""),
            generated_from(rel),
        ]
    trial_mid, verl_mid = statistics.median(trial_steps), statistics.median(verl_steps_)
    trial_spread, verl_spread_ = spread_pct(trial_steps), spread_pct(verl_steps_)
    offset = 100 * (trial_mid / verl_mid - 1)
    if trial_spread is None or verl_spread_ is None:
        verdict = "one run on a side gives no run-to-run spread: no claim"
    else:
        band = max(trial_spread, verl_spread_)
        # step times: the shorter step is the faster
        word = {Verdict.TIE: "a tie", Verdict.FASTER: "longer", Verdict.SLOWER: "shorter"}[
            compare(trial_mid, verl_mid, band)
        ]
        where = "inside" if word == "a tie" else "outside"
        verdict = f"{where} the larger of the two sides' run-to-run spreads ({band:.0f}%): " + (
            word if word == "a tie" else f"the trials' step is {word}"
        )
    within = [spread_pct([s[STEP] for s in verl_steps(v)]) or 0.0 for v in verls]
    every_verl = [s[STEP] for v in verls for s in verl_steps(v)]
    lines += [
        Line(
            f"In {len(trials)} rounds on one host, trial then verl, the trials' steps took "
            f"{', '.join(_s(s) for s in trial_steps)} s"
            + (f" ({trial_spread:.0f}% apart)" if trial_spread is not None else "")
            + f" and verl's runs' median steps {', '.join(_s(s) for s in verl_steps_)} s"
            + (f" ({verl_spread_:.0f}% apart)" if verl_spread_ is not None else "")
            + f"; within a verl run the measured steps spread {', '.join(f'{w:.0f}%' for w in within)}. "
            f"The trials' median step, {_s(trial_mid)} s, is {offset:+.0f}% off verl's median run "
            f"({_s(verl_mid)} s), {verdict}.",
            (rel,),
        ),
    ]
    later = trials[1:]
    if len(later) >= 2:
        slower = [
            name
            for key, name in AB_TIMERS
            if trial_timer(trials[0], key) > max(trial_timer(t, key) for t in later)
        ]
        later_steps = [trial_timer(t, STEP) for t in later]
        below = max(later_steps) < min(every_verl)
        lines += [
            Line(""),
            Line(
                f"The first trial, the first the host ran (after its speed probe), was longer than the "
                f"{len(later)} later ones in {len(slower)} of the {len(AB_TIMERS)} timers"
                + (f" ({', '.join(slower)})" if slower else "")
                + f"; it took {_s(trial_steps[0])} s a step against their {span(later_steps, '.2f')} s. "
                f"verl's measured steps ranged {span(every_verl, '.2f')} s"
                + (
                    ": the later trials' steps are each shorter than every one of verl's."
                    if below
                    else ", overlapping the later trials'."
                ),
                (rel,),
            ),
        ]
    trial_threads = [t["metrics"][THREAD] for t in trials]
    verl_threads = [_update_cpu(v) for v in verls]
    lines += [
        Line(""),
        Line(
            f"Per update micro-batch, verl's worker thread spent {span(verl_threads, '.3f')} s of CPU "
            f"(each run's mean), the trials' {span(trial_threads, '.3f')} s"
            + (
                ": verl's thread did more host work per micro-batch in every run."
                if min(verl_threads) > max(trial_threads)
                else "."
            )
            + _speeds(data),
            (rel,),
        ),
    ]
    versions = verls[0]["versions"]
    software = trials[0]["software"]
    return lines + [
        Line(""),
        Line(
            f"Device: {software['gpu']}, driver {software['driver']}, CUDA {software['cuda']}; torch "
            f"{versions['torch']}, vLLM {versions['vllm']}, verl {versions['verl']} (transformers "
            f"{versions['transformers']} in verl's runs, {software['transformers']} in the trials').",
            (rel,),
        ),
        Line(""),
        Line(f"Command: {data['command']}", (rel,)),
        Line(""),
        generated_from(rel),
    ]
