"""Parts of benchmarks/README.md from verl's example run in verl with its workers traced,
Python's garbage collector counted in verl's cut into micro-batches
(``trials.verl.gcclock``), beside the trials' timed cut of the same config: two trials that
cut a batch built as verl's legacy trainer holds it, one that cuts it as verl's worker holds
it (``trials.verl.cut.worker_batch``)."""

from __future__ import annotations

import statistics
from typing import Any

from autotuner.noise import spread_pct
from benchmarks.claims.data import Line, generated_from, load, span, table

CUT_GC = "results/verl-qwen2.5-1.5b-h200-cut-gc.json"
PHASES = ("old_log_prob", "ref_log_prob", "update_actor")


def _runs(part: str, kind: str) -> list[dict[str, Any]]:
    return [r for r in load(CUT_GC)[part]["runs"] if r["kind"] == kind and r["status"] == "ok"]


def verl_steps() -> list[dict[str, list[dict[str, Any]]]]:
    """Per step of verl's run (its warm-up first), its workers' passes by phase: one for each
    log-prob pass, one per mini-batch for the update."""
    (verl,) = _runs("run", "verl")
    passes = [p for p in verl["trace"] if p.get("call") == "forward_backward_batch"]
    forward = [p for p in passes if p["forward_only"]]
    updates = [p for p in passes if not p["forward_only"]]
    count = len(forward) // 2  # an old-log-prob and a reference pass per step
    per_step = len(updates) // count
    return [
        {
            "old_log_prob": [p for p in forward[2 * step : 2 * step + 2] if p["role"] == "actor"],
            "ref_log_prob": [p for p in forward[2 * step : 2 * step + 2] if p["role"] == "ref"],
            "update_actor": updates[per_step * step : per_step * (step + 1)],
        }
        for step in range(count)
    ]


def verl_cuts() -> dict[str, list[dict[str, float]]]:
    """Per phase, per measured step of verl's run: its workers' cut into micro-batches
    (``prepare_s``; the update: summed over its mini-batches), the collector's seconds and
    collections of the whole heap in it."""
    (verl,) = _runs("run", "verl")
    out: dict[str, list[dict[str, float]]] = {phase: [] for phase in PHASES}
    for groups in verl_steps()[verl.get("warmup_steps", 1) :]:
        for phase, group in groups.items():
            out[phase].append(
                {
                    "wall_s": sum(p["prepare_s"] for p in group),
                    "gc_s": sum(p["prepare_gc_s"] for p in group),
                    "full_gcs": sum(p["prepare_full_gcs"] for p in group),
                }
            )
    return out


def cut_gc() -> list[Line]:
    """Per phase: verl's cut in its worker (median of the measured steps and range), the
    collector's share and full collections in it, against each trial's timed cut (the mean
    of its cuts) and the collector's share in that."""
    cuts = verl_cuts()
    before, after = _runs("run", "trial"), _runs("after", "trial")
    rows = []
    for phase in PHASES:
        steps = cuts[phase]
        walls = [s["wall_s"] for s in steps]

        def trial_cells(trials: list[dict[str, Any]], phase: str = phase) -> list[str]:
            return [
                span([t["metrics"][f"{phase}_verl_cut_s"] for t in trials], ".2f"),
                span([t["metrics"][f"verl_cut_{phase}_gc_s"] for t in trials], ".2f"),
            ]

        rows.append(
            (
                [
                    phase,
                    f"{statistics.median(walls):.2f} ({span(walls, '.2f')})",
                    span([s["gc_s"] for s in steps], ".2f"),
                    span([s["full_gcs"] for s in steps], ".0f"),
                    *trial_cells(before),
                    *trial_cells(after),
                ],
                (CUT_GC,),
            )
        )
    header = [
        "phase",
        "verl's cut s (median, least-most)",
        "of it the collector s",
        "full collections",
        f"trials' cut, legacy batch s ({len(before)} trials)",
        "of it the collector s",
        f"trial's cut, verl's worker batch s (another host, {len(after)} trial)",
        "of it the collector s",
    ]
    return [generated_from(CUT_GC), Line(""), *table(header, rows)]


def cut_gc_headline() -> list[Line]:
    """The heaps, the share of verl's cut that is not the collector's against the trials',
    and the step throughputs with their errors."""
    cuts = verl_cuts()
    (verl,) = _runs("run", "verl")
    before, after = _runs("run", "trial"), _runs("after", "trial")
    [worker_heap] = {p["heap_objects"] for p in verl["trace"] if "heap_objects" in p}
    nested = [len(p["data_keys"]["nested"]) for p in verl["trace"] if "data_keys" in p]
    trial_own = [
        m["old_log_prob_verl_cut_s"] - m["verl_cut_old_log_prob_gc_s"] for m in (t["metrics"] for t in before)
    ]
    own = [
        statistics.median(s["wall_s"] - s["gc_s"] for s in cuts["old_log_prob"]),
        statistics.median(trial_own),
    ]
    measured = [s["perf/throughput"] for s in verl["steps"][verl.get("warmup_steps", 1) :]]
    m = statistics.median(measured)

    def err(trials: list[dict[str, Any]]) -> str:
        return ", ".join(f"{t['throughput']:.0f} ({100 * (t['throughput'] / m - 1):+.0f}%)" for t in trials)

    tokens = before[0]["metrics"]["train_tokens"]
    steps = verl_steps()
    step = next(i for i, g in enumerate(steps) if sum(g["old_log_prob"][0]["micro_batch_tokens"]) == tokens)
    counts = {phase: sum(p["micro_batches"] for p in group) for phase, group in steps[step].items()}
    trial_counts = {
        before[0]["metrics"][f"{phase}_micro_batches"] for phase in ("old_log_prob", "ref_log_prob")
    }
    return [
        Line(
            f"On the step whose sequences the trials drew (verl's step {step + 1}"
            f"{', its warm-up' if step < verl.get('warmup_steps', 1) else ''}, {tokens:.0f} "
            f"tokens), verl cut each log-prob pass into "
            f"{span([float(counts['old_log_prob']), float(counts['ref_log_prob'])], '.0f')} "
            f"micro-batches and the update into {counts['update_actor']}; the trials' own plan made "
            f"{span(sorted(trial_counts), '.0f')} and "
            f"{before[0]['metrics']['update_actor_micro_batches']:.0f}.",
            (CUT_GC,),
        ),
        Line(""),
        Line(
            f"verl's worker held {worker_heap / 1e6:.2f} million objects, the trials' cut process "
            f"{span([t['metrics']['verl_cut_heap_objects'] / 1e6 for t in before], '.2f')} million: a "
            f"full collection cost more in verl's worker, and landed in fewer of its cuts. Without the "
            f"collector, verl's cut before the old-log-prob pass took {own[0]:.2f} s (median of its "
            f"measured steps), the trials' {own[1]:.2f} s: verl's cut did more work, because verl's "
            f"worker batch holds its per-sequence entries as nested tensors ({span(nested, 'd')} of "
            f"them by the pass, none dense), which its cut unbinds and rebuilds for every "
            f"micro-batch, where the legacy batch held two (input_ids, position_ids).",
            (CUT_GC,),
        ),
        Line(""),
        Line(
            f"verl measured {m:.0f} tokens/s/GPU (median of {len(measured)} steps, spread "
            f"{spread_pct(measured) or 0:.1f}%). The trials with the legacy batch, on the same "
            f"host, predicted {err(before)}; the trial with verl's worker batch, on another host, "
            f"{err(after)}.",
            (CUT_GC,),
        ),
    ]
