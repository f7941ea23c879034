"""A landscape composed from measured sides: every config of a large space, from few trials.

usage: python -m benchmarks.search.compose SIDES.json [--out LANDSCAPE.json] [--report REPORT.json]
                                           [--base PATH=VALUE ...]

A step is its engine's side (wake, weight sync, rollout, the trainer's poll, sleep) then
its actor's side (old log-probs, reference, update, offload moves); each side depends on
its own knobs (``autotuner.compose``: ``Knob.composition_side``; knobs both sides share,
the actor's offload, must be equal). A *cross design* measures each engine setting once
beside one base train setting, and each train setting beside one base engine setting:
for ``E`` engine and ``T`` train settings, ``E + T - 1`` configs instead of ``E x T``.
Every other config is composed from them, run by run (the k-th composed run of a config
pairs the k-th runs of its two sides, so the sides' noise carries over):

- a side that failed (out of memory, error) is the composed run's failure, with that
  side's phase, wall time and metrics: a real trial of the config fails there too (a
  train setting that does not fit fails in the actor's probe before the engine starts;
  an engine setting that does not fit, at its start-up);
- otherwise the step is the engine side's parts of its run plus the actor side's parts of
  the other; throughput is the step's tokens per GPU (as the actor run counts them) over
  that time (as ``autotuner.compose`` predicts a config); the peaks of start-up, rollout
  and wake-up are the engine run's, those of the actor's probe and training the actor
  run's; the wall time is the engine run's less its training plus the actor run's
  training, and so is its timeline (an engine side's training goes in after its engine's
  release, as in a whole trial).

The cross's engine settings (beside the base train setting; the base itself aside) are
recorded as engine sides (``TrialSpec.engine_side_only``: the actor built and resident, the
engine's side of the step run, the actor's sub-phases not), since their actor side is the
base's, measured by the base's own trials: each of those configs is composed too, from its
engine side and the base's actor side. A run of a whole config of the engine's arm (as
recordings before engine sides had) serves as its engine side the same way.

The composition's error is measured, not assumed: *held-out* configs (neither side run)
are recorded as full trials beside the sides (``benchmarks.search.record --design cross
--held-out K``), and each is compared with what its sides compose to (throughput and peak
memory, median over runs; a config composed feasible that did not fit, or the reverse,
is a mismatch). Beside the error the report states the run-to-run spread of the configs
recorded more than once, whole and engine sides apart: the noise the error is read against;
and the kinds of host the runs come from (``trials.device.host_kind``), where more than one.
On a landscape with every config recorded (no design in the file), all configs off the
cross are held out: the method checked on a full grid.

The composed landscape (``--out``) holds every config of the job's grid whose two sides
were measured: measured configs with their own runs, the rest composed, and says which in
its ``design``; ``benchmarks.search.compare`` replays it as it replays a recorded one.
The base is the grid config closest to verl's defaults (most knob values equal; the
first in grid order on a tie), unless ``--base`` sets knob values it must have.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import shlex
import statistics
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from autotuner.compose import ACTOR_PHASES, ENGINE_PHASES, side_of
from autotuner.knobs import KNOBS
from autotuner.records import config_key
from autotuner.replay import Landscape, LandscapeError, LandscapePoint, throughput
from autotuner.space import SearchSpace
from benchmarks.gpu.report import SHORT, knobs
from trials.device import host_kinds
from trials.metrics import PEAK_MEMORY, THROUGHPUT
from trials.types import TrialResult

DESIGN = "cross"
# Peaks (``<phase>_peak_memory_gib``) that the engine's side of a run sets; the others
# (the actor's probe before the engine, training) are the actor's.
ENGINE_PEAKS = ("startup", "rollout", "wake", "weight_sync")
# Metrics of a run that belong to its actor's side: the train sub-phases, the actor's
# build and memory, the optimizer step.
ACTOR_METRIC_PREFIXES = (*ACTOR_PHASES, "train_", "actor_", "optimizer_")
# The metric a trial of an engine side alone sets (``TrialSpec.engine_side_only``).
SIDE_ONLY = "engine_side_only"


class DesignError(ValueError):
    """A cross design cannot be made or read for this landscape."""


def _side_key(config: dict[str, Any], side: str) -> str:
    """The values of a config's ``side`` knobs (``engine`` or ``actor``), with the knobs
    both sides share."""
    return json.dumps(
        {p: v for p, v in config.items() if side_of(p) in (side, "both")}, sort_keys=True, default=str
    )


def choose_base(space: SearchSpace, grid: list[dict[str, Any]], fixed: dict[str, Any]) -> dict[str, Any]:
    """The grid config with the values ``fixed`` that has the most knob values equal to
    verl's defaults (``SearchSpace.baseline_config``); the first in grid order on a tie."""
    defaults = space.baseline_config()
    candidates = [c for c in grid if all(c.get(p) == v for p, v in fixed.items())]
    if not candidates:
        raise DesignError(f"no config of the grid has {fixed}; --base takes values the search holds")
    return max(candidates, key=lambda c: sum(defaults.get(p) == v for p, v in c.items()))


