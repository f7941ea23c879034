"""Parts about the recorded landscapes and the search strategies replayed on them
(``search/compare.py``): search/README.md, and the H200 result in the top README and
benchmarks/README.md."""

from __future__ import annotations

import datetime
import json
import re
import statistics
from typing import Any

from benchmarks.claims.data import (
    PACKED,
    PACKED_SINCE,
    THROUGHPUT,
    Line,
    generated_from,
    load,
    span,
    table,
    times,
)
from benchmarks.gpu import report
from trials.device import host_kinds

LANDSCAPE = "search/landscapes/qwen2.5-1.5b-h200.json"
SEARCH = "search/results/qwen2.5-1.5b-h200.json"
STRATEGIES = {
    "grid": "grid (shuffled)",
    "random": "random",
    "tpe": "Optuna TPE",
    "nsga2": "Optuna NSGA-II",
    "tpe-seeded": "TPE seeded with verl's baselines",
}
COMPOSITION = "search/results/qwen2.5-1.5b-h200-composition.json"
CPU_LANDSCAPE = "search/landscapes/cpu-train-mid.json"
CPU_SEARCH = "search/results/cpu-train-mid.json"
OTHERS = tuple(STRATEGIES)


def landscape_best(rel: str) -> tuple[float, int]:
    """The landscape's best first-run throughput and its point's index."""
    points = load(rel)["points"]
    return max(
        (run["metrics"][THROUGHPUT], i)
        for i, point in enumerate(points)
        for run in point["runs"][:1]
        if run["status"] == "ok"
    )


def point_value(point: dict[str, Any]) -> float:
    """A config's true value as ``search/compare.py`` scores it: the median of its runs, a
    failed run counting as 0."""
    return statistics.median(
        (run["metrics"].get(THROUGHPUT) or 0.0) if run["status"] == "ok" else 0.0 for run in point["runs"]
    )


def next_best_pct(rel: str) -> float:
    """The landscape's second-best config as a percentage of its best."""
    values = sorted((point_value(p) for p in load(rel)["points"]), reverse=True)
    return 100 * values[1] / values[0]


def packed_landscape(rel: str) -> bool:
    """Whether the landscape was measured with the packed-sequence layout."""
    return any(p["config"].get(PACKED) for p in load(rel)["points"])


def landscape_facts(rel: str) -> list[Line]:
    """What a landscape file holds: when and where it was recorded, its configs and runs."""
    doc = load(rel)
    points = doc["points"]
    runs = [run for point in points for run in point["runs"]]
    statuses = {s: sum(run["status"] == s for run in runs) for s in dict.fromkeys(r["status"] for r in runs)}
    repeats = sorted({len(point["runs"]) for point in points})
    fit = sum(point_value(point) > 0 for point in points)
    walls = [run["wall_s"] for run in runs if run["status"] == "ok"]
    top_value, top_i = max((point_value(p), i) for i, p in enumerate(points))
    cap = f", under a {doc['memory_cap_gib']:g} GiB allocation cap" if doc["device"] == "cpu" else ""
    return [
        Line(
            f"Recorded {doc['recorded_at'][:10]} on {', '.join(doc['measured_on'])}{cap}: "
            f"{len(points)} configs, each run {times(repeats)}; {fit} fit, {len(points) - fit} did not "
            f"({', '.join(f'{n} runs {s}' for s, n in statuses.items())}). A run that fit took "
            f"{statistics.median(walls):.0f} s in the median ({span(walls, '.0f')} s, start-up included).",
            (rel,),
        ),
        Line(""),
        Line(
            f"Best: {top_value:.1f} tok/s/GPU ({report.knobs(points[top_i]['config'])}); the next best is "
            f"{next_best_pct(rel):.1f}% of it.",
            (f"{rel}#points.{top_i}",),
        ),
    ]


def compare_table(rel: str) -> list[Line]:
    """A stored comparison as ``search/compare.py`` prints it."""
    from benchmarks.search.compare import table as printed  # optuna and the study loop: import on use

    return [Line("```"), *(Line(text, (rel,)) for text in printed(load(rel)).splitlines()), Line("```")]


def gpu_s(median: float | None) -> str:
    """A median of GPU-seconds to 97% (``compare.median_reach``) in words."""
    return "never (half its seeds or more did not reach 97%)" if median is None else f"{median:.0f}"


