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


VERL_LANES = "results/verl-qwen2.5-1.5b-h100x2-cut.json"
# verl's timing of each phase and the trial's name for it, in the step's order.
STEP_PHASES = {
    "timing_s/gen": "rollout",
    "timing_s/old_log_prob": "old_log_prob",
    "timing_s/ref": "ref_log_prob",
    "timing_s/update_actor": "update_actor",
}


def _lanes_run(kind: str, config: str) -> dict[str, Any]:
    return next(r for r in load(VERL_LANES)["run"]["runs"] if r["kind"] == kind and r["config"] == config)


def _versus(trial: dict[str, Any], verl: dict[str, Any]) -> list[str]:
    """A trial's step throughput and phases against a verl run's medians after its warm-up."""
    measured = verl["measured"]
    error = 100 * (trial["throughput"] / measured["perf/throughput"] - 1)
    cells = [f"{trial['throughput']:.0f}", f"{measured['perf/throughput']:.0f}", f"{error:+.0f}%"]
    for key, phase in STEP_PHASES.items():
        t, v = trial["phase_timings_s"][phase], measured[key]
        cells.append(f"{t:.1f} / {v:.1f} ({100 * (t / v - 1):+.0f}%)")
    return cells


def verl_cut_counted() -> list[Line]:
    """Trials with verl's cut counted in, against verl: the example on one host, the winner
    against the traced run of an earlier host, and the winner's trial from before the cut."""
    header = ["config", "trial", "verl run", "trial tok/s/GPU", "verl tok/s/GPU", "trial error"]
    header += [f"{phase} s, trial / verl" for phase in STEP_PHASES.values()]
    example_verl = _lanes_run("verl", "example")
    n = len(example_verl["steps"]) - example_verl["warmup_steps"]
    traced, before = _traced()
    n_traced = len(traced["steps"]) - traced.get("warmup_steps", 1)
    printed = next(t for t in load(VERL_LANES)["printed_trials"] if t["config"] == "example")
    rows = [
        (
            [
                "example",
                "cut counted, GPU 1",
                f"same host, GPU 0 (n={n})",
                *_versus(_lanes_run("trial", "example"), example_verl),
            ],
            (VERL_LANES,),
        ),
        (
            [
                "example",
                "cut counted, earlier x2 host (printed)",
                f"as above (n={n})",
                *_versus(printed, example_verl),
            ],
            (VERL_LANES,),
        ),
        (
            [
                "winner",
                "cut counted, GPU 1",
                f"earlier x1 host, traced (n={n_traced})",
                *_versus(_lanes_run("trial", "winner"), traced),
            ],
            (VERL_LANES, VERL_TRACE),
        ),
        (
            ["winner", "no cut, earlier x1 host", f"same host (n={n_traced})", *_versus(before, traced)],
            (VERL_TRACE,),
        ),
    ]
    return [generated_from(VERL_LANES, VERL_TRACE), Line(""), *table(header, rows)]


def cut_medians(verl: dict[str, Any]) -> dict[str, tuple[float, float, float]]:
    """Per phase, verl's own cut seconds over the measured steps: median, least, most."""
    warmup = verl.get("warmup_steps", 1)
    out = {}
    for phase in PHASES:
        values = [r["prepare_s"] for r in trace_rows(verl) if r["step"] > warmup and r["phase"] == phase]
        out[phase] = (statistics.median(values), min(values), max(values))
    return out


def verl_cut_check() -> list[Line]:
    """The cut a trial timed on its host against the cut verl's workers took."""
    header = ["config", "phase", "trial's timed cut s", "verl's cut s (median, least-most)", "verl run"]
    rows = []
    pairs = [
        (
            "example",
            _lanes_run("trial", "example"),
            _lanes_run("verl", "example"),
            "same host",
            (VERL_LANES,),
        ),
        ("winner", _lanes_run("trial", "winner"), _traced()[0], "earlier x1 host", (VERL_LANES, VERL_TRACE)),
    ]
    for config, trial, verl, where, sources in pairs:
        for phase, (median, low, high) in cut_medians(verl).items():
            timed = trial["metrics"][f"{PHASES[phase]}_verl_cut_s"]
            rows.append(
                ([config, phase, f"{timed:.2f}", f"{median:.2f} ({low:.2f}-{high:.2f})", where], sources)
            )
    return [generated_from(VERL_LANES, VERL_TRACE), Line(""), *table(header, rows)]


