"""Parts of the READMEs on Python's collector in the hand-over before a rollout: the trials'
weight sync and engine wake beside verl's traced ``update_weights`` (``trials.verl.trace``),
the same configs on one host (``verl_compare --trace`` on ``jobs/qwen2.5-0.5b-weight-sync.yaml``)."""

from __future__ import annotations

from typing import Any

from benchmarks.claims.data import Line, generated_from, load, table, trial_timer, verl_median
from benchmarks.claims.weight_sync import UPDATE_WEIGHTS
from benchmarks.claims.weight_sync import seconds as _s

UPDATE_WEIGHTS_GC_H200 = "results/verl-qwen2.5-0.5b-h200-update-weights-gc.json"
HAND_OVER_H100 = "results/verl-qwen2.5-0.5b-h100-hand-over.json"


def _span(values: list[float], digits: int = 3) -> str:
    low, high = (f"{v:.{digits}f}" for v in (min(values), max(values)))
    return low if low == high else f"{low}-{high}"


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
                    _span([c["full_gcs"] for c in calls], 0),
                    _span([c["gc_s"] for c in calls]),
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
                f"verl's worker made {_span(verl_full, 0)} full collections in each "
                f"of its measured `update_weights` ({len(verl_full)} calls). The trials made "
                f"{_span(trial_full, 0)} a step, one as the sync freed its bucket "
                f"buffer and one before the KV cache woke, together {_span(trial_gc)} s, "
                f"{100 * min(share):.0f}-{100 * max(share):.0f}% of their sync and wake. Less the "
                f"collector, the trials' sync and wake took {_span(without)} s, against verl's "
                f"{_span(verl_s)} s.",
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
                f"The trials made {_span(trial_full, 0)} full collections in their sync and "
                f"wake ({len(trials)} trials), verl's worker {_span(verl_full, 0)} in each of its "
                f"measured `update_weights` ({len(verl_full)} calls). The trials' sync and wake "
                f"took {_span(trial_s)} s, against verl's {_span(verl_s)} s.",
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
