"""Record a landscape: run every config of a job's search space as a real trial.

usage: python -m benchmarks.search.record JOB.yaml OUT.json [--repeats N] [--label TEXT]

Each grid point (``SearchSpace.grid``: every distinct config verl accepts) runs through
the tuner's own executor (a Ray task per trial, ``trials.launcher`` in a fresh process,
the job's ``trial_timeout_s``), exactly as a tuning job runs it; OOMs, timeouts and
errors are recorded as they come. All points run once, then again up to ``--repeats``
runs each. The landscape file is rewritten after every trial, so a killed recording
keeps what it measured, and running the same command again resumes it (points that have
their runs are skipped). Infrastructure failures (GPU not clean, Ray worker lost) are
not recorded; the next run of the command retries them.

The same command records on a GPU host: the job's cluster says where trials run and the
executor reserves ``tensor_model_parallel_size`` GPUs per trial.
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import sys
import time
from pathlib import Path

from autotuner.executor import RayExecutor, Resources, cluster_resources, ensure_ray
from autotuner.jobs import build_space, memory_cap_gib, resolve_device
from autotuner.knobs import R
from autotuner.replay import Landscape, LandscapePoint
from autotuner.settings import get_settings
from autotuner.spec import load_job_spec
from autotuner.study import INFRA_ERROR_TYPES, config_key
from autotuner.trialspec import build_trial_spec


def _label(device: str, measured_on: str) -> str:
    where = "CPU" if device == "cpu" else "GPU"
    return f"{where} landscape, measured on {measured_on}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--repeats", type=int, default=1, help="Runs per config (default 1).")
    parser.add_argument("--label", default="", help="What the landscape is (default: device).")
    args = parser.parse_args(argv)
    command = "python -m benchmarks.search.record " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))

    settings = get_settings()
    spec = load_job_spec(args.job)
    device = resolve_device(spec)
    cap = memory_cap_gib(spec, device, settings)
    space = build_space(spec, device, settings)
    grid = space.grid()
    if args.out.exists():
        landscape = Landscape.load(args.out)
        landscape.command = command
    else:
        landscape = Landscape(spec, space.arch, device, cap, args.label, command)
    points = {config_key(p.config): p for p in landscape.points}
    print(f"{len(grid)} configs x {args.repeats} runs; {sum(len(p.runs) for p in points.values())} "
          f"runs recorded already in {args.out}", flush=True)

    ensure_ray(settings.ray_address, settings.ray_num_cpus)
    cpus = max(1.0, cluster_resources().get("CPU", 1.0) // spec.budget.max_concurrent_trials)
    executor = RayExecutor(trial_python=settings.trial_python, trial_env=settings.trial_env())
    started = time.monotonic()
    for round_ in range(args.repeats):
        todo = [c for c in grid if len(points.get(config_key(c), LandscapePoint(c, [])).runs) <= round_]
        for n, config in enumerate(todo):
            trial_id = f"{spec.name}-r{round_}-{n}"
            trial = build_trial_spec(spec, space.arch, config, trial_id, device, cap)
            tp = int(config.get(R + "tensor_model_parallel_size", 1))
            resources = Resources(num_cpus=1, num_gpus=tp) if device == "cuda" else Resources(cpus)
            executor.submit(trial, resources, spec.budget.trial_timeout_s)
            results = []
            while not results:
                results = executor.wait(timeout_s=5.0)
            result = results[0]
            if result.status == "error" and result.error_type in INFRA_ERROR_TYPES:
                print(f"  {trial_id}: infra error ({result.error_type}), not recorded", flush=True)
                continue
            point = points.setdefault(config_key(config), LandscapePoint(config, []))
            if point not in landscape.points:
                landscape.points.append(point)
            point.runs.append(result)
            if result.device and not landscape.label:
                landscape.label = _label(device, result.device)
            landscape.recorded_at = datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds")
            landscape.save(args.out)
            tput = result.metrics.get("throughput_tokens_per_s_per_gpu")
            print(f"  [{round_ + 1}/{args.repeats}] {n + 1}/{len(todo)} {result.status:<7} "
                  f"{tput or 0:10.1f} tok/s  peak {result.metrics.get('peak_memory_gib', 0):6.2f} GiB "
                  f"wall {result.wall_s:6.1f} s  ({(time.monotonic() - started) / 60:.1f} min)",
                  flush=True)
    print(f"wrote {args.out}: {len(landscape.points)} configs, "
          f"{sum(len(p.runs) for p in landscape.points)} runs", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
