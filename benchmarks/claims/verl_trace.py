"""Parts of benchmarks/README.md from a traced verl run and verl's cut into micro-batches."""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.claims.data import Line, f1, generated_from, load, table
from benchmarks.gpu.verl_trace import rows as trace_rows

VERL_TRACE = "results/verl-qwen2.5-1.5b-h100-trace.json"
VERL_BATCHING = "results/verl-batching-cpu.json"
# The trace's phases and the trial's names for them.
PHASES = {"old_log_prob": "old_log_prob", "ref": "ref_log_prob", "update_actor": "update_actor"}


def _runs(kind: str) -> list[dict[str, Any]]:
    return [r for r in load(VERL_TRACE)["run"]["runs"] if r["kind"] == kind and r["status"] == "ok"]


def _traced() -> tuple[dict[str, Any], dict[str, Any]]:
    """The traced verl run and the trial of the same config."""
    verl = next(r for r in _runs("verl") if r.get("trace"))
    trial = next(r for r in _runs("trial") if r["config"] == verl["config"])
    return verl, trial


def _medians(verl: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per phase, the median over the measured steps of each traced figure."""
    warmup = verl.get("warmup_steps", 1)
    measured = [r for r in trace_rows(verl) if r["step"] > warmup]
    keys = ("verl_s", "worker_s", "prepare_s", "micro_batches_s", "micro_batches")
    return {
        phase: {k: statistics.median(r[k] for r in measured if r["phase"] == phase) for k in keys}
        for phase in PHASES
    }


def verl_trace() -> list[Line]:
    """The table: verl's phases as its driver and its worker timed them, against the trial."""
    verl, trial = _traced()
    med = _medians(verl)
    header = [
        "phase",
        "verl (driver) s",
        "verl worker s",
        "of it, cutting into micro-batches s",
        "micro-batches' GPU s",
        "micro-batches",
        "trial s",
    ]
    rows = []
    for phase, name in PHASES.items():
        m = med[phase]
        cells = [phase, f"{m['verl_s']:.2f}", f"{m['worker_s']:.2f}", f"{m['prepare_s']:.2f}"]
        cells += [
            f"{m['micro_batches_s']:.2f}",
            f"{m['micro_batches']:.0f}",
            f"{trial['phase_timings_s'][name]:.2f}",
        ]
        rows.append((cells, (VERL_TRACE,)))
    gen = verl["measured"]["timing_s/gen"]
    rows.append(
        (
            ["gen (rollout)", f"{gen:.2f}", "", "", "", "", f"{trial['phase_timings_s']['rollout']:.2f}"],
            (VERL_TRACE,),
        )
    )
    return [generated_from(VERL_TRACE), Line(""), *table(header, rows)]


def verl_trace_headline() -> list[Line]:
    verl, trial = _traced()
    med = _medians(verl)
    step = verl["measured"]["timing_s/step"]
    throughput = verl["measured"]["perf/throughput"]
    error = 100 * (trial["throughput"] / throughput - 1)
    cut = sum(m["prepare_s"] for m in med.values())
    outside = sum(m["verl_s"] - m["worker_s"] for m in med.values())
    gpu = {p: (med[p]["micro_batches_s"], trial["phase_timings_s"][n]) for p, n in PHASES.items()}
    old, ref, update = med["old_log_prob"], med["ref"], med["update_actor"]
    return [
        Line(
            f"verl's step took {f1(step)} s ({throughput:.0f} tokens/s/GPU, median of the steps after the "
            f"warm-up); the trial predicted {trial['throughput']:.0f} ({error:+.0f}%).",
            (VERL_TRACE,),
        ),
        Line(""),
        Line(
            f"- **verl's cut into micro-batches** took {f1(cut)} s of it ({100 * cut / step:.0f}%): "
            f"{f1(old['prepare_s'])} s before the old-log-prob pass and {f1(ref['prepare_s'])} s before "
            f"the reference's, each of {old['micro_batches']:.0f} micro-batches, and "
            f"{f1(update['prepare_s'])} s over the update's mini-batches. The trial spends none of it.",
            (VERL_TRACE,),
        ),
        Line(
            f"- **Outside the worker** (verl's driver converting the batch, Ray moving it): {f1(outside)} s.",
            (VERL_TRACE,),
        ),
        Line(
            "- **The passes themselves** (their micro-batches' GPU seconds against the trial's phase): "
            + "; ".join(f"{p} {v:.2f} against {t:.2f}" for p, (v, t) in gpu.items())
            + ".",
            (VERL_TRACE,),
        ),
    ]


def verl_batching() -> list[Line]:
    """verl's cut of one rank's batch, by sequences and budget (the CPU benchmark)."""
    header = ["sequences per GPU", "cut", "micro-batches", "seconds (median of 3)", "spread"]
    rows = []
    for r in load(VERL_BATCHING)["rows"]:
        size = r["micro_batch_size"]
        cut = f"dynamic, {r['budget']} tokens" if r["dynamic"] else f"fixed, {size} sequences"
        cells = [
            str(r["sequences"]),
            cut,
            str(r["micro_batches"]),
            f"{r['median_s']:.2f}",
            f"{r['spread_pct']:.0f}%",
        ]
        rows.append((cells, (VERL_BATCHING,)))
    return [generated_from(VERL_BATCHING), Line(""), *table(header, rows)]


def verl_batching_headline() -> list[Line]:
    rows = load(VERL_BATCHING)["rows"]
    dynamic = [r for r in rows if r["dynamic"]]
    budget = min(r["budget"] for r in dynamic)
    at = sorted((r for r in dynamic if r["budget"] == budget), key=lambda r: r["sequences"])
    small, large = at[0], at[-1]
    growth = large["median_s"] / small["median_s"]
    ratio = large["sequences"] / small["sequences"]
    fixed = max((r for r in rows if not r["dynamic"]), key=lambda r: r["sequences"])
    verl, _ = _traced()
    in_verl = _medians(verl)
    traced = in_verl["old_log_prob"]
    workload = load(VERL_TRACE)["run"]["workload"]
    sequences = workload["train_batch_size"] * workload["n"]
    here = next((r for r in dynamic if r["sequences"] == sequences and r["budget"] == budget), None)
    return [
        Line(
            f"At a {budget}-token budget, {ratio:.0f}x the sequences per GPU ({small['sequences']} to "
            f"{large['sequences']}) cost {growth:.0f}x the seconds ({small['median_s']:.2f} to "
            f"{large['median_s']:.1f} s per pass, {large['micro_batches']} micro-batches), "
            f"{'more than' if growth > ratio**2 else 'less than'} the square ({ratio**2:.0f}x); "
            f"a fixed micro-batch size cuts {fixed['sequences']} sequences in {fixed['median_s']:.2f} s.",
            (VERL_BATCHING,),
        ),
        Line(""),
        Line(
            f"A cut of the traced step's size ({here['sequences']} sequences, {here['micro_batches']} "
            f"micro-batches, the job's first step) took {here['median_s']:.2f} s here and "
            f"{traced['prepare_s']:.2f} s (old-log-prob) and {in_verl['ref']['prepare_s']:.2f} s (reference) "
            "inside verl's worker on the H100 host.",
            (VERL_BATCHING, VERL_TRACE),
        )
        if here is not None
        else Line(""),
    ]
