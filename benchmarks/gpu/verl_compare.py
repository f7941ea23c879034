"""Configs measured by the tuner's trial and by verl itself, on the same host, interleaved.

For one job spec and a few named configs (``defaults``: verl v0.9's defaults as the job's
first baseline; ``example``: verl's example command for the model's size, the job's second
baseline; ``NAME=RESULTS.json#TRIAL``: a trial's config from a results file written by
``dump_results``; ``NAME=defaults`` / ``NAME=example``: a copy of a baseline, to be changed
with ``--set NAME:KEY=VALUE``, e.g. the rollout's TP with everything else fixed), each
round runs, config after config:

- the tuner's trial of that config (``trials.launcher.launch_trial``, the trial spec the
  job's runner would build: its predicted step throughput and phase times, verl's own cut
  into micro-batches counted in unless ``--no-verl-cut``), unless ``--no-predict``;
- verl's own trainer on that config (``trials.verl.launch.launch_verl``: the exported
  overrides plus the runner's model, data and agent loop), ``--steps`` steps, the first a
  warm-up, unless the config is named by ``--skip-verl``; with ``--trace``, its workers'
  own record of each log-prob pass and update (``trials.verl.trace``) comes with it. Every
  step runs the batch the trial runs (``VerlRunSpec.repeat_batch``); ``--fresh-batches``
  draws the job's next batch for each step instead (the behaviour before 2026-12-06).

The host's speed at driving its GPU (``host_speed.py``: microseconds per small op, in a process
of its own, so that the comparison holds no GPU) is measured before the first run and after
the last (``host_speed``: ``start``, ``end``): a host whose CPUs drive the GPU slower slows a
launch-bound step, the trials' and verl's unequally.

Each run starts once no process holds the comparison's GPUs (the last run's killed workers
may still be handing memory back; at most ``SETTLE_S``): its row records what they held then
(``gpus_held_before``) and the wait (``gpus_waited_s``).

``--train-batch-size`` / ``--ppo-mini-batch-size`` scale the job's workload (same lengths,
fewer prompts per step) when a full step of the job is too long to repeat. The JSON file
is rewritten after every run (a run killed mid-way leaves the earlier ones); the table
printed at the end sets, per config, the trial's prediction beside verl's medians and the
error per phase.

On a host with several GPUs, ``verl-lanes.sh`` runs one comparison per GPU side by side and
``merge`` makes them one file and one table; ``recover`` rebuilds a verl run's row from the
folder it left (its ``metrics.jsonl`` and trace, ``poll.sh`` packs them) when the comparison
did not live to write it, status ``partial``, the steps verl had logged.

Usage, on the GPU host with vLLM's folder in ``/tmp/site`` and verl's in ``/tmp/site-verl``
(``setup-host.sh``, ``setup-verl.sh``)::

    PYTHONPATH=/tmp/site:$PWD python3 -m benchmarks.gpu.verl_compare \\
        --job benchmarks/jobs/qwen2.5-1.5b-grpo.yaml --train-batch-size 32 \\
        --ppo-mini-batch-size 8 --config defaults --config example \\
        --config winner=benchmarks/results/qwen2.5-1.5b-grpo-packed-h200.json#2 \\
        --out /tmp/at/verl/compare.json
    python3 -m benchmarks.gpu.verl_compare merge LANE.json [LANE.json ...] --out compare.json
    python3 -m benchmarks.gpu.verl_compare recover RUN_DIR --config NAME --like LANE.json \\
        --command "..." [--gpus N] [--version verl=0.9.1 ...] --out LANE.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError

from autotuner.baselines import citation, example_baseline
from autotuner.errors import AutotunerError
from autotuner.jobs import build_space, memory_cap_gib
from autotuner.knobs import KNOBS, R
from autotuner.rules import violations
from autotuner.settings import Settings
from autotuner.space import KNOB_TYPES
from autotuner.spec import JobSpec, load_job_spec
from autotuner.trialspec import build_trial_spec
from autotuner.verl_run import verl_run_spec
from trials.device import host_cpus
from trials.launcher import launch_trial
from trials.memory import gpu_readings
from trials.profiling import PROFILE_ENV
from trials.step import VERL_TIMERS, as_verl_timers
from trials.verl.launch import launch_verl
from trials.verl.metrics import read_arrivals, read_steps, summarize
from trials.verl.trace import PASS_PHASES, micro_batches, read_trace

THROUGHPUT = "throughput_tokens_per_s_per_gpu"
TP_KEY = R + "tensor_model_parallel_size"
SETTLE_S = 120.0  # the longest a run waits for the last one's processes to leave its GPUs


def scaled(spec: JobSpec, train_batch_size: int | None, mini_batch: int | None) -> JobSpec:
    """The job with fewer prompts per step (lengths, seed and everything else kept)."""
    if train_batch_size is None and mini_batch is None:
        return spec
    data = spec.model_dump(mode="json")
    if train_batch_size is not None:
        data["workload"]["train_batch_size"] = train_batch_size
    if mini_batch is not None:
        data["workload"]["ppo_mini_batch_size"] = mini_batch
    return JobSpec.model_validate(data)


def named_configs(
    spec: JobSpec, names: list[str], settings: Settings, sets: list[str] | None = None
) -> dict[str, dict[str, Any]]:
    """Each named config in full (the job's fixed knobs, then the baseline or trial's own),
    then the knobs ``sets`` gives it (``NAME:KEY=VALUE``). ``NAME=defaults`` and
    ``NAME=example`` name a copy of a baseline, so that one baseline can run with one knob
    moved (e.g. the rollout's TP). Raises ``ValueError`` naming what is wrong."""
    space = build_space(spec, "cuda", settings)
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        label, _, source = name.partition("=")
        source = source or label
        if source == "defaults":
            out[label] = space.completed({})
        elif source == "example":
            allowed = {p: [v] for p, v in space.fixed.items()} | space.searched
            example = example_baseline(space.arch.num_parameters, allowed)
            print(f"example: {citation(example)}", flush=True)
            out[label] = space.completed(example.config)
        elif "#" in source:
            path, _, number = source.partition("#")
            trials = [t for job in json.loads(Path(path).read_text())["jobs"] for t in job["trials"]]
            trial = next((t for t in trials if str(t["number"]) == number), None)
            if trial is None:
                raise ValueError(f"--config {name}: {path} has no trial {number}")
            out[label] = space.completed(trial["config"])
        else:
            raise ValueError(
                f"--config {name}: give defaults, example, NAME=defaults|example or NAME=FILE#TRIAL"
            )
    for item in sets or []:
        label, key, value = _setting(item)
        if label not in out:
            raise ValueError(f"--set {item}: no config {label!r} (configs: {', '.join(out)})")
        out[label] = space.completed(out[label] | {key: value})
        broken = violations(out[label], spec.workload, spec.cluster, space.arch)
        if broken:
            why = "; ".join(f"{v.key}: {v.message}" for v in broken)
            raise ValueError(f"--set {item}: verl would refuse config {label!r}: {why}")
    return out


def _setting(item: str) -> tuple[str, str, Any]:
    """``NAME:KEY=VALUE`` as (name, knob path, value of the knob's type)."""
    label, _, assignment = item.partition(":")
    key, eq, raw = assignment.partition("=")
    if not (label and eq):
        raise ValueError(f"--set {item}: write NAME:KEY=VALUE, e.g. tp4:{TP_KEY}=4")
    knob = KNOBS.get(key)
    if knob is None:
        raise ValueError(f"--set {item}: {key!r} is not a knob the tuner knows (autotuner/knobs.py)")
    try:
        value = TypeAdapter(KNOB_TYPES[knob.kind]).validate_python(
            yaml.safe_load(raw), strict=knob.kind == "bool"
        )
    except (ValidationError, yaml.YAMLError):
        raise ValueError(f"--set {item}: {raw!r} is not of type {knob.kind}") from None
    return label, key, value


def gpus_held(visible: str | None) -> list[dict[str, Any]] | None:
    """What each GPU of the comparison holds (memory, processes) as a run starts: a run that
    fails right after another one did can be told from one that found its GPUs taken."""
    readings = gpu_readings(visible)
    if readings is None:
        return None
    return [
        {
            "gpu": r.gpu,
            "used_gib": round(r.used_gib, 2),
            "processes": [f"{p.pid} {p.name} {p.used_gib or 0:.2f} GiB" for p in r.processes],
        }
        for r in readings
    ]


def settled_gpus(
    visible: str | None, timeout_s: float = SETTLE_S
) -> tuple[list[dict[str, Any]] | None, float]:
    """``gpus_held`` once no process holds the comparison's GPUs any more (the last run's
    killed workers may still be handing their memory back), or at ``timeout_s``; with the
    seconds waited."""
    start = time.monotonic()
    while True:
        held = gpus_held(visible)
        waited = time.monotonic() - start
        if held is None or not any(g["processes"] for g in held) or waited >= timeout_s:
            return held, round(waited, 1)
        time.sleep(2)


def trial_row(result: Any) -> dict[str, Any]:
    failed = result.status != "ok"
    return {
        "status": result.status,
        "phase": result.phase if failed else None,
        "error_type": result.error_type if failed else None,
        "log_tail": result.log_tail[-6000:] if failed else "",
        "throughput": result.metrics.get(THROUGHPUT),
        "step_time_s": result.metrics.get("step_time_s"),
        "phase_timings_s": dict(result.phase_timings_s),
        "peak_memory_gib": result.metrics.get("peak_memory_gib"),
        "train_peak_memory_gib": result.metrics.get("train_peak_memory_gib"),
        "software": dict(result.software or {}),
        "metrics": dict(result.metrics),
        "error": result.error_message,
        "wall_s": result.wall_s,
    }


def verl_row(result: Any) -> dict[str, Any]:
    return {
        "status": result.status,
        "measured": dict(result.measured),
        "steps": list(result.steps),
        "versions": dict(result.versions),
        "error": result.error_message,
        "log_tail": result.log_tail[-6000:] if not result.ok else "",
        "wall_s": result.wall_s,
        "startup_s": result.startup_s,
        "checkpoint_s": result.checkpoint_s,
        "step_logged_at_s": list(result.step_logged_at_s),
        "trace": list(result.trace),
    }


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def table(doc: dict[str, Any]) -> str:
    """Per config: the trial's prediction, verl's median over all measured steps of all its
    runs, and the prediction's error (trial / verl - 1). Trials of several actor strategies
    (``--actor-strategy`` given more than once) get one prediction and error column each.
    Where the trials timed their micro-batches or verl's runs were traced, a row per
    sub-phase sets a micro-batch's mean seconds beside verl's (``<sub-phase> s/mb``: the
    median of the trials' means; the mean of verl's micro-batches in its measured steps)."""
    strategies = sorted({r.get("strategy") or "" for r in doc["runs"] if r["kind"] == "trial"}) or [""]
    many = len(strategies) > 1
    if many:
        cols = "".join(f" {'trial ' + s:>12} {'error':>8}" for s in strategies)
        head = f"{'config':<10} {'metric':<24}{cols} {'verl':>10}  n(verl steps)"
    else:
        head = f"{'config':<10} {'metric':<24} {'trial':>10} {'verl':>10} {'error':>8}  n(verl steps)"
    lines = [head, "-" * len(head)]
    for name in doc["configs"]:
        ok = [r for r in doc["runs"] if r["config"] == name and r["kind"] == "trial" and r["status"] == "ok"]
        verls = [r for r in doc["runs"] if r["config"] == name and r["kind"] == "verl"]
        steps = [s for r in verls for s in r["steps"][r.get("warmup_steps", 1) :]]
        pairs = [("throughput/GPU", THROUGHPUT, "perf/throughput")]
        pairs += [("+".join(parts), key, key) for key, parts in VERL_TIMERS.items()]
        pairs += [("step_s", "step_time_s", "timing_s/step")]
        per_mb: dict[str, list[float]] = {}
        for r in verls:
            if r.get("trace") and r["steps"]:
                found = micro_batches(r["trace"], len(r["steps"]), r.get("warmup_steps", 1))
                for phase, (seconds, _) in found.items():
                    per_mb.setdefault(phase, []).extend(seconds)
        for phase in PASS_PHASES.values():
            key = f"{phase}_micro_batch_s_mean"
            if phase in per_mb or any(key in r.get("metrics", {}) for r in ok):
                pairs.append((f"{phase} s/mb", key, key))
        for label, tkey, vkey in pairs:
            if tkey.endswith("_micro_batch_s_mean"):
                phase = tkey.removesuffix("_micro_batch_s_mean")
                v = statistics.mean(per_mb[phase]) if per_mb.get(phase) else None
            else:
                v = median([s[vkey] for s in steps if vkey in s])
            vs = f"{v:.4g}" if v is not None else "-"
            cells = []
            for strategy in strategies:
                trials = [r for r in ok if (r.get("strategy") or "") == strategy]
                timers = [as_verl_timers(r["phase_timings_s"]) for r in trials]
                if tkey in (THROUGHPUT, "step_time_s"):
                    t = median([r["throughput"] if tkey == THROUGHPUT else r["step_time_s"] for r in trials])
                elif tkey.endswith("_micro_batch_s_mean"):
                    t = median([r["metrics"][tkey] for r in trials if tkey in r.get("metrics", {})])
                else:
                    t = median([p[tkey] for p in timers if tkey in p])
                cells.append((f"{t:.4g}" if t is not None else "-", f"{t / v - 1:+.1%}" if t and v else "-"))
            if many:
                row = "".join(f" {ts:>12} {err:>8}" for ts, err in cells)
                lines.append(f"{name:<10} {label:<24}{row} {vs:>10}  {len(steps)}")
            else:
                ts, err = cells[0]
                lines.append(f"{name:<10} {label:<24} {ts:>10} {vs:>10} {err:>8}  {len(steps)}")
    return "\n".join(lines)


def merge(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Comparisons run side by side (one per GPU of a host, ``verl-lanes.sh``) as one: every
    run, each config once, and the table over all of them."""
    configs: dict[str, Any] = {}
    for d in docs:
        for name, config in d["configs"].items():
            if configs.setdefault(name, config) != config:
                raise ValueError(f"config {name!r} differs between the comparisons merged")
    hosts = {d["host"] for d in docs}
    if len(hosts) != 1:
        raise ValueError(f"comparisons from different hosts ({sorted(hosts)}) are not merged")
    if len({json.dumps(d["workload"], sort_keys=True) for d in docs}) != 1:
        raise ValueError("comparisons of different workloads are not merged")
    out: dict[str, Any] = {
        "commands": [d["command"] for d in docs],
        "job": docs[0]["job"],
        "workload": docs[0]["workload"],
        "configs": configs,
        "host": docs[0]["host"],
        "lanes": [
            {
                "gpus": d.get("gpus"),
                "host_cpus": d.get("host_cpus"),
                "started": d["started"],
                "finished": d.get("finished"),
                "host_speed": d.get("host_speed"),  # each lane's own, measured beside the others
            }
            for d in docs
        ],
        "runs": [r | {"gpus": r.get("gpus", d.get("gpus"))} for d in docs for r in d["runs"]],
    }
    out["table"] = table(out)
    return out


HOST_SPEED_OPS = 100_000  # as the host-speed figures of results/host-speed-h200.json


def host_speed_now(ops: int = HOST_SPEED_OPS, timeout_s: float = 120) -> dict[str, Any]:
    """``host_speed.py``'s figures for this host now, measured in a process of its own; on
    failure, what went wrong (``error``), so that a comparison never stops for it."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "speed.json"
        command = [sys.executable, "-m", "benchmarks.gpu.host_speed", "--ops", str(ops), "--out", str(out)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return {"error": f"host_speed.py took over {timeout_s:.0f} s"}
        if done.returncode != 0 or not out.exists():
            return {"error": f"host_speed.py exited with {done.returncode}: {done.stderr.strip()[-500:]}"}
        found: dict[str, Any] = json.loads(out.read_text())
        found["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return found


def recovered_row(run_dir: Path, config: str, warmup_steps: int, versions: dict[str, str]) -> dict[str, Any]:
    """A verl run's row rebuilt from its run folder (``metrics.jsonl``, ``trace/``, ``verl.log``
    where present) when ``verl_compare`` did not live to write it: the steps verl had logged,
    their medians after the warm-up, status ``partial``."""
    steps, measured = summarize(read_steps(run_dir / "metrics.jsonl", run_dir / "verl.log"), warmup_steps)
    if len(steps) <= warmup_steps:
        raise ValueError(f"{run_dir} holds {len(steps)} logged step(s): none after the warm-up")
    return {
        "status": "partial",
        "measured": measured,
        "steps": steps,
        "versions": versions,
        "error": f"recovered from the run folder after {len(steps)} logged step(s); the run did not end",
        "log_tail": "",
        "wall_s": None,
        "trace": read_trace(run_dir / "trace"),
        "step_logged_at_s": read_arrivals(run_dir / "arrivals.json"),
        "config": config,
        "kind": "verl",
        "round": 0,
        "warmup_steps": warmup_steps,
    }


def recover(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu.verl_compare recover")
    parser.add_argument("run_dir", type=Path, help="the verl run's folder (its metrics.jsonl and trace/)")
    parser.add_argument("--config", required=True, help="the config it ran")
    parser.add_argument(
        "--like", type=Path, required=True, help="a comparison of the same job on the same host"
    )
    parser.add_argument("--command", required=True, help="the verl_compare command that started it")
    parser.add_argument("--gpus", help="its CUDA_VISIBLE_DEVICES")
    parser.add_argument("--version", action="append", default=[], help="NAME=VERSION of what it ran on")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    like = json.loads(args.like.read_text())
    if args.config not in like["configs"]:
        raise SystemExit(f"--config {args.config!r} is not among {sorted(like['configs'])} in {args.like}")
    versions = dict(v.split("=", 1) for v in args.version)
    row = recovered_row(args.run_dir, args.config, 1, versions) | {"gpus": args.gpus}
    doc = {
        "command": args.command,
        "job": like["job"],
        "workload": like["workload"],
        "configs": {args.config: like["configs"][args.config]},
        "host": like["host"],
        "gpus": args.gpus,
        "started": like["started"],  # lanes start together: the sibling's start is its own
        "runs": [row],
    }
    args.out.write_text(json.dumps(doc, indent=1, default=str))
    print(table(doc))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["recover"]:
        return recover(argv[1:])
    if argv[:1] == ["merge"]:
        merger = argparse.ArgumentParser(prog="python -m benchmarks.gpu.verl_compare merge")
        merger.add_argument("inputs", nargs="+")
        merger.add_argument("--out", required=True)
        margs = merger.parse_args(argv[1:])
        merged = merge([json.loads(Path(p).read_text()) for p in margs.inputs])
        Path(margs.out).write_text(json.dumps(merged, indent=1, default=str))
        print(merged["table"])
        return 0
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu.verl_compare")
    parser.add_argument("--job", required=True)
    parser.add_argument(
        "--config",
        action="append",
        required=True,
        help="defaults | example | NAME=defaults | NAME=example | NAME=FILE#TRIAL",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE",
        help=f"a knob of config NAME moved, e.g. tp4:{TP_KEY}=4 (with --config tp4=defaults)",
    )
    parser.add_argument("--train-batch-size", type=int)
    parser.add_argument("--ppo-mini-batch-size", type=int)
    parser.add_argument("--steps", type=int, default=4, help="verl steps per run, the first a warm-up")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--verl-rounds", type=int, help="rounds that run verl too (default: all); later ones trials only"
    )
    parser.add_argument("--no-predict", action="store_true")
    parser.add_argument("--skip-verl", action="append", default=[], help="a config not run in verl")
    parser.add_argument("--skip-trial", action="append", default=[], help="a config given no trial")
    parser.add_argument(
        "--trace",
        action="store_true",
        help="record where verl's workers spend their passes (trials.verl.trace)",
    )
    parser.add_argument(
        "--no-verl-cut", action="store_true", help="trials leave out verl's cut into micro-batches"
    )
    parser.add_argument(
        "--profile",
        help="a folder for profiles of a few update micro-batches of each trial and verl run "
        "(trials.profiling; with --trace); their phase times are then not measurements",
    )
    parser.add_argument(
        "--actor-strategy",
        action="append",
        choices=("fsdp", "fsdp2"),
        help="the FSDP the trials build the actor and the ref with (default: the trials' own); "
        "given more than once, each config gets one trial per strategy in each round",
    )
    parser.add_argument(
        "--no-expandable-segments",
        action="store_true",
        help="the trials train with the CUDA allocator's default, not with the expandable "
        "segments verl's training worker turns on (a control)",
    )
    parser.add_argument(
        "--fresh-batches",
        action="store_true",
        help="each verl step draws the job's next batch (default: every step runs the batch the "
        "trials run, so a trial's error against verl is its own)",
    )
    parser.add_argument("--trial-timeout", type=float, default=600)
    parser.add_argument("--verl-timeout", type=float, default=900)
    parser.add_argument("--verl-pythonpath", default=os.environ.get("AUTOTUNER_ENGINE_PYTHONPATH__VERL", ""))
    parser.add_argument("--cache-dir", default="/tmp/at/verl-cache")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.profile and not args.trace:
        parser.error("--profile profiles verl's workers through its trace: give --trace too")

    settings = Settings()
    try:
        spec = scaled(load_job_spec(Path(args.job)), args.train_batch_size, args.ppo_mini_batch_size)
        arch = spec.validate_model()
    except AutotunerError as exc:  # the job file: unreadable, or a field it gets wrong
        parser.error(str(exc))
    try:
        configs = named_configs(spec, args.config, settings, args.set)
    except ValueError as exc:
        parser.error(str(exc))
    cap = memory_cap_gib(spec, "cuda", settings)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = "PYTHONPATH=/tmp/site:$PWD python3 -m benchmarks.gpu.verl_compare " + " ".join(argv)
    doc: dict[str, Any] = {
        "command": command,
        "job": args.job,
        "workload": spec.workload.model_dump(mode="json"),
        "configs": configs,
        "host": platform.node(),
        "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "host_cpus": host_cpus(),  # the comparison's CPUs: its trials' and verl's runs'
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "verl_batches": "fresh" if args.fresh_batches else "trial",
        "host_speed": {"start": host_speed_now()},
        "runs": [],
    }
    print(f"host speed: {doc['host_speed']['start'].get('median_us_per_op')}", flush=True)
    verl_env = {"PYTHONPATH": args.verl_pythonpath} if args.verl_pythonpath else {}
    for rnd in range(args.rounds):
        for name, config in configs.items():
            if not args.no_predict and name not in args.skip_trial:
                for strategy in args.actor_strategy or [None]:
                    tspec = build_trial_spec(spec, arch, config, f"{name}-t{rnd}", "cuda", cap)
                    if strategy:
                        tspec.train.strategy = strategy
                    tspec.train.expandable_segments = not args.no_expandable_segments
                    if args.verl_pythonpath and not args.no_verl_cut:
                        tspec.verl_cut_env = {"python": sys.executable, "PYTHONPATH": args.verl_pythonpath}
                    print(
                        f"[{time.strftime('%T')}] trial {name} {tspec.train.strategy} round {rnd}", flush=True
                    )
                    held, waited = settled_gpus(doc["gpus"])
                    if args.profile:
                        os.environ[PROFILE_ENV] = f"{args.profile}/{name}-{rnd}-trial"
                    result = launch_trial(tspec, args.trial_timeout)
                    row = trial_row(result) | {
                        "gpus_held_before": held,
                        "gpus_waited_s": waited,
                        "config": name,
                        "kind": "trial",
                        "round": rnd,
                        "gpus": doc["gpus"],
                        "strategy": tspec.train.strategy,
                    }
                    doc["runs"].append(row)
                    print(f"  {row['status']} {row['throughput']} {row['phase_timings_s']}", flush=True)
                    if row["status"] != "ok":
                        print(
                            f"  {row['error_type']} in {row['phase']}:\n{row['log_tail'][-3000:]}", flush=True
                        )
                    out.write_text(json.dumps(doc, indent=1, default=str))
            verl_rounds = args.rounds if args.verl_rounds is None else args.verl_rounds
            if name not in args.skip_verl and rnd < verl_rounds:
                vspec = verl_run_spec(
                    spec,
                    arch,
                    config,
                    f"{name}-v{rnd}",
                    "cuda",
                    args.steps,
                    repeat_batch=not args.fresh_batches,
                )
                vspec.trace = args.trace
                vspec.profile = f"{args.profile}/{name}-{rnd}-verl" if args.profile else None
                print(f"[{time.strftime('%T')}] verl {name} round {rnd}", flush=True)
                held, waited = settled_gpus(doc["gpus"])
                vres = launch_verl(vspec, args.verl_timeout, Path(args.cache_dir), env=verl_env)
                row = verl_row(vres) | {
                    "gpus_held_before": held,
                    "gpus_waited_s": waited,
                    "config": name,
                    "kind": "verl",
                    "round": rnd,
                    "warmup_steps": vspec.warmup_steps,
                    "gpus": doc["gpus"],
                }
                doc["runs"].append(row)
                print(f"  {row['status']} {row['measured']} {row['error'] or ''}", flush=True)
                if not vres.ok:
                    print(vres.log_tail[-3000:], flush=True)
                out.write_text(json.dumps(doc, indent=1, default=str))
    doc["host_speed"]["end"] = host_speed_now()
    print(f"host speed: {doc['host_speed']['end'].get('median_us_per_op')}", flush=True)
    doc["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    doc["table"] = table(doc)
    out.write_text(json.dumps(doc, indent=1, default=str))
    print(doc["table"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
