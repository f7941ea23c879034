"""Parts of the READMEs on Python's collector in the hand-over before a rollout: the trials'
weight sync and engine wake beside verl's traced ``update_weights`` (``trials.verl.trace``),
the same configs on one host (``verl_compare --trace`` on ``jobs/qwen2.5-0.5b-weight-sync.yaml``)."""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.claims.data import (
    Line,
    generated_from,
    load,
    span,
    table,
    trial_timer,
    verl_median,
    verl_steps,
)
from benchmarks.claims.weight_sync import UPDATE_WEIGHTS
from benchmarks.claims.weight_sync import seconds as _s

UPDATE_WEIGHTS_GC_H200 = "results/verl-qwen2.5-0.5b-h200-update-weights-gc.json"
HAND_OVER_H100 = "results/verl-qwen2.5-0.5b-h100-hand-over.json"
CODE_AB_H100 = "results/verl-qwen2.5-0.5b-h100-code-ab.json"
# verl's step timers, as the code A/B's table shows them
AB_TIMERS = (
    ("timing_s/step", "step"),
    (UPDATE_WEIGHTS, "sync + wake (verl: update_weights)"),
    ("timing_s/gen", "gen"),
    ("timing_s/old_log_prob", "old_log_prob"),
    ("timing_s/ref", "ref"),
    ("timing_s/update_actor", "update_actor"),
)
MICRO_BATCH = "update_actor_micro_batch_s_median"


def measured_calls(verl: dict[str, Any]) -> list[dict[str, Any]]:
    """The traced ``update_weights`` of a verl run's measured steps. The worker's first call
    is verl's ``on_init_end``; step ``k``'s ``on_step_end`` makes call ``k + 1``."""
    first = verl.get("warmup_steps", 1) + 2
    last = len(verl["steps"]) + 1
    calls = [r for r in verl.get("trace") or [] if r.get("call") == "update_weights"]
    return [r for r in calls if first <= r["call_number"] <= last]


def _init_call(verl: dict[str, Any]) -> dict[str, Any]:
    return next(r for r in verl["trace"] if r.get("call") == "update_weights" and r["call_number"] == 1)


def _rows(data: dict[str, Any], rel: str) -> list[Line]:
    """A row per trial and per verl run: the hand-over's seconds, its full collections, the
    collector's seconds in it, and what one full collection costs the process."""
    trials, verls = _runs(data, "trial"), _runs(data, "verl")
    header = [
        "run",
        "hand-over s (trial: sync + wake; verl: update_weights, median)",
        "full collections in it",
        "the collector's s in it",
        "one full collection, nothing to free s",
        "heap objects",
    ]
    rows = []
    for t in trials:
        m = t["metrics"]
        rows.append(
            (
                [
                    f"trial, {t['config']} (round {t['round']})",
                    _s(trial_timer(t, UPDATE_WEIGHTS)),
                    f"{m['weight_sync_full_gcs']:.0f} + {m['engine_wake_full_gcs']:.0f}",
                    _s(m["weight_sync_gc_s"] + m["engine_wake_gc_s"]),
                    _s(m["train_gc_walk_s"]),
                    f"{m['train_heap_objects']:.0f}",
                ],
                (rel,),
            )
        )
    for v in verls:
        calls, init = measured_calls(v), _init_call(v)
        rows.append(
            (
                [
                    f"verl, {v['config']} (steps {v.get('warmup_steps', 1) + 1}-{len(v['steps'])})",
                    _s(verl_median(v, UPDATE_WEIGHTS)),
                    span([c["full_gcs"] for c in calls], ".0f"),
                    span([c["gc_s"] for c in calls], ".3f"),
                    _s(init["gc_walk_s"]),
                    f"{init['heap_objects']:.0f}",
                ],
                (rel,),
            )
        )
    return table(header, rows)


