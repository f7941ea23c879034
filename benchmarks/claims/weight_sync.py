"""Parts of the READMEs on the hand-over before a rollout (``jobs/qwen2.5-0.5b-weight-sync.yaml``):
each trial's weight syncs (the cold first and the timed second) and its engine wake, part by
part, beside verl's ``update_weights`` for the same configs on the same kind of host, which
covers both (``trials.step.VERL_TIMERS``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks.claims.data import Line, generated_from, job_of, load, table, trial_timer, verl_median
from benchmarks.claims.verify import GPU_VERIFY_SAME_BATCH

WEIGHT_SYNC_H100 = "results/gpu-weight-sync-qwen2.5-0.5b-h100.json"
WEIGHT_SYNC_H100_GC = "results/gpu-weight-sync-qwen2.5-0.5b-h100-gc.json"
UPDATE_WEIGHTS = "timing_s/update_weights"
BUCKET = "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes"


def _verl_update_weights(rel: str) -> dict[str, list[float]]:
    """verl's ``update_weights`` (the median of each run's measured steps) by the baseline
    name of the trial whose config the run ran, from the verification dump ``rel``."""
    trials = {t["number"]: t for t in job_of(rel)["trials"]}
    out: dict[str, list[float]] = {}
    for run in job_of(rel).get("verl_runs") or []:
        name = trials[run["trial"]]["baseline"]
        if name and run["status"] == "ok":
            out.setdefault(name, []).append(verl_median(run, UPDATE_WEIGHTS))
    return out


def seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def _parts(m: dict[str, Any], *keys: str) -> str:
    return " / ".join(seconds(m.get(k)) for k in keys)


def weight_sync(rel: str, verl_rel: str = GPU_VERIFY_SAME_BATCH) -> Callable[[], list[Line]]:
    """One row per measured trial of the dump ``rel``; then the cold sync against the timed
    one, the release's share of both, and verl's ``update_weights`` from ``verl_rel``."""

    def build() -> list[Line]:
        trials = [t for t in job_of(rel)["trials"] if "weight_sync_first_s" in t["metrics"]]
        verl = _verl_update_weights(verl_rel)
        collected = all("weight_sync_gc_s" in t["metrics"] for t in trials)
        rows = []
        for t in trials:
            m = t["metrics"]
            sync_wake = trial_timer(t, UPDATE_WEIGHTS)  # as verl's timer covers the trial's parts
            verl_s = verl.get(t["baseline"] or "")
            cells = [
                f"{t['number']} ({t['baseline'] or 'searched'})",
                f"{m['weight_sync_buckets']:.0f} x {t['config'][BUCKET]} MB",
                seconds(m["weight_sync_first_s"]),
                seconds(m["weight_sync_s"]),
                _parts(m, "weight_sync_pack_s", "weight_sync_load_s", "weight_sync_release_s"),
                seconds(m["engine_wake_s"]),
                _parts(m, "engine_wake_weights_s", "engine_wake_release_s", "engine_wake_kv_cache_s"),
            ]
            if collected:
                cells.append(_parts(m, "weight_sync_gc_s", "engine_wake_gc_s"))
            cells += [seconds(sync_wake), ", ".join(seconds(v) for v in verl_s) if verl_s else ""]
            sources = [f"{rel}#{t['number']}"] + ([verl_rel] if verl_s else [])
            rows.append((cells, tuple(sources)))
        header = [
            "trial (config)",
            "buckets",
            "first sync s",
            "timed sync s",
            "of it: pack / engine load / release s",
            "engine wake s",
            "of it: weights / release / KV cache s",
        ]
        if collected:
            header.append("Python's collector in sync / wake s")
        header += ["trial: sync + wake s", "verl's update_weights s"]
        first = [t["metrics"]["weight_sync_first_s"] / t["metrics"]["weight_sync_s"] - 1 for t in trials]
        released = [
            (t["metrics"]["weight_sync_release_s"] + t["metrics"]["engine_wake_release_s"])
            / trial_timer(t, UPDATE_WEIGHTS)
            for t in trials
        ]
        if collected:
            collector = [
                (t["metrics"]["weight_sync_gc_s"] + t["metrics"]["engine_wake_gc_s"])
                / (t["metrics"]["weight_sync_release_s"] + t["metrics"]["engine_wake_release_s"])
                for t in trials
            ]
            released_line = [
                Line(""),
                Line(
                    f"Of the releases, Python's collector took {100 * min(collector):.0f}-"
                    f"{100 * max(collector):.0f}%; emptying the CUDA cache took the rest.",
                    sources,
                ),
            ]
        else:
            released_line = []
        verl_all = [v for values in verl.values() for v in values]
        software = trials[0]["software"]
        sources = tuple(f"{rel}#{t['number']}" for t in trials)
        lines = table(header, rows) + [
            Line(""),
            Line(
                f"The cold first sync took {100 * min(first):+.0f}% to {100 * max(first):+.0f}% against "
                f"the timed second ({len(trials)} trials). Releasing memory (the bucket buffer "
                "after the sync; the actor's cache before the KV cache wakes: Python's collector and "
                f"the CUDA cache emptied) took {100 * min(released):.0f}-{100 * max(released):.0f}% of "
                "the trial's sync and wake together.",
                sources,
            ),
            *released_line,
        ]
        if verl_all:
            lines += [
                Line(""),
                Line(
                    f"verl's whole `update_weights` (weights woken, synced, KV cache woken) took "
                    f"{min(verl_all):.3f}-{max(verl_all):.3f} s for the same configs on the same kind "
                    f"of host (`{verl_rel}`, medians of each run's measured steps).",
                    (verl_rel,),
                ),
            ]
        return lines + [
            Line(""),
            Line(
                f"Device: {software['gpu']}, driver {software['driver']}, CUDA {software['cuda']}; "
                f"torch {software['torch']}, vLLM {software['vllm']}.",
                (rel,),
            ),
            Line(""),
            Line(f"Command: {load(rel)['command']}", (rel,)),
            Line(""),
            generated_from(rel, verl_rel) if verl_all else generated_from(rel),
        ]

    return build