def search_shows(rel: str, landscape: str) -> list[Line]:
    """Ours against the other strategies on one stored comparison, and against the targets."""
    doc = load(rel)
    s = doc["strategies"]
    ours = s["ours"]
    plain = {k: s[k]["gpu_s_to_97pct_median"] for k in OTHERS if k in s}
    known = [v for v in plain.values() if v is not None]
    median = ours["gpu_s_to_97pct_median"]
    lo = min(known, default=None)
    hi = None if len(known) < len(plain) else max(known)
    place = (
        "above or level with every other strategy's median"
        if median is None
        else "below every other strategy's median"
        if lo is None or median < lo
        else "above every other strategy's median"
        if hi is not None and median > hi
        else "within the other strategies' medians"
    )
    missed = ours["seeds"] - ours["reached_97pct"]
    stops = "; ".join(ours["stop_reasons"])
    grid = doc["landscape"]["grid_cost_s"]
    share = "" if median is None else f" ({100 * median / grid:.0f}% of the full grid's {grid:.0f})"
    return [
        Line(
            f"Over {doc['seeds']} seeds ours needs {gpu_s(median)} GPU-s to 97% of the best in the median "
            f"seed{', a seed that never reached it counted last' if missed else ''}{share}, {place}: "
            f"{', '.join(f'{STRATEGIES[k]} {gpu_s(v)}' for k, v in plain.items())}. "
            + (
                f"In {missed} of {ours['seeds']} seeds it ended before reaching 97% (the seeds' stop "
                f"reasons: {stops}). "
                if missed
                else "Every seed reached it. "
            )
            + f"It skipped a median of {ours['skipped_median']:g} proposals (predicted or inferred not to "
            f"fit, at no cost) and ran {ours['runs_median']:g} trials."
            + targets_met(doc.get("targets") or {}),
            (rel, landscape),
        )
    ]


def targets_met(goal: dict[str, Any]) -> str:
    """The comparison's targets (``compare.targets``) in a sentence, each met or missed."""
    if not goal:
        return ""
    fraction, target = goal["ours_fraction_of_grid"], goal["ours_fraction_of_grid_target"]
    reach = (
        "does not reach 97% in half its seeds"
        if fraction is None
        else f"reaches 97% in {100 * fraction:.0f}% of the grid's GPU-s"
    )
    text = (
        f" Against the benchmark's targets: ours {reach} (target at most {100 * target:.0f}%: "
        f"{'met' if fraction is not None and fraction <= target else 'missed'}"
        f"{'' if goal['ours_all_seeds_reached'] else '; not every seed reached 97%'})"
    )
    if "seeded_tpe_over_ours" in goal:
        ratio, need = goal["seeded_tpe_over_ours"], goal["seeded_tpe_over_ours_target"]
        met = goal["seeded_tpe_over_ours_met"]
        needs = (
            f"needs {ratio:.2f}x ours"
            if ratio is not None
            else "does not reach 97% in half its seeds"
            if fraction is not None
            else "is not compared"
        )
        verdict = "met" if met else "missed"
        text += f"; TPE seeded with verl's baselines {needs} (target at least {need:g}x: {verdict})"
    return text + "."


def search_cpu_shows() -> list[Line]:
    return search_shows(CPU_SEARCH, CPU_LANDSCAPE)


def search_h200_shows() -> list[Line]:
    return search_shows(SEARCH, LANDSCAPE)


def search_h200_headline() -> list[Line]:
    """The H200 landscape's result in a sentence, for the top README."""
    doc = load(SEARCH)
    ls, ours = doc["landscape"], doc["strategies"]["ours"]
    median, grid = ours["gpu_s_to_97pct_median"], ls["grid_cost_s"]
    plain = ", ".join(
        f"{STRATEGIES[k]}: {doc['strategies'][k]['gpu_s_to_97pct_median']:.0f}"
        for k in OTHERS
        if k in doc["strategies"]
    )
    to97 = [x for x in ours["gpu_s_to_97pct"] if x is not None]
    when = (
        ""
        if packed_landscape(LANDSCAPE)
        else f", measured before the packed-sequence layout of {PACKED_SINCE}"
    )
    return [
        Line(
            f"On a real H200 landscape of {ls['configs']} configs (`benchmarks/{LANDSCAPE}`, "
            f"{ls['feasible_configs']} feasible{when}) the tuner reached 97% of the best config in a "
            f"median {median:.0f} GPU-seconds over {doc['seeds']} seeds ({span(to97, '.0f')}), "
            f"{100 * median / grid:.0f}% of the grid's {grid:.0f} ({plain}). Only the best config is "
            f"within 97% of the best (the next is {next_best_pct(LANDSCAPE):.1f}%), so reaching 97% is "
            "finding the best.",
            (SEARCH, LANDSCAPE),
        )
    ]