def cross(grid: list[dict[str, Any]], base: dict[str, Any]) -> list[dict[str, Any]]:
    """The configs of ``grid`` on the cross through ``base``: its engine side with every
    train side, its train side with every engine side (for each value of the knobs both
    sides share), in grid order."""
    engine_only = {p: v for p, v in base.items() if side_of(p) == "engine"}
    actor_only = {p: v for p, v in base.items() if side_of(p) == "actor"}

    def on_cross(c: dict[str, Any]) -> bool:
        return all(c.get(p) == v for p, v in engine_only.items()) or all(
            c.get(p) == v for p, v in actor_only.items()
        )

    return [c for c in grid if on_cross(c)]


def engine_side_only(config: dict[str, Any], base: dict[str, Any]) -> bool:
    """Whether a cross design records ``config`` as its engine side alone: a config of the
    engine's arm (the base's train setting) other than the base."""
    return config_key(config) != config_key(base) and _side_key(config, "actor") == _side_key(base, "actor")


def is_side_only(point: LandscapePoint) -> bool:
    """Whether a point measured an engine side, not its whole config (any run of it did)."""
    return any(r.metrics.get(SIDE_ONLY) for r in point.runs)


def held_out(
    grid: list[dict[str, Any]], sides: list[dict[str, Any]], k: int, seed: int
) -> list[dict[str, Any]]:
    """``k`` configs off the cross, drawn with ``seed`` (all of them when fewer)."""
    on = {config_key(c) for c in sides}
    off = [c for c in grid if config_key(c) not in on]
    return random.Random(seed).sample(off, min(k, len(off)))


