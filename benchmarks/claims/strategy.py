"""Parts of benchmarks/README.md from the trials built as verl v0.9's default strategy builds
its actor (FSDP1, ``strategy: fsdp``) against FSDP2, beside verl on the same host
(``benchmarks/gpu/strategy-h200.sh``), and the layout benchmark's rows under FSDP1."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from autotuner.noise import spread_pct
from benchmarks.claims.data import Line, error_pct, generated_from, load, span, table
from trials.step import as_verl_timers

STRATEGY = "results/verl-qwen2.5-1.5b-h200-strategy.json"
EXAMPLE = "results/verl-qwen2.5-1.5b-h200-fsdp1-example.json"
LAYOUT_FSDP1 = "results/layout-fsdp1-h200.json"
STRATEGIES = ("fsdp", "fsdp2")
# (label, verl's step metric; the trial's figure is the same timer summed from its parts,
# ``trials.step.as_verl_timers``, its step throughput, step time or update's peak)
FIGURES = (
    ("step throughput, tok/s/GPU", "perf/throughput"),
    ("update_weights (weight sync + wake), s", "timing_s/update_weights"),
    ("gen (rollout + poll + sleep), s", "timing_s/gen"),
    ("old_log_prob, s", "timing_s/old_log_prob"),
    ("ref, s", "timing_s/ref"),
    ("update_actor, s", "timing_s/update_actor"),
    ("step, s", "timing_s/step"),
    ("update's peak allocated, GiB", "actor/perf/max_memory_allocated_gb"),
)


def _runs(rel: str, kind: str) -> list[dict[str, Any]]:
    return [r for r in load(rel)["run"]["runs"] if r["kind"] == kind]


def _trial_figure(trial: dict[str, Any], metric: str) -> float:
    own = {
        "perf/throughput": trial["throughput"],
        "timing_s/step": trial["step_time_s"],
        "actor/perf/max_memory_allocated_gb": trial["metrics"]["update_actor_max_allocated_gib"],
    }
    return float(own[metric] if metric in own else as_verl_timers(trial["phase_timings_s"])[metric])


def _verl_steps(rel: str) -> list[dict[str, float]]:
    (verl,) = _runs(rel, "verl")
    return list(verl["steps"][verl.get("warmup_steps", 1) :])


def _trials(rel: str) -> dict[str, dict[str, Any]]:
    return {t["strategy"]: t for t in _runs(rel, "trial") if t["status"] == "ok"}


def strategy_compare(rel: str) -> Callable[[], list[Line]]:
    """Per figure: the trial of each strategy the file holds, its error against verl, and
    verl's median over its measured steps."""

    def build() -> list[Line]:
        trials = _trials(rel)
        strategies = [s for s in STRATEGIES if s in trials]
        steps = _verl_steps(rel)
        header = ["figure"]
        for s in strategies:
            header += [f"trial, {s}", "error"]
        header += ["verl (median of the measured steps)"]
        rows = []
        for label, metric in FIGURES:
            values = [s[metric] for s in steps]
            measured = statistics.median(values)
            cells = [label]
            for s in strategies:
                predicted = _trial_figure(trials[s], metric)
                cells += [f"{predicted:.4g}", error_pct(predicted, measured)]
            cells.append(f"{measured:.4g} (n={len(values)}, spread {spread_pct(values) or 0:.1f}%)")
            rows.append((cells, (rel,)))
        return [*table(header, rows), Line(""), generated_from(rel)]

    return build


def _throughput(rel: str) -> tuple[float, float, int]:
    steps = _verl_steps(rel)
    values = [s["perf/throughput"] for s in steps]
    return statistics.median(values), spread_pct(values) or 0.0, len(values)


def strategy_headline() -> list[Line]:
    trials = _trials(STRATEGY)
    verl, spread, n = _throughput(STRATEGY)
    one, two = (float(trials[s]["throughput"]) for s in STRATEGIES)
    example = float(_trials(EXAMPLE)["fsdp"]["throughput"])
    verl_example, spread_example, n_example = _throughput(EXAMPLE)
    return [
        Line(
            f"verl's defaults on one H200: verl measured {verl:.0f} tokens/s/GPU (median of "
            f"{n} steps, spread {spread:.1f}%). The trial with the actor and the ref under "
            f"FSDP1, as verl builds them, predicted {one:.0f} ({error_pct(one, verl)}); under FSDP2, "
            f"{two:.0f} ({error_pct(two, verl)}). One trial of each, on the same host as verl's run.",
            (STRATEGY,),
        ),
        Line(""),
        Line(
            f"verl's example on another H200 host: verl measured {verl_example:.0f} (median of "
            f"{n_example} steps, spread {spread_example:.1f}%); the trial under FSDP1 predicted "
            f"{example:.0f} ({error_pct(example, verl_example)}).",
            (EXAMPLE,),
        ),
    ]


