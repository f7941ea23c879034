"""Record a landscape: run every config of a job's search space as a real trial.

usage: python -m benchmarks.search.record JOB.yaml OUT.json [--repeats N] [--label TEXT]
                                          [--design cross --held-out K [--base PATH=VALUE ...]]
                                          [--left] [--any-host] [--until WHEN]

Each grid point (``SearchSpace.grid``: every distinct config verl accepts) runs through
the tuner's own executor (a Ray task per trial, ``trials.launcher`` in a fresh process,
the job's ``trial_timeout_s``), exactly as a tuning job runs it; OOMs, timeouts and
errors are recorded as they come. All points run once, in an order shuffled with the job's
seed, then again up to ``--repeats`` runs each. The landscape file is rewritten after
every trial, so a killed recording keeps what it measured, and running the same command
again resumes it (points that have their runs are skipped). Infrastructure failures (GPU
not clean, Ray worker lost) are not recorded; the next run of the command retries them.

Several recorders may fill one landscape at once, say one per GPU of a host
(``CUDA_VISIBLE_DEVICES=k``, each with a local Ray of its own), joining whenever a GPU
frees up: under a lock on ``OUT.lock`` each takes the config with the fewest runs that no
live recorder has claimed (``OUT.claims``), runs it, and merges its run into the file as
it is then. A claim of a recorder that died is taken over by the next one to look.

``--design cross`` records a cross design instead of the whole grid
(``benchmarks.search.compose``): each engine setting beside a base train setting, each
train setting beside a base engine setting, and ``K`` configs off the cross drawn with the
job's seed, held out to measure the composition's error; ``benchmarks.search.compose``
then composes every other config of the grid from them. The engine's arm (each engine
setting beside the base's train setting, the base aside) runs as engine sides alone
(``TrialSpec.engine_side_only``: actor built, no training), the base, the train settings
and the held-out configs as whole trials. The design is stored in the file and a resumed
recording keeps it.

A landscape holds the runs of one kind of host (``trials.device.host_kind``: the processor
model and CPU counts each run records): a small model's rollout and micro-batches are paced
by the host as much as by the GPU, so a recorder refuses to add runs to a file recorded on
another kind of host (``--any-host`` mixes them anyway) and says to record into a file of
its own.

Each recorder says at its start what is left to record, and what that costs at the median
wall time of the runs of each kind recorded so far; ``--left`` says so and stops.

``--until WHEN`` (epoch seconds or an ISO 8601 time) starts no run that is not expected to
end by then: a run is expected to take as long as the longest recorded run of its kind
(engine side or whole, at its tensor-parallel size), or the job's ``trial_timeout_s`` where
none is recorded yet. The recorder takes the next config in its order that fits, and stops
when none does, so a host lent until a known time runs whole trials and is not left with
one cut off at the end.

The same command records on a GPU host: the job's cluster says where trials run and the
executor reserves ``tensor_model_parallel_size`` GPUs per trial.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import json
import os
import random
import shlex
import socket
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from autotuner.errors import AutotunerError
from autotuner.executor import RayExecutor, Resources, cluster_resources, ensure_ray
from autotuner.jobs import build_space, memory_cap_gib, resolve_device
from autotuner.knobs import R
from autotuner.records import config_key
from autotuner.replay import Landscape, LandscapeError, LandscapePoint
from autotuner.settings import get_settings
from autotuner.spec import JobSpec, load_job_spec
from autotuner.telling import INFRA_ERROR_TYPES
from autotuner.trialspec import build_trial_spec
from benchmarks.search.compose import (
    DESIGN,
    SIDE_ONLY,
    DesignError,
    engine_side_only,
    make_design,
    parse_fixed,
)
from trials.device import host_cpus, host_kind, host_kinds
from trials.metrics import THROUGHPUT
from trials.types import BatchDraw


def _label(device: str, measured_on: str) -> str:
    where = "CPU" if device == "cpu" else "GPU"
    return f"{where} landscape, measured on {measured_on}"


def _alive(claim: dict[str, Any]) -> bool:
    """Whether the recorder that made ``claim`` still runs (one on another host is
    assumed to)."""
    if claim.get("host") != socket.gethostname():
        return True
    try:
        os.kill(int(claim["pid"]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Ledger:
    """The landscape file shared by the recorders filling it, and who runs what."""

    def __init__(
        self,
        out: Path,
        spec: JobSpec,
        arch: Any,
        device: str,
        cap: float | None,
        label: str,
        command: str,
        design: dict[str, Any] | None = None,
        host: str | None = None,
    ) -> None:
        self.out = out
        self.host = host  # this host's kind (``trials.device.host_kind``); None: any
        self.lock_path = out.with_name(out.name + ".lock")
        self.claims_path = out.with_name(out.name + ".claims")
        self._new = (spec, arch, device, cap, label, command)
        self.design = design or {}

    @contextlib.contextmanager
    def locked(self, check_host: bool = True) -> Iterator[Landscape]:
        """The landscape as the file holds it now, with the lock held (saved by the caller);
        ``check_host``: refuse a file recorded on another kind of host (``host_mismatch``)."""
        self.out.parent.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if self.out.exists():
                    landscape = Landscape.load(self.out)
                    if landscape.train_order != BatchDraw.train_order:
                        raise LandscapeError(
                            f"{self.out} was recorded with the train sequences in the "
                            f"{landscape.train_order!r} order, and trials now take "
                            f"{BatchDraw.train_order!r}: record into a new file"
                        )
                    if landscape.logits_copied:
                        raise LandscapeError(
                            f"{self.out} was recorded by trials that copied the logits at "
                            "temperature 1.0, and trials now keep them: record into a new file"
                        )
                    why = self.host_mismatch(landscape) if check_host else None
                    if why:
                        raise LandscapeError(why)
                    landscape.command = self._new[5]
                else:
                    landscape = Landscape(*self._new, design=self.design)  # type: ignore[arg-type]
                yield landscape
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def host_mismatch(self, landscape: Landscape) -> str | None:
        """Why this host's runs may not join ``landscape``: it holds runs recorded on another
        kind of host; None where they may (or where ``host`` is None: any host)."""
        if self.host is None:
            return None
        kinds = host_kinds(run.software for point in landscape.points for run in point.runs)
        others = {kind: n for kind, n in kinds.items() if kind != self.host}
        if not others:
            return None
        return (
            f"{self.out} holds runs recorded on another kind of host "
            f"({'; '.join(f'{kind}: {n} runs' for kind, n in others.items())}) and this host is "
            f"{self.host}: a config's throughput moves with the host, so a landscape mixing kinds "
            "of host confounds its knobs with them. Record into a file of this kind of host's "
            "own, or pass --any-host to mix them"
        )

    def claims(self) -> dict[str, dict[str, Any]]:
        """The live claims (call with the lock held): claim id -> {config key, pid, host}."""
        try:
            claims = json.loads(self.claims_path.read_text())
        except (OSError, ValueError):
            return {}
        return {cid: c for cid, c in claims.items() if _alive(c)}

    def write_claims(self, claims: dict[str, dict[str, Any]]) -> None:
        tmp = self.claims_path.with_name(self.claims_path.name + ".tmp")
        tmp.write_text(json.dumps(claims, indent=1) + "\n")
        tmp.replace(self.claims_path)


def next_config(
    grid: list[dict[str, Any]],
    landscape: Landscape,
    claims: dict[str, dict[str, Any]],
    repeats: int,
    skip: set[str],
    seed: int,
    fits: Callable[[dict[str, Any]], bool] = lambda config: True,
) -> dict[str, Any] | None:
    """The config to run next: of those with fewer than ``repeats`` runs, counting the runs
    claimed by live recorders, that ``fits`` (the time left, ``--until``), the one with the
    fewest; None when nothing is left for this recorder (``skip``: configs it saw fail on
    infrastructure). Ties go by the grid shuffled with ``seed``, the same order for every
    recorder and every resumption: a knob's settings then spread over the hosts and hours a
    long recording runs on, instead of one setting per stretch of time, which would confound
    the knob with the host and the hour."""
    runs = {config_key(p.config): len(p.runs) for p in landscape.points}
    for claim in claims.values():
        runs[claim["config"]] = runs.get(claim["config"], 0) + 1
    rank = random.Random(seed).sample(range(len(grid)), len(grid))
    todo = [
        (runs.get(config_key(c), 0), rank[n], n)
        for n, c in enumerate(grid)
        if runs.get(config_key(c), 0) < repeats and config_key(c) not in skip and fits(c)
    ]
    return grid[min(todo)[2]] if todo else None


def _kind(config: dict[str, Any], base: dict[str, Any] | None) -> tuple[bool, int]:
    """A run's kind for its wall time: engine side alone or whole, and its GPUs."""
    side = base is not None and engine_side_only(config, base)
    return side, int(config.get(R + "tensor_model_parallel_size", 1))