def make_design(
    space: SearchSpace, k: int, seed: int, fixed: dict[str, Any] | None = None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A cross design over ``space``'s grid with ``k`` held-out configs: its record (for
    ``Landscape.design``) and the configs to measure, sides first."""
    grid = space.grid()
    base = choose_base(space, grid, fixed or {})
    sides = cross(grid, base)
    extra = held_out(grid, sides, k, seed)
    design = {
        "kind": DESIGN,
        "base": base,
        "grid_configs": len(grid),
        "sides": len(sides),
        "held_out": [config_key(c) for c in extra],
        "seed": seed,
    }
    return design, sides + extra


# ---------------------------------------------------------------- composing runs


def _seconds(run: TrialResult, phases: Iterable[str]) -> float:
    return sum(float(run.phase_timings_s.get(p, 0.0)) for p in phases)


def _train_wall_s(run: TrialResult) -> float:
    m = run.metrics
    if m.get(SIDE_ONLY):
        return 0.0
    if "train_start_at_s" in m and "train_end_at_s" in m:
        return max(0.0, m["train_end_at_s"] - m["train_start_at_s"])
    return _seconds(run, ACTOR_PHASES)


def _is_actor_metric(name: str) -> bool:
    if name.endswith("_at_s"):  # the composed run keeps the engine run's timeline
        return False
    if name.endswith("_peak_memory_gib"):
        return name.removesuffix("_peak_memory_gib") not in ENGINE_PEAKS
    return name.startswith(ACTOR_METRIC_PREFIXES)


def compose_run(engine: TrialResult, actor: TrialResult, trial_id: str) -> TrialResult:
    """One run of the config with ``engine``'s engine side and ``actor``'s actor side (see
    the module docstring)."""
    failed = next((r for r in (actor, engine) if not r.ok), None)
    if failed is not None:
        out = TrialResult.from_dict(dataclasses.asdict(failed))
        out.trial_id = trial_id
        return out
    engine_s, actor_s = _seconds(engine, ENGINE_PHASES), _seconds(actor, ACTOR_PHASES)
    # The step's tokens per GPU, as the actor's run counts them (its whole batch)
    per_gpu = float(actor.metrics[THROUGHPUT]) * (_seconds(actor, ENGINE_PHASES) + actor_s)
    timings = {p: v for p, v in engine.phase_timings_s.items() if p not in ACTOR_PHASES}
    timings |= {p: v for p, v in actor.phase_timings_s.items() if p in ACTOR_PHASES}
    metrics = {k: v for k, v in engine.metrics.items() if not _is_actor_metric(k) and k != SIDE_ONLY}
    metrics |= {k: v for k, v in actor.metrics.items() if _is_actor_metric(k)}
    step_s = engine_s + actor_s
    metrics |= {"step_time_s": step_s, THROUGHPUT: per_gpu / step_s if step_s > 0 else 0.0}
    released = metrics.get("engine_released_at_s")
    if engine.metrics.get(SIDE_ONLY) and released is not None:
        # Training goes where a whole trial has it, right after the engine's release: what
        # the engine side did later (wake, shut-down) moves on by its time
        for k, v in list(metrics.items()):
            if k.endswith("_at_s") and v > released:
                metrics[k] = v + _train_wall_s(actor)
        metrics["train_start_at_s"] = released
    if "train_start_at_s" in metrics:  # training takes the actor run's time on this timeline
        metrics["train_end_at_s"] = metrics["train_start_at_s"] + _train_wall_s(actor)
    peaks = [v for k, v in metrics.items() if k.endswith("_peak_memory_gib") and k != PEAK_MEMORY]
    if peaks:
        metrics[PEAK_MEMORY] = max(peaks)
    return dataclasses.replace(
        engine,
        trial_id=trial_id,
        metrics=metrics,
        phase_timings_s=timings,
        wall_s=engine.wall_s - _train_wall_s(engine) + _train_wall_s(actor),
        hostname=f"composed:{engine.hostname}+{actor.hostname}",
        log_tail="",
        timing_lines=[],
    )


def compose_point(config: dict[str, Any], engine: LandscapePoint, actor: LandscapePoint) -> LandscapePoint:
    """``config`` composed run by run from the points measuring its two sides."""
    n = max(len(engine.runs), len(actor.runs))
    runs = [
        compose_run(engine.runs[k % len(engine.runs)], actor.runs[k % len(actor.runs)], f"composed-{k}")
        for k in range(n)
    ]
    return LandscapePoint(config, runs)


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _value(point: LandscapePoint) -> float:
    """A config's throughput: the median of its runs (a failed run counts as 0)."""
    return statistics.median(throughput(r) or 0.0 for r in point.runs)


def _peak(point: LandscapePoint) -> float | None:
    return _median([r.metrics[PEAK_MEMORY] for r in point.runs if r.ok and PEAK_MEMORY in r.metrics])