def search_compare() -> list[Line]:
    """The search strategies on the H200 landscape, median [min-max] over the seeds."""
    from benchmarks.search.compare import reach_range  # optuna and the study loop: import on use

    doc = load(SEARCH)
    rows = []
    for key, s in doc["strategies"].items():
        to97, early = s["gpu_s_to_97pct"], s["best_at_25pct_cost_pct"]
        rows.append(
            (
                [
                    STRATEGIES.get(key, key),
                    reach_range(to97),
                    f"{s['best_at_25pct_cost_pct_median']:.0f}% [{min(early):.0f}-{max(early):.0f}]",
                    f"{s['gpu_s_total_median']:.0f}",
                ],
                (f"{SEARCH}#strategies.{key}",),
            )
        )
    grid = doc["landscape"]["grid_cost_s"]
    ours = doc["strategies"]["ours"]["gpu_s_to_97pct_median"]
    header = [
        "strategy",
        "GPU-s to 97% of the best",
        "best found at 25% of the grid's cost",
        "GPU-s in all",
    ]
    stale = (
        []
        if packed_landscape(LANDSCAPE)
        else [
            Line(
                f"*Obsolete: the landscape was measured before the packed-sequence layout ({PACKED_SINCE}); "
                "kept as measured.*",
                (LANDSCAPE,),
            ),
            Line(""),
        ]
    )
    return (
        stale
        + [Line(f"`{doc['command']}`, {doc['seeds']} seeds, median [min-max]:", (SEARCH,)), Line("")]
        + table(header, rows)
        + [
            Line(""),
            Line(
                f"Ours reaches 97% of the best in {100 * ours / grid:.0f}% of the grid's GPU-seconds "
                "(median).",
                (SEARCH,),
            ),
            Line(""),
            generated_from(SEARCH),
        ]
    )


def search_h200_composition() -> list[Line]:
    """The cross design checked on the H200 landscape: its configs off the cross, measured,
    against what their sides compose to (``search/compose.py`` prints the table)."""
    from benchmarks.search.compose import table as printed

    doc = load(COMPOSITION)
    errors = [abs(r["error_pct"]) for r in doc["configs"] if r["error_pct"] is not None]
    worst = max(doc["configs"], key=lambda r: abs(r["error_pct"] or 0.0))
    return [
        Line(f"`{doc['command']}`:", (COMPOSITION,)),
        Line(""),
        Line("```"),
        *(Line(text, (COMPOSITION,)) for text in printed(doc).splitlines()),
        Line("```"),
        Line(""),
        Line(
            f"Of the {doc['grid_configs']} configs, the {doc['sides']} on the cross compose the other "
            f"{doc['held_out']}: {doc['held_out'] - doc['feasibility_mismatches']} of {doc['held_out']} "
            f"fit or not as measured, and the {len(errors)} that fit are within "
            f"{max(errors):.1f}% of their measured throughput ({statistics.median(errors):.1f}% in the "
            f"median; the worst, {report.knobs(worst['config'])}, {worst['error_pct']:+.1f}%). One run "
            "a config, so a config's error holds its own run-to-run noise too; and the landscape's two "
            "gpu_memory_utilization halves were recorded on two hosts, so each held-out config at 0.8 "
            "pairs an engine side from one host with a train side from the other."
            + (
                ""
                if packed_landscape(LANDSCAPE)
                else f" Measured before the packed-sequence layout ({PACKED_SINCE})."
            ),
            (COMPOSITION, LANDSCAPE),
        ),
    ]


# The cross design's landscapes, one per kind of host (``benchmarks/gpu/record-cross.sh``
# names each by its host's CPU count), smallest host first.
CROSS_SIDES = (
    "search/landscapes/qwen2.5-1.5b-h200-cross-sides-16cpu.json",
    "search/landscapes/qwen2.5-1.5b-h200-cross-sides-32cpu.json",
)
ROLLOUT = "rollout_total_tokens_per_s"
UPDATE = "update_actor_tokens_per_s"


def _side_runs(rel: str, side: str, metric: str) -> dict[str, tuple[dict[str, Any], list[float]]]:
    """A landscape's ok runs by the values of their ``side`` knobs (``autotuner.compose``):
    those knobs and the runs' ``metric``."""
    from autotuner.compose import side_of  # the knob table: import on use

    runs: dict[str, tuple[dict[str, Any], list[float]]] = {}
    for point in load(rel)["points"]:
        knobs = {p: v for p, v in point["config"].items() if side_of(p) == side}
        key = json.dumps(knobs, sort_keys=True)
        for run in point["runs"]:
            if run["status"] == "ok" and metric in run["metrics"]:
                runs.setdefault(key, (knobs, []))[1].append(run["metrics"][metric])
    return runs


