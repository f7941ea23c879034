"""``python -m trials.verl preflight|run --spec SPEC.json --out OUT.json --workdir DIR
--cache-dir DIR --ray-temp-dir DIR``, ``python -m trials.verl checkpoint --spec SPEC.json
--cache-dir DIR`` and ``python -m trials.verl cut [--wait] --spec PLAN.json --out OUT.json``
in verl's environment.

``checkpoint`` writes the run's random checkpoint into the cache folder if it is not there
yet (``trials.verl.checkpoint``), so that a run's deadline does not pay for it.

``preflight`` writes the run's files, composes the config and runs verl's own checks on it,
and writes what it checked as JSON (a list, one report per ``--spec``); ``run`` then runs
verl's trainer and writes the ``VerlRunResult``; ``cut`` times verl's cut of a rank's batch
into micro-batches per phase (``trials.verl.cut``; with ``--wait`` it readies the batch, says
``ready`` and times the cut on a line ``go``). Run by ``trials.verl.launch`` as the
leader of a process session of its own: on SIGTERM (the launcher's deadline, or its
parent's death: the kernel sends it then) it kills its whole group, verl's trainer and
verl's Ray with it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

from trials.launcher import sigterm_when_parent_dies
from trials.verl.checkpoint import ensure_checkpoint
from trials.verl.cut import CutPlan, cut_seconds, prepared_batch
from trials.verl.runner import preflight, run, run_paths
from trials.verl.types import VerlRunSpec


def _die_with_group() -> None:
    if os.getpgrp() != os.getpid():
        return  # run by hand inside someone else's group: leave signals alone

    def kill_group(signum: int, frame: object) -> None:
        os.killpg(os.getpgrp(), signal.SIGKILL)

    signal.signal(signal.SIGTERM, kill_group)
    sigterm_when_parent_dies()


def _write(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    Path(tmp).write_text(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trials.verl")
    parser.add_argument("command", choices=("preflight", "run", "checkpoint", "cut"))
    parser.add_argument("--spec", required=True, action="append", help="preflight: one or more")
    parser.add_argument("--out", help="required but for checkpoint")
    parser.add_argument("--workdir")
    parser.add_argument("--cache-dir")
    parser.add_argument("--ray-temp-dir")
    parser.add_argument(
        "--wait", action="store_true", help="cut: say ready, then time the cut on a line 'go'"
    )
    parser.add_argument(
        "--config-only",
        action="store_true",
        help="preflight: a checkpoint of config and tokenizer, no weights",
    )
    args = parser.parse_args(argv)
    if args.command != "checkpoint" and not args.out:
        parser.error(f"{args.command} needs --out")
    if args.command == "cut":
        sigterm_when_parent_dies()  # a trial killed meanwhile leaves no cut behind
        plan = CutPlan(**json.loads(Path(args.spec[0]).read_text()))
        batch = prepared_batch(plan)
        if args.wait:  # ready: time the cut when told to (a closed input: not at all)
            print("ready", flush=True)
            if sys.stdin.readline().strip() != "go":
                return 0
        partitions: dict[str, list[list[list[int]]]] = {}
        seconds = cut_seconds(plan, batch, partitions=partitions)
        _write(args.out, json.dumps({"seconds": seconds, "partitions": partitions}))
        return 0
    if args.command == "checkpoint":
        if not args.cache_dir:
            parser.error("checkpoint needs --cache-dir")
        _die_with_group()
        for path in args.spec:
            spec = VerlRunSpec.from_json(Path(path).read_text())
            ensure_checkpoint(spec.model_config, spec.model_name, spec.dtype, Path(args.cache_dir))
        return 0
    missing = [
        f"--{name.replace('_', '-')}"
        for name in ("workdir", "cache_dir", "ray_temp_dir")
        if not getattr(args, name)
    ]
    if missing:
        parser.error(f"{args.command} needs {', '.join(missing)}")
    _die_with_group()
    specs = [VerlRunSpec.from_json(Path(path).read_text()) for path in args.spec]
    if args.command == "preflight":  # one report per spec, in order; a refusal is reported
        reports = []
        for spec in specs:
            workdir = Path(args.workdir) / spec.run_id
            paths = run_paths(
                spec, workdir, Path(args.cache_dir), Path(args.ray_temp_dir), not args.config_only
            )
            try:
                reports.append(preflight(spec, paths, weights=not args.config_only))
            except Exception as exc:  # noqa: BLE001  (verl's checks raise many types)
                reports.append({"error": f"{type(exc).__name__}: {exc}"})
        _write(args.out, json.dumps(reports))
        return 0
    if len(specs) != 1:
        parser.error("run takes one --spec")
    spec = specs[0]
    paths = run_paths(spec, Path(args.workdir), Path(args.cache_dir), Path(args.ray_temp_dir))
    paths.workdir.mkdir(parents=True, exist_ok=True)
    result = run(spec, paths)
    _write(args.out, result.to_json())
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