def compose(landscape: Landscape, fixed: dict[str, Any] | None = None) -> tuple[Landscape, dict[str, Any]]:
    """The composed landscape and the composition's report (see the module docstring)."""
    space = SearchSpace.build(landscape.spec, landscape.arch, landscape.device)
    grid = space.grid()
    measured = {config_key(p.config): p for p in landscape.points}
    design = dict(landscape.design)
    if design and design.get("kind") != DESIGN:
        raise DesignError(f"the landscape's design is {design.get('kind')!r}, not {DESIGN!r}")
    if design and not fixed:  # the recorded base (knobs added to the table since then left out)
        fixed = {p: v for p, v in design["base"].items() if any(p in c for c in grid)}
    base = choose_base(space, grid, fixed or {})
    sides = cross(grid, base)
    side_keys = {config_key(c) for c in sides}
    missing = [c for c in sides if config_key(c) not in measured]
    if missing:
        raise DesignError(
            f"{len(missing)} of the {len(sides)} configs on the cross are not recorded "
            f"(first: {missing[0]}); record them (benchmarks.search.record --design cross) first"
        )
    engine_sides = {_side_key(c, "engine"): measured[config_key(c)] for c in sides}
    # Actor sides from whole configs only: an engine side's run trained nothing
    actor_sides = {
        _side_key(c, "actor"): measured[config_key(c)]
        for c in sides
        if not is_side_only(measured[config_key(c)])
    }
    unmeasured = [c for c in sides if _side_key(c, "actor") not in actor_sides]
    if unmeasured:
        raise DesignError(
            f"the train setting of {unmeasured[0]} was recorded as an engine side only, never as a "
            "whole config; record the cross's base and train settings as whole trials"
        )
    side_only = {k for k, p in measured.items() if is_side_only(p)}
    out = dataclasses.replace(landscape, points=[])
    held, composed, apart = [], [], 0
    for config in grid:
        key = config_key(config)
        engine, actor = (
            engine_sides.get(_side_key(config, "engine")),
            actor_sides.get(_side_key(config, "actor")),
        )
        guess = None if engine is None or actor is None else compose_point(config, engine, actor)
        if key in measured and key not in side_only:
            out.points.append(measured[key])
            if key not in side_keys and guess is not None:
                held.append((measured[key], guess))
        elif guess is not None:
            out.points.append(guess)
            composed.append(key)
        else:
            apart += 1
    report = _report(held, base, len(grid), len(sides), len(side_only & side_keys), len(composed), apart)
    report["hosts"] = host_kinds((r.software for p in landscape.points for r in p.runs), "not recorded")
    report["run_spread"] = {
        "whole": _spread([p for k, p in measured.items() if k not in side_only]),
        "engine_sides": _spread([measured[k] for k in side_only]),
    }
    out.design = {
        "kind": "composed",
        "base": base,
        "sides": len(sides),
        "held_out": [config_key(m.config) for m, _ in held],
        "composed": composed,
        "composition": {k: v for k, v in report.items() if k != "configs"},
        "from": landscape.command,
    }
    if composed:
        out.label = (
            f"{landscape.label}, {len(composed)} of {len(out.points)} configs composed from measured sides"
        )
    return out, report


def _spread(points: list[LandscapePoint]) -> dict[str, Any]:
    """The run-to-run spread of the configs measured more than once: a config's (max - min)
    over median throughput of its runs, in %, over the configs all of whose runs fit. The
    noise a held-out config's error is to be read against: its measured median carries it,
    and its composed median carries its two sides'."""
    spreads = []
    for point in points:
        values = [throughput(r) or 0.0 for r in point.runs]
        if len(values) > 1 and min(values) > 0:
            spreads.append(100 * (max(values) - min(values)) / statistics.median(values))
    return {"configs": len(spreads), "pct_median": _median(spreads), "pct_max": max(spreads, default=None)}


def _report(
    held: list[tuple[LandscapePoint, LandscapePoint]],
    base: dict[str, Any],
    grid: int,
    sides: int,
    engine_sides: int,
    composed: int,
    apart: int,
) -> dict[str, Any]:
    rows = []
    for measured, guess in held:
        m, g = _value(measured), _value(guess)
        mp, gp = _peak(measured), _peak(guess)
        rows.append(
            {
                "config": measured.config,
                "measured": m,
                "composed": g,
                "runs": [len(measured.runs), len(guess.runs)],
                "error_pct": 100 * (g / m - 1) if m > 0 and g > 0 else None,
                "feasible": [m > 0, g > 0],
                "peak_gib": [mp, gp],
                "peak_error_gib": None if mp is None or gp is None else gp - mp,
            }
        )
    errors = [abs(r["error_pct"]) for r in rows if r["error_pct"] is not None]
    peaks = [abs(r["peak_error_gib"]) for r in rows if r["peak_error_gib"] is not None]
    return {
        "base": base,
        "grid_configs": grid,
        "sides": sides,
        "engine_sides": engine_sides,
        "composed": composed,
        "not_composable": apart,
        "held_out": len(rows),
        "both_feasible": len(errors),
        "abs_error_pct_median": _median(errors),
        "abs_error_pct_max": max(errors) if errors else None,
        "feasibility_mismatches": sum(1 for r in rows if r["feasible"][0] != r["feasible"][1]),
        "abs_peak_error_gib_median": _median(peaks),
        "abs_peak_error_gib_max": max(peaks) if peaks else None,
        "configs": rows,
    }