def cross_hosts() -> list[Line]:
    """What each kind of host has recorded of the cross design, and the engine and train
    settings measured on both: rollout and update speed, host by host."""
    docs = [load(rel) for rel in CROSS_SIDES]
    lines = []
    for rel, doc in zip(CROSS_SIDES, docs, strict=True):
        runs = [run for point in doc["points"] for run in point["runs"]]
        found = re.search(r"--repeats (\d+)", doc["command"])  # the recorder's default: 1
        repeats = int(found.group(1)) if found else 1
        total = (doc["design"]["sides"] + len(doc["design"]["held_out"])) * repeats
        kinds = sorted(host_kinds((run["software"] for run in runs), "not recorded"))
        days = sorted({run["started_at"] for run in runs})
        statuses = {
            s: sum(run["status"] == s for run in runs) for s in dict.fromkeys(r["status"] for r in runs)
        }
        lines.append(
            Line(
                f"- `{rel.removeprefix('search/')}`: {len(runs)} of the design's {total} runs "
                f"({', '.join(f'{n} {s}' for s, n in statuses.items())}), on {'; '.join(kinds)}, "
                f"started {_day(days[0])} to {_day(days[-1])}.",
                (rel,),
            )
        )
    a, b = CROSS_SIDES
    engine = {rel: _side_runs(rel, "engine", ROLLOUT) for rel in CROSS_SIDES}
    every = [[v for _, values in engine[rel].values() for v in values] for rel in CROSS_SIDES]
    rows = []
    if all(every):
        x, y = (statistics.median(v) for v in every)
        rows.append(
            (
                ["rollout, every setting and run: median (range)"]
                + [f"{statistics.median(v):,.0f} ({span(v, ',.0f')}; {len(v)})" for v in every]
                + [f"{y / x:.2f}x"],
                (a, b),
            )
        )
    for side, metric, what in (("engine", ROLLOUT, "rollout"), ("actor", UPDATE, "update")):
        small, large = _side_runs(a, side, metric), _side_runs(b, side, metric)
        for key in sorted(small.keys() & large.keys()):
            (knobs, xs), (_, ys) = small[key], large[key]
            x, y = statistics.median(xs), statistics.median(ys)
            cells = [f"{what}: {report.knobs(knobs)}", f"{x:,.0f} ({len(xs)})", f"{y:,.0f} ({len(ys)})"]
            rows.append(([*cells, f"{y / x:.2f}x"], (a, b)))
    if not rows:
        return [*lines, Line(""), Line("No engine or train setting is measured on both kinds of host yet.")]
    # Each host's own run-to-run noise in the rollout: the engine settings rolled out more than
    # once there (as an engine side, or under several train settings)
    noise = []
    for rel in CROSS_SIDES:
        spreads = [
            100 * (max(v) - min(v)) / statistics.median(v) for _, v in engine[rel].values() if len(v) > 1
        ]
        if spreads:
            cpus = rel.rsplit("-", 1)[-1].removesuffix("cpu.json")
            noise.append(f"up to {max(spreads):.0f}% on the {cpus}-CPU hosts")
    said = (
        f" On one kind of host an engine setting's rollouts spread by {' and '.join(noise)} ((max - min)"
        " / median over its runs): a ratio of single runs carries that noise too."
        if noise
        else ""
    )
    return [
        *lines,
        Line(""),
        *table(["setting", "16 CPUs: tok/s (runs)", "32 CPUs: tok/s (runs)", "32 over 16"], rows),
        Line(""),
        Line(
            "The first row pools every rollout each kind of host recorded (their settings differ); the"
            " others are the settings measured on both, each the median of its runs there (a rollout is"
            " the engine's, whatever train setting it ran beside; an update the actor's)." + said,
            (a, b),
        ),
    ]


# Work every run of the cross design does whatever its config, most of it in Python: importing
# vLLM in the engine's process, building the actor (a 1.5B model from its config).
HOST_WORK = (("engine_import_s", "vLLM's import"), ("train_model_build_s", "the actor's build"))


def cross_host_work() -> list[Line]:
    """The seconds each kind of host took for the cross design's config-independent work, run
    by run: the host's own speed at plain Python work, which a GPU host's rollout and small
    micro-batches wait on."""
    runs = [
        [run for point in load(rel)["points"] for run in point["runs"] if run["status"] == "ok"]
        for rel in CROSS_SIDES
    ]
    rows = []
    for metric, what in HOST_WORK:
        per_host = [[run["metrics"][metric] for run in ok if metric in run["metrics"]] for ok in runs]
        if not all(per_host):
            continue
        cells = [f"{statistics.median(v):.1f} ({span(v, '.1f')}; {len(v)})" for v in per_host]
        small, large = (statistics.median(v) for v in per_host)
        rows.append(([what, *cells, f"{small / large:.2f}x"], CROSS_SIDES))
    if not rows:
        return [Line("No run of either kind of host timed its imports yet.")]
    return table(
        ["per run", "16 CPUs: s, median (range; runs)", "32 CPUs: s, median (range; runs)", "16 over 32"],
        rows,
    )


def _day(started_at: float) -> str:
    return datetime.datetime.fromtimestamp(started_at, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