def _runs(data: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [r for r in data["runs"] if r["kind"] == kind and r["status"] == "ok"]


def _full_gcs(trial: dict[str, Any]) -> float:
    """A trial's full collections in its sync and its wake together."""
    return float(trial["metrics"]["weight_sync_full_gcs"] + trial["metrics"]["engine_wake_full_gcs"])


def _runs_done(n: int) -> str:
    return "one verl run finished" if n == 1 else f"{n} verl runs finished"


def _device_and_command(data: dict[str, Any], rel: str) -> list[Line]:
    software = _runs(data, "trial")[0]["software"]
    versions = _runs(data, "verl")[0]["versions"]
    return [
        Line(""),
        Line(
            f"Device: {software['gpu']}, driver {software['driver']}, CUDA {software['cuda']}; "
            f"torch {software['torch']}, vLLM {software['vllm']}, verl {versions['verl']} "
            f"(transformers {versions['transformers']} in verl's runs).",
            (rel,),
        ),
        Line(""),
        Line(f"Command: {data['command']}", (rel,)),
        Line(""),
        generated_from(rel),
    ]


def update_weights_gc(rel: str = UPDATE_WEIGHTS_GC_H200) -> list[Line]:
    """The hand-over when the trials still collected twice a step, beside verl 0.9.1's."""
    data = load(rel)
    trials, verls = _runs(data, "trial"), _runs(data, "verl")
    trial_full = [_full_gcs(t) for t in trials]
    trial_gc = [t["metrics"]["weight_sync_gc_s"] + t["metrics"]["engine_wake_gc_s"] for t in trials]
    share = [g / trial_timer(t, UPDATE_WEIGHTS) for g, t in zip(trial_gc, trials, strict=True)]
    verl_full = [c["full_gcs"] for v in verls for c in measured_calls(v)]
    verl_s = [verl_median(v, UPDATE_WEIGHTS) for v in verls]
    without = [trial_timer(t, UPDATE_WEIGHTS) - g for g, t in zip(trial_gc, trials, strict=True)]
    return (
        _rows(data, rel)
        + [
            Line(""),
            Line(
                f"verl's worker made {span(verl_full, '.0f')} full collections in each "
                f"of its measured `update_weights` ({len(verl_full)} calls). The trials made "
                f"{span(trial_full, '.0f')} a step, one as the sync freed its bucket "
                f"buffer and one before the KV cache woke, together {span(trial_gc, '.3f')} s, "
                f"{100 * min(share):.0f}-{100 * max(share):.0f}% of their sync and wake. Less the "
                f"collector, the trials' sync and wake took {span(without, '.3f')} s, against verl's "
                f"{span(verl_s, '.3f')} s.",
                (rel,),
            ),
        ]
        + _device_and_command(data, rel)
    )


def hand_over_after(rel: str = HAND_OVER_H100) -> list[Line]:
    """The hand-over once the trials follow verl 0.9.1 (no collection), beside verl's, and
    the steps of the same run, which it does not compare: one verl run each is no spread."""
    data = load(rel)
    trials, verls = _runs(data, "trial"), _runs(data, "verl")
    trial_full = [_full_gcs(t) for t in trials]
    verl_full = [c["full_gcs"] for v in verls for c in measured_calls(v)]
    trial_s = [trial_timer(t, UPDATE_WEIGHTS) for t in trials]
    verl_s = [verl_median(v, UPDATE_WEIGHTS) for v in verls]
    update = [trial_timer(t, "timing_s/update_actor") for t in trials]
    steps = ", ".join(f"{t['config']} {t['step_time_s']:.2f} s" for t in trials)
    verl_steps_s = ", ".join(f"{v['config']} {verl_median(v, 'timing_s/step'):.2f} s" for v in verls)
    return (
        _rows(data, rel)
        + [
            Line(""),
            Line(
                f"The trials made {span(trial_full, '.0f')} full collections in their sync and "
                f"wake ({len(trials)} trials), verl's worker {span(verl_full, '.0f')} in each of its "
                f"measured `update_weights` ({len(verl_full)} calls). The trials' sync and wake "
                f"took {span(trial_s, '.3f')} s, against verl's {span(verl_s, '.3f')} s.",
                (rel,),
            ),
            Line(""),
            Line(
                f"The step is not compared here: {_runs_done(len(verls))} before the host "
                f"was released, and on this host the trials' `update_actor` moved "
                f"{100 * (max(update) / min(update) - 1):.0f}% between two trials whose "
                f"training knobs are the same. Trials' steps: {steps}; verl's: {verl_steps_s} "
                "(medians of each run's measured steps).",
                (rel,),
            ),
        ]
        + _device_and_command(data, rel)
    )


def verl_update_micro_batch(verl: dict[str, Any]) -> float:
    """The median of verl's update micro-batches in its measured steps (its workers' trace)."""
    from trials.verl.trace import micro_batches

    seconds, _ = micro_batches(verl["trace"], len(verl["steps"]), verl.get("warmup_steps", 1))["update_actor"]
    return statistics.median(seconds)


def verl_update_host(verl: dict[str, Any]) -> tuple[list[float], float]:
    """verl's update passes in its measured steps: each micro-batch's CPU seconds in the
    worker's own thread, and the process's CPU seconds over the passes' wall seconds."""
    from trials.verl.trace import measured_passes

    passes = measured_passes(verl["trace"], len(verl["steps"]), verl.get("warmup_steps", 1))["update_actor"]
    threads = [s for r in passes for s in r["micro_batch_thread_s"]]
    return threads, sum(r["process_cpu_s"] for r in passes) / sum(r["wall_s"] for r in passes)


def _code_ab_runs(data: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The code A/B's trials and its verl run, in the order they ran."""
    runs = sorted((r for r in data["runs"] if r["status"] == "ok"), key=lambda r: r["order"])
    (verl,) = [r for r in runs if r["kind"] == "verl"]
    return [r for r in runs if r["kind"] == "trial"], verl


def _offset_pct(trials: list[dict[str, Any]], verl: dict[str, Any], key: str) -> float:
    """The trials of verl's code (their median) against the verl run on ``key``, in percent."""
    after = [trial_timer(t, key) for t in trials if t["code"] == verl["code"]]
    return 100 * (statistics.median(after) / verl_median(verl, key) - 1)


def _host_speed(data: dict[str, Any]) -> float:
    """The code A/B's host: microseconds per small op on its GPU, measured before the runs."""
    return float(data["host_speed"][0]["median_us_per_op"]["torch_cuda"])


def code_ab_offset_pct(key: str, rel: str = CODE_AB_H100) -> tuple[float, float, str]:
    """The code A/B's trials of verl's code against its verl run on ``key``, in percent; with
    the host's speed and when the runs began (UTC)."""
    data = load(rel)
    trials, verl = _code_ab_runs(data)
    return _offset_pct(trials, verl, key), _host_speed(data), data["started"][11:16]


def hand_over_code_ab(rel: str = CODE_AB_H100, earlier: str = HAND_OVER_H100) -> list[Line]:
    """Trials of the code before and after the hand-over change, interleaved on one host,
    then verl's defaults there; and the same code's trials on the earlier host."""
    data = load(rel)
    codes = data["codes"]
    trials, verl = _code_ab_runs(data)
    rows = []
    for t in trials:
        cells = [_s(trial_timer(t, key)) for key, _ in AB_TIMERS]
        rows.append(
            ([f"{t['order'] + 1}. trial", t["code"][:7], *cells, _s(t["metrics"][MICRO_BATCH])], (rel,))
        )
    steps = verl_steps(verl)
    cells = [f"{_s(verl_median(verl, key))} ({span([s[key] for s in steps], '.3f')})" for key, _ in AB_TIMERS]
    first = verl.get("warmup_steps", 1) + 1
    rows.append(
        (
            [
                f"{verl['order'] + 1}. verl's defaults, steps {first}-{len(verl['steps'])}: median (range)",
                verl["code"][:7],
                *cells,
                _s(verl_update_micro_batch(verl)),
            ],
            (rel,),
        )
    )
    header = [
        "run, in order",
        "code",
        *(f"{name} s" for _, name in AB_TIMERS),
        "update s per micro-batch (median)",
    ]
    new = verl["code"]  # verl ran beside the newest code's trials
    after = [t for t in trials if t["code"] == new]
    before = [t for t in trials if t["code"] != new]

    def figures(group: list[dict[str, Any]], key: str) -> str:
        return span([trial_timer(t, key) for t in group], ".2f")

    was = {key: figures(before, key) for key, _ in AB_TIMERS}
    now = {key: figures(after, key) for key, _ in AB_TIMERS}

    shorter = max(trial_timer(t, "timing_s/step") for t in after) < min(s["timing_s/step"] for s in steps)

    def off(key: str) -> str:
        return f"{_offset_pct(trials, verl, key):+.0f}%"

    threads, verl_cores = verl_update_host(verl)
    trial_cores = [
        t["metrics"]["update_actor_process_cpu_s"] / t["phase_timings_s"]["update_actor"] for t in after
    ]
    trial_threads = [t["metrics"]["update_actor_micro_batch_thread_s_mean"] for t in after]
    # verl's thread did more per micro-batch, and neither process waited (a core's worth busy)
    busy = statistics.mean(threads) > max(trial_threads) and min(verl_cores, *trial_cores) >= 0.9
    old = load(earlier)
    old_trials, old_verls = _runs(old, "trial"), _runs(old, "verl")
    speed = _host_speed(data)
    return (
        table(header, rows)
        + [
            Line(""),
            Line(
                "Codes: "
                + "; ".join(f"{sha[:7]}: {label}" for sha, label in codes.items())
                + f". Before the change ({len(before)} trials) and after it ({len(after)}), the "
                f"train sub-phases took the same: `update_actor` {was['timing_s/update_actor']} s "
                f"against {now['timing_s/update_actor']} s, `ref` {was['timing_s/ref']} s against "
                f"{now['timing_s/ref']} s. The step went from {was['timing_s/step']} s to "
                f"{now['timing_s/step']} s, the sync and wake from {was[UPDATE_WEIGHTS]} s to "
                f"{now[UPDATE_WEIGHTS]} s.",
                (rel,),
            ),
            Line(""),
            Line(
                f"Against verl's defaults on the same host (one run), the {len(after)} trials of "
                f"{new[:7]} (median) are off by {off('timing_s/step')} on the step: `update_actor` "
                f"{off('timing_s/update_actor')}, `ref` {off('timing_s/ref')}, `old_log_prob` "
                f"{off('timing_s/old_log_prob')}, `gen` {off('timing_s/gen')}. verl's measured steps "
                f"ranged {span([s['timing_s/step'] for s in steps], '.2f')} s, the trials' "
                f"{now['timing_s/step']} s"
                + (": the trials' step is shorter than any of verl's." if shorter else ", overlapping."),
                (rel,),
            ),
            Line(""),
            Line(
                f"Per update micro-batch, verl's worker thread spent {_s(statistics.mean(threads))} s "
                f"of CPU (mean; median {_s(statistics.median(threads))} s), the trials' "
                f"{span(trial_threads, '.3f')} s "
                f"(each trial's mean). Over the update, verl's process used {verl_cores:.2f} s of CPU a "
                f"second, the trials' {span(trial_cores, '.2f')}"
                + (
                    ": both ran one core's worth, busy rather than waiting, so verl's longer "
                    "update is host work of its own."
                    if busy
                    else "."
                ),
                (rel,),
            ),
            Line(""),
            Line(
                f"The H100 of 01:55-02:09 UTC (`{earlier}`) ran the same trial code (no file under `trials/` "
                f"or `autotuner/` differs) at {span([t['step_time_s'] for t in old_trials], '.2f')} s a "
                f"step and {span([t['metrics'][MICRO_BATCH] for t in old_trials], '.3f')} s per update "
                f"micro-batch, against {now['timing_s/step']} s and "
                f"{span([t['metrics'][MICRO_BATCH] for t in after], '.3f')} s here; verl's defaults took "
                f"{_s(verl_median(old_verls[0], 'timing_s/step'))} s a step and "
                f"{_s(verl_update_micro_batch(old_verls[0]))} s per update micro-batch there, "
                f"{_s(verl_median(verl, 'timing_s/step'))} s and {_s(verl_update_micro_batch(verl))} s "
                f"here. That host's speed was not measured. This "
                f"host drove the GPU at {speed:.2f} us per small op (`benchmarks/gpu/host_speed.py`, "
                "measured before the runs).",
                (rel, earlier),
            ),
        ]
        + _device_and_command(data, rel)
    )