def verl_outside_micro_batches() -> list[Line]:
    """Per verl worker pass of the example's measured steps: its wall time less the sum of
    its micro-batches' seconds (what verl spends in a pass outside its micro-batches),
    against the cut into micro-batches the trial times for that phase."""
    (verl,) = _runs(EXAMPLE, "verl")
    (trial,) = _runs(EXAMPLE, "trial")
    passes = [p for p in verl["trace"] if p.get("micro_batch_s")]
    forward = [p for p in passes if p.get("forward_only")]
    # verl's trace holds every step's passes, the warm-up's first: 2 forward passes per step
    # (old_log_prob by the actor, ref by the ref), and one update pass per mini-batch.
    measured = forward[2:]
    outside = {
        role: [p["wall_s"] - sum(p["micro_batch_s"]) for p in measured if p["role"] == role]
        for role in ("actor", "ref")
    }
    updates = [p for p in passes if not p.get("forward_only")]
    per_step = len(updates) // (len(forward) // 2)
    update_outside = [p["wall_s"] - sum(p["micro_batch_s"]) for p in updates[per_step:]]
    m = trial["metrics"]

    def rate(ps: list[dict[str, Any]]) -> float:
        return sum(sum(p["micro_batch_tokens"]) for p in ps) / sum(sum(p["micro_batch_s"]) for p in ps)

    rates = {
        "old_log_prob": rate([p for p in measured if p["role"] == "actor"]),
        "ref_log_prob": rate([p for p in measured if p["role"] == "ref"]),
        "update_actor": rate(updates[per_step:]),
    }
    return [
        Line(
            "Within its micro-batches verl ran "
            + ", ".join(f"{phase} at {value:.0f}" for phase, value in rates.items())
            + " tokens/s; the trial's phases ran at "
            + ", ".join(f"{m[f'{phase}_tokens_per_s']:.0f}" for phase in rates)
            + " (its cut included).",
            (EXAMPLE,),
        ),
        Line(""),
        Line(
            f"In verl's run of the example, each pass of its measured steps spent outside its "
            f"micro-batches: old_log_prob {span(outside['actor'], '.1f')} s, ref "
            f"{span(outside['ref'], '.1f')} s, each of the update's {per_step} mini-batches "
            f"{span(update_outside, '.2f')} s. The trial counts verl's cut into micro-batches there: "
            f"{m['old_log_prob_verl_cut_s']:.2f}, {m['ref_log_prob_verl_cut_s']:.2f} and "
            f"{m['update_actor_verl_cut_s']:.2f} s over the step.",
            (EXAMPLE,),
        ),
    ]


def layout_fsdp1() -> list[Line]:
    """The layout benchmark's rows under FSDP1 on two hosts, each host's ratios to its own
    packed micro-batch 4, beside the probe's ratios."""
    doc = load(LAYOUT_FSDP1)
    hosts = doc["hosts"]
    probe_ref = doc["probe"]["packed-4"]["tokens_per_s"]
    header = ["layout", "probe's ratio"]
    for name in hosts:
        header += [f"{name}: update tok/s (median of n)", f"{name}: ratio, off by"]
    rows = []
    for row in doc["probe"]:
        probe_ratio = doc["probe"][row]["tokens_per_s"] / probe_ref
        cells = [row, f"{probe_ratio:.2f}"]
        for h in hosts.values():
            r = h["rows"][row]
            cells += [
                f"{r['median']:.0f} (n={r['n']}, spread {r['spread_pct']:.1f}%)",
                f"{r['ratio_to_packed_4']:.2f}, {r['ratio_error_pct']:+.1f}%",
            ]
        rows.append((cells, (f"{LAYOUT_FSDP1}#{row}",)))
    device = Line(f"{doc['date']}, {doc['device']}: {doc['note']}", (LAYOUT_FSDP1,))
    return [device, Line(""), *table(header, rows), Line(""), generated_from(LAYOUT_FSDP1)]