def _short(config: dict[str, Any], base: dict[str, Any]) -> str:
    """The knob values where ``config`` differs from ``base`` (short names)."""
    parts = [f"{SHORT.get(p, p.rsplit('.', 1)[-1])} {v}" for p, v in config.items() if base.get(p) != v]
    return ", ".join(parts) or "(the base)"


def table(report: dict[str, Any]) -> str:
    alone = report.get("engine_sides")
    how = f"; {alone} of them their engine side alone, composed with the base's actor side" if alone else ""
    lines = [
        f"base: {knobs(report['base'])}",
        f"grid {report['grid_configs']} configs: {report['sides']} on the cross (measured{how}), "
        f"{report['composed']} composed, {report['held_out']} held out (measured, compared), "
        f"{report['not_composable']} not composable",
    ]
    if report["configs"]:
        lines.append(
            f"{'held-out config (where it differs from the base)':<50} {'measured':>9} {'composed':>9} "
            f"{'error':>7} {'peak GiB (m/c)':>15}"
        )
    for row in report["configs"]:
        err = "-" if row["error_pct"] is None else f"{row['error_pct']:+.1f}%"
        mp, gp = row["peak_gib"]
        peak = f"{mp:.1f}/{gp:.1f}" if mp is not None and gp is not None else "-"
        lines.append(
            f"{_short(row['config'], report['base']):<50} {row['measured']:>9.1f} "
            f"{row['composed']:>9.1f} {err:>7} {peak:>15}"
        )
    if report["held_out"]:
        med, worst = report["abs_error_pct_median"], report["abs_error_pct_max"]
        lines.append(
            f"throughput error over the {report['both_feasible']} held-out configs that fit: "
            + ("-" if med is None else f"median {med:.1f}%, worst {worst:.1f}%")
            + f"; feasibility mismatches: {report['feasibility_mismatches']} of {report['held_out']}"
        )
    hosts = report.get("hosts") or {}
    if len(hosts) > 1:
        lines.append(
            f"runs from {len(hosts)} kinds of host ({'; '.join(f'{k}: {n}' for k, n in hosts.items())}): "
            "a config's throughput moves with the host, so its sides and held-out runs may differ by it"
        )
    spread = report.get("run_spread") or {}
    said = [
        f"{what} ({s['configs']}): median {s['pct_median']:.1f}%, worst {s['pct_max']:.1f}%"
        for what, s in (("whole configs", spread.get("whole")), ("engine sides", spread.get("engine_sides")))
        if s and s["configs"]
    ]
    if said:
        lines.append("run-to-run spread of a config's throughput, (max - min) / median: " + "; ".join(said))
    return "\n".join(lines)


def parse_fixed(items: list[str]) -> dict[str, Any]:
    """``--base PATH=VALUE`` items as knob values (JSON values; a bare word is a string)."""
    out: dict[str, Any] = {}
    for item in items:
        path, sep, raw = item.partition("=")
        if not sep or path not in KNOBS:
            raise DesignError(
                f"--base {item!r}: want PATH=VALUE with PATH a knob (e.g. {next(iter(KNOBS))}=...)"
            )
        try:
            out[path] = json.loads(raw)
        except ValueError:
            out[path] = raw
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sides", type=Path, help="A landscape recorded with --design cross, or a full one.")
    parser.add_argument("--out", type=Path, default=None, help="Write the composed landscape here.")
    parser.add_argument("--report", type=Path, default=None, help="Write the composition's report here.")
    parser.add_argument("--base", action="append", default=[], metavar="PATH=VALUE")
    args = parser.parse_args(argv)
    try:
        landscape, report = compose(Landscape.load(args.sides), parse_fixed(args.base))
    except (DesignError, LandscapeError) as exc:
        parser.error(str(exc))
    print(table(report))
    command = "python -m benchmarks.search.compose " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    if args.report is not None:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(json.dumps({"command": command, **report}, indent=1, default=str) + "\n")
        print(f"wrote {args.report}")
    if args.out is not None:
        landscape.command = command
        landscape.save(args.out)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