def verl_cut_headline() -> list[Line]:
    traced, before = _traced()
    winner = _lanes_run("trial", "winner")
    example = _lanes_run("trial", "example")
    example_verl = _lanes_run("verl", "example")
    printed = next(t for t in load(VERL_LANES)["printed_trials"] if t["config"] == "example")

    def err(trial: dict[str, Any], verl: dict[str, Any]) -> float:
        return 100 * (trial["throughput"] / verl["measured"]["perf/throughput"] - 1)

    cut = sum(winner["metrics"][f"{p}_verl_cut_s"] for p in PHASES.values())
    example_cut = sum(example["metrics"][f"{p}_verl_cut_s"] for p in PHASES.values())
    verl_cut = sum(m[0] for m in cut_medians(example_verl).values())
    apart = 100 * (
        max(printed["throughput"], example["throughput"]) / min(printed["throughput"], example["throughput"])
        - 1
    )
    rollout = (example["phase_timings_s"]["rollout"], printed["phase_timings_s"]["rollout"])
    return [
        Line(
            f"With verl's cut counted, the winner's trial predicted {winner['throughput']:.0f} "
            f"tokens/s/GPU against the {traced['measured']['perf/throughput']:.0f} verl measured on an "
            f"H100 of an earlier host ({err(winner, traced):+.0f}%; {f1(cut)} s of its "
            f"{f1(winner['step_time_s'])} s step is the cut); the trial without it had predicted "
            f"{before['throughput']:.0f} ({err(before, traced):+.0f}%).",
            (VERL_LANES, VERL_TRACE),
        ),
        Line(""),
        Line(
            f"On verl's example the trial predicted {example['throughput']:.0f} against verl's "
            f"{example_verl['measured']['perf/throughput']:.0f} on the same host "
            f"({err(example, example_verl):+.0f}%), but the same config's trial on an earlier host of "
            f"the same kind gave {printed['throughput']:.0f} ({err(printed, example_verl):+.0f}%): the "
            f"two trials are {apart:.0f}% apart, most of it the rollout ({rollout[0]:.1f} against "
            f"{rollout[1]:.1f} s), so one trial's noise is as large as the error. "
            "Each figure is one trial: none of these gaps is measured against a band.",
            (VERL_LANES,),
        ),
        Line(""),
        Line(
            f"The example's cut over the step: {f1(example_cut)} s timed by its trial, {f1(verl_cut)} s "
            "in verl's workers on the same host (the sum of their per-phase medians).",
            (VERL_LANES,),
        ),
    ]


VERL_ENTRIES = "results/verl-batching-entries-cpu.json"


def verl_batching_entries() -> list[Line]:
    """verl's cut of the trials' batch against the same batch with the entries verl's update holds."""
    rows = [r for r in load(VERL_ENTRIES)["rows"] if r["dynamic"]]
    lines = []
    for trial in (r for r in rows if r["entries"] == "trial"):
        verl = next(
            r
            for r in rows
            if r["entries"] != "trial"
            and r["sequences"] == trial["sequences"]
            and r["budget"] == trial["budget"]
        )
        gap = 100 * (verl["median_s"] / trial["median_s"] - 1)
        spreads = (trial["spread_pct"], verl["spread_pct"])
        verdict = "a tie" if abs(gap) <= max(spreads) else "outside them"
        lines.append(
            Line(
                f"- {trial['sequences']} sequences at {trial['budget']} tokens: {trial['median_s']:.2f} s "
                f"with the trials' {trial['nested']} entries, {verl['median_s']:.2f} s with verl's "
                f"{verl['nested']} ({gap:+.0f}%; spreads {spreads[0]:.0f}% and "
                f"{spreads[1]:.0f}%: {verdict}).",
                (VERL_ENTRIES,),
            )
        )
    n = load(VERL_ENTRIES)["rows"][0]["seconds"]
    return [
        generated_from(VERL_ENTRIES),
        Line(""),
        Line(f"Median of {len(n)} cuts each:", (VERL_ENTRIES,)),
        Line(""),
        *lines,
    ]