def longest_runs(landscape: Landscape) -> dict[tuple[bool, int], float]:
    """The longest wall time recorded of each kind of run (``_kind``; an engine setting's
    run recorded whole counts as whole)."""
    longest: dict[tuple[bool, int], float] = {}
    for point in landscape.points:
        gpus = int(point.config.get(R + "tensor_model_parallel_size", 1))
        for run in point.runs:
            kind = (bool(run.metrics.get(SIDE_ONLY)), gpus)
            longest[kind] = max(longest.get(kind, 0.0), run.wall_s)
    return longest


def fits_until(
    landscape: Landscape, base: dict[str, Any] | None, until: float | None, timeout_s: float, now: float
) -> Callable[[dict[str, Any]], bool]:
    """Whether a config's run, started at ``now``, is expected to end by ``until`` (None: no
    end): it takes as long as the longest recorded run of its kind, else ``timeout_s``."""
    longest = longest_runs(landscape)

    def fits(config: dict[str, Any]) -> bool:
        return until is None or now + longest.get(_kind(config, base), timeout_s) <= until

    return fits


def parse_until(text: str) -> float:
    """``--until``'s time as epoch seconds: epoch seconds, or an ISO 8601 time (UTC unless
    it names its zone)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: want epoch seconds (date +%s) or an ISO 8601 time such as 2026-12-06T05:10:00Z"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp()


def left(grid: list[dict[str, Any]], landscape: Landscape, repeats: int, base: dict[str, Any] | None) -> str:
    """What a recording of ``grid`` (``base``: its cross design's base, None for a whole
    grid) has left to reach ``repeats`` runs a config: runs of engine sides and of whole
    configs, and their cost at the median wall time of each kind's runs recorded so far. With
    more than one run a config asked for, and some config not yet run once, also what is left
    until every config has one run: configs run once before any twice, and one run of each is
    what a first composition (``compose.py``) needs."""
    done = {config_key(p.config): len(p.runs) for p in landscape.points}
    walls: dict[bool, list[float]] = {True: [], False: []}
    for point in landscape.points:
        for run in point.runs:
            walls[bool(run.metrics.get(SIDE_ONLY))].append(run.wall_s)
    medians = {kind: statistics.median(w) for kind, w in walls.items() if w}
    unit = "GPU" if landscape.device == "cuda" else "trial"

    def todo(upto: int) -> tuple[int, int, float | None]:
        """Engine sides and whole runs left to reach ``upto`` runs a config, and their cost
        (None where a kind left has no run recorded to time it by)."""
        runs: dict[bool, list[int]] = {True: [], False: []}  # engine side? -> each run's GPUs
        for config in grid:
            side, gpus = _kind(config, base)
            runs[side] += [gpus] * max(0, upto - done.get(config_key(config), 0))
        timed = all(kind in medians for kind in runs if runs[kind])
        cost = sum(medians[kind] * sum(gpus) for kind, gpus in runs.items() if runs[kind]) if timed else None
        return len(runs[True]), len(runs[False]), cost

    sides, whole, cost = todo(repeats)
    text = f"{sides + whole} runs left: {sides} engine sides, {whole} whole"
    if not sides + whole:
        return text
    if cost is None:
        return text + " (no run of each kind recorded yet to time them by)"
    kinds = ((True, "engine side"), (False, "whole"))
    times = ", ".join(f"{what} {medians[kind]:.0f} s" for kind, what in kinds if kind in medians)
    text += (
        f"; about {cost:,.0f} {unit}-seconds ({cost / 3600:.1f} {unit}-hours) at the median "
        f"wall time of each kind so far ({times})"
    )
    if repeats > 1:
        # the first runs are some of the runs left, so their kinds are timed too
        first_sides, first_whole, first_cost = todo(1)
        if first_sides + first_whole:
            text += (
                f". Of them, {first_sides + first_whole} ({first_sides} engine sides, {first_whole} "
                f"whole, about {first_cost or 0.0:,.0f} {unit}-seconds) give every config its first "
                "run, all a first composition needs"
            )
    return text


def recorded_design(
    out: Path, space: Any, k: int, seed: int, fixed: dict[str, Any]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The cross design to record into ``out`` and its configs: the one the file holds (a
    resumed recording), else a new one (``compose.make_design``)."""
    design, configs = make_design(space, k, seed, fixed)
    if out.exists():
        stored = Landscape.load(out).design
        if stored.get("kind") != DESIGN:
            raise DesignError(f"{out} holds no cross design; record the design into a new file")
        if stored["base"] != design["base"] or stored["held_out"] != design["held_out"]:
            raise DesignError(
                f"{out} holds another cross design (base or held-out configs differ); "
                "run with the options it was recorded with, or into a new file"
            )
    return design, configs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--repeats", type=int, default=1, help="Runs per config (default 1).")
    parser.add_argument("--label", default="", help="What the landscape is (default: device).")
    parser.add_argument(
        "--design", choices=[DESIGN], default=None, help="Record a cross design, not the whole grid."
    )
    parser.add_argument(
        "--held-out", type=int, default=8, metavar="K", help="Configs off the cross to record (default 8)."
    )
    parser.add_argument("--base", action="append", default=[], metavar="PATH=VALUE")
    parser.add_argument("--left", action="store_true", help="Say what is left to record, and stop.")
    parser.add_argument(
        "--until",
        type=parse_until,
        default=None,
        metavar="WHEN",
        help="Start no run not expected to end by then (epoch seconds or ISO 8601; "
        "a run takes as long as the longest recorded of its kind).",
    )
    parser.add_argument(
        "--any-host",
        action="store_true",
        help="Add runs to a landscape recorded on another kind of host (default: refuse).",
    )
    args = parser.parse_args(argv)
    if args.base and args.design is None:
        parser.error("--base sets a cross design's base; add --design cross")
    if args.held_out < 0:
        parser.error(f"--held-out {args.held_out}: want 0 or more configs off the cross")
    command = "python -m benchmarks.search.record " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )

    settings = get_settings()
    try:
        spec = load_job_spec(args.job)
        device = resolve_device(spec)
        cap = memory_cap_gib(spec, device, settings)
        space = build_space(spec, device, settings)
    except AutotunerError as exc:  # the job file: unreadable, or a field it gets wrong
        parser.error(str(exc))
    grid = space.grid()
    design: dict[str, Any] = {}
    if args.design is None and args.out.exists() and Landscape.load(args.out).design:
        parser.error(f"{args.out} holds a cross design; record into it with --design cross")
    if args.design is not None:
        try:
            design, grid = recorded_design(args.out, space, args.held_out, spec.seed, parse_fixed(args.base))
        except DesignError as exc:
            parser.error(str(exc))
        print(
            f"cross design of the {len(space.grid())}-config grid: {design['sides']} configs on the "
            f"cross, {len(design['held_out'])} held out",
            flush=True,
        )
    host = None if args.any_host else host_kind(host_cpus())
    ledger = Ledger(args.out, spec, space.arch, device, cap, args.label, command, design, host)
    try:  # --left only reads: it says where this host could not record, and goes on
        with ledger.locked(check_host=not args.left) as landscape:
            done = sum(min(len(p.runs), args.repeats) for p in landscape.points)
            remaining = left(grid, landscape, args.repeats, design.get("base"))
            mismatch = ledger.host_mismatch(landscape)
    except LandscapeError as exc:
        parser.error(str(exc))
    total = len(grid) * args.repeats
    print(
        f"{len(grid)} configs x {args.repeats} runs; {done} runs recorded already in {args.out}", flush=True
    )
    print(remaining, flush=True)
    if args.left:
        if mismatch:
            print(f"(not here: {mismatch})", flush=True)
        return 0

    ensure_ray(settings.ray_address, settings.ray_num_cpus)
    cpus = max(1.0, cluster_resources().get("CPU", 1.0) // spec.budget.max_concurrent_trials)
    executor = RayExecutor(trial_python=settings.trial_python, trial_env=settings.trial_env())
    started, me, skip, n = time.monotonic(), f"{socket.gethostname()}-{os.getpid()}", set(), 0
    base = design.get("base")
    while True:
        with ledger.locked() as landscape:
            claims = ledger.claims()
            fits = fits_until(landscape, base, args.until, spec.budget.trial_timeout_s, time.time())
            config = next_config(grid, landscape, claims, args.repeats, skip, spec.seed, fits)
            if config is None:
                if args.until is not None and next_config(
                    grid, landscape, claims, args.repeats, skip, spec.seed
                ):
                    by = datetime.datetime.fromtimestamp(args.until, datetime.timezone.utc)
                    print(
                        f"no run left is expected to end by {by:%Y-%m-%d %H:%M:%S} UTC (--until): stopping",
                        flush=True,
                    )
                break
            key = config_key(config)
            claims[f"{me}-{n}"] = {"config": key, "pid": os.getpid(), "host": socket.gethostname()}
            ledger.write_claims(claims)
        trial_id = f"{spec.name}-{os.getpid()}-{n}"
        trial = build_trial_spec(spec, space.arch, config, trial_id, device, cap)
        trial.engine_side_only = bool(design) and engine_side_only(config, design["base"])
        tp = int(config.get(R + "tensor_model_parallel_size", 1))
        resources = Resources(num_cpus=1, num_gpus=tp) if device == "cuda" else Resources(cpus)
        executor.submit(trial, resources, spec.budget.trial_timeout_s)
        results = []
        while not results:
            results = executor.wait(timeout_s=5.0)
        result = results[0]
        with ledger.locked() as landscape:
            claims = ledger.claims()
            claims.pop(f"{me}-{n}", None)
            ledger.write_claims(claims)
            n += 1
            if result.status == "error" and result.error_type in INFRA_ERROR_TYPES:
                skip.add(key)
                print(f"  {trial_id}: infra error ({result.error_type}), not recorded", flush=True)
                continue
            point = next((p for p in landscape.points if config_key(p.config) == key), None)
            if point is None:
                point = LandscapePoint(config, [])
                landscape.points.append(point)
            point.runs.append(result)
            if result.device and not landscape.label:
                landscape.label = _label(device, result.device)
            landscape.recorded_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            landscape.save(args.out)
            done = sum(min(len(p.runs), args.repeats) for p in landscape.points)
        tput = result.metrics.get(THROUGHPUT)
        side = " (engine side)" if trial.engine_side_only else ""
        print(
            f"  {done}/{total} {trial_id}{side} {result.status:<7} {tput or 0:10.1f} tok/s  "
            f"peak {result.metrics.get('peak_memory_gib', 0):6.2f} GiB "
            f"wall {result.wall_s:6.1f} s  ({(time.monotonic() - started) / 60:.1f} min)",
            flush=True,
        )
    with ledger.locked() as landscape:
        print(
            f"{args.out}: {len(landscape.points)} configs, "
            f"{sum(len(p.runs) for p in landscape.points)} runs; this recorder ran {n}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
