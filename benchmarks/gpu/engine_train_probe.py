"""Why do the SGLang trials train slowly? The train phases timed around a sleeping engine.

In the SGLang job of 2026-11-21 on four H200s (benchmarks/README.md) the train sub-phases of SGLang
trials ran 4-8x slower than in vLLM trials with the same knobs, erratically (old-logp
slow and ref-logp fast in one trial, all three slow in another), while vLLM trials on the
host's other GPUs ran normally. This probe runs, in one trial-like process per engine
(that engine's environment, one GPU), the order of a trial with extra train measurements
between its steps, and watches what else runs meanwhile:

1. ``no_engine``: the actor built, ``run_train`` twice before any engine starts (the
   engine's environment, no engine: is it the environment?);
2. the engine starts, generates the job's rollout and sleeps (``release_memory_occupation``
   / ``sleep``), as in a trial; ``engine_asleep``: ``run_train`` twice (the trial's case);
3. ``children_stopped``: every process the engine started is stopped (SIGSTOP), one
   ``run_train``, then resumed (SIGCONT): is it the engine's processes or this one?
4. ``engine_gone``: the engine shut down, one ``run_train``: does the process stay slow?

During each stage a sampler records the CPU used by each of the engine's processes and by
each thread of this one, and NVML's per-process SM utilisation of the GPU. Snapshots of
the process-wide state a library could change (torch's global flags, the environment,
threads, the garbage collector, the switch interval) are taken before the engine starts
and once it sleeps; the JSON lists what changed.

Usage, on the GPU host after setup-host.sh and setup-sglang.sh (about 4 minutes, both
engines at once on two GPUs)::

    PYTHONPATH=/tmp/site:$PWD python3 -m benchmarks.gpu.engine_train_probe \
        --gpus 2,3 --out $OUT/probe

The parent (control plane's environment) builds each engine's trial spec from its job
(verl's defaults; the SGLang job and its vLLM twin), then runs one child per engine with
that engine's ``PYTHONPATH`` (``/tmp/site-sglang`` for SGLang, as the trials get it; the
parent's for vLLM). Each child writes ``<out>/<engine>.json`` and ``<out>/<engine>.log``;
the parent prints a table of tokens/s per sub-phase and stage.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
JOBS = {
    "sglang": REPO / "benchmarks/jobs/qwen2.5-1.5b-grpo-sglang.yaml",
    "vllm": REPO / "benchmarks/jobs/qwen2.5-1.5b-grpo-vllm-twin.yaml",
}
SUBPHASES = ("old_log_prob", "ref_log_prob", "update_actor")


# ------------------------------------------------------------------ the child (one engine)


def _torch_state() -> dict[str, Any]:
    import torch

    cuda = torch.backends.cuda
    state: dict[str, Any] = {
        "grad_enabled": torch.is_grad_enabled(),
        "inference_mode": torch.is_inference_mode_enabled(),
        "default_dtype": str(torch.get_default_dtype()),
        "num_threads": torch.get_num_threads(),
        "num_interop_threads": torch.get_num_interop_threads(),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "matmul_allow_tf32": cuda.matmul.allow_tf32,
        "matmul_bf16_reduced": cuda.matmul.allow_bf16_reduced_precision_reduction,
        "matmul_fp16_reduced": cuda.matmul.allow_fp16_reduced_precision_reduction,
        "cudnn_enabled": torch.backends.cudnn.enabled,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "flash_sdp": cuda.flash_sdp_enabled(),
        "mem_efficient_sdp": cuda.mem_efficient_sdp_enabled(),
        "math_sdp": cuda.math_sdp_enabled(),
        "cudnn_sdp": cuda.cudnn_sdp_enabled(),
        "anomaly_detection": torch.is_anomaly_enabled(),
        "autocast_gpu": torch.is_autocast_enabled("cuda"),
        "dynamo_disabled": bool(getattr(torch._dynamo.config, "disable", False)),
        "torch_function_modes": [type(m).__name__ for m in _function_modes()],
        "dispatch_modes": [type(m).__name__ for m in _dispatch_modes()],
    }
    if torch.cuda.is_available():
        state |= {
            "allocator_backend": torch.cuda.memory.get_allocator_backend(),
            "current_stream": str(torch.cuda.current_stream()),
            "current_device": torch.cuda.current_device(),
        }
    return state


def _function_modes() -> list[Any]:
    from torch.overrides import _get_current_function_mode_stack

    return list(_get_current_function_mode_stack())


def _dispatch_modes() -> list[Any]:
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return list(_get_current_dispatch_mode_stack())


def _snapshot() -> dict[str, Any]:
    return {
        "torch": _torch_state(),
        "env": dict(os.environ),
        "threads": sorted(f"{t.name} (daemon={t.daemon})" for t in threading.enumerate()),
        "gc_enabled": gc.isenabled(),
        "gc_threshold": list(gc.get_threshold()),
        "gc_frozen": gc.get_freeze_count(),
        "gc_objects": len(gc.get_objects()),
        "gc_callbacks": [getattr(c, "__qualname__", repr(c)) for c in gc.callbacks],
        "switch_interval_s": sys.getswitchinterval(),
        "profile": repr(sys.getprofile()),
        "trace": repr(sys.gettrace()),
        "affinity": sorted(os.sched_getaffinity(0)),
        "nice": os.nice(0),
        "modules": len(sys.modules),
    }


def _changes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in before:
        if key == "env":
            b, a = before["env"], after["env"]
            out["env"] = {k: [b.get(k), a.get(k)] for k in sorted(set(b) | set(a)) if b.get(k) != a.get(k)}
        elif key == "torch":
            out["torch"] = {
                k: [v, after["torch"].get(k)]
                for k, v in before["torch"].items()
                if after["torch"].get(k) != v
            }
        elif key == "threads":
            out["threads_new"] = sorted(set(after["threads"]) - set(before["threads"]))
        elif before[key] != after[key]:
            out[key] = [before[key], after[key]]
    return out


class Watch:
    """Samples, every ``period_s``: the CPU seconds of ``pids`` and of this process's
    threads, and NVML's per-process SM utilisation on this process's GPU."""

    def __init__(self, pids: list[int], period_s: float = 0.25) -> None:
        self.pids, self.period_s = pids, period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="probe-watch", daemon=True)
        self.sm: dict[int, list[int]] = {}
        self.gpu_util: list[int] = []

    def __enter__(self) -> Watch:
        import psutil

        self._t0 = time.perf_counter()
        self._procs = {}
        for pid in self.pids:
            with contextlib.suppress(psutil.Error):
                self._procs[pid] = psutil.Process(pid)
        self._cpu0 = {pid: self._cpu(p) for pid, p in self._procs.items()}
        self._threads0 = self._thread_times()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        seconds = time.perf_counter() - self._t0
        self.seconds = seconds
        self.children_cpu = {}
        for pid, p in self._procs.items():
            name = self._name(p)
            used = self._cpu(p) - self._cpu0.get(pid, 0.0)
            self.children_cpu[f"{pid} {name}"] = round(used / seconds, 3)
        names = {t.native_id: t.name for t in threading.enumerate()}
        after = self._thread_times()
        self.threads_cpu = {
            f"{tid} {names.get(tid, '?')}": round((cpu - self._threads0.get(tid, 0.0)) / seconds, 3)
            for tid, cpu in after.items()
            if cpu - self._threads0.get(tid, 0.0) > 0.01 * seconds
        }

    @staticmethod
    def _cpu(p: Any) -> float:
        try:
            t = p.cpu_times()
            return t.user + t.system
        except Exception:
            return 0.0

    @staticmethod
    def _name(p: Any) -> str:
        try:
            return " ".join(p.cmdline())[:80] or p.name()
        except Exception:
            return "?"

    @staticmethod
    def _thread_times() -> dict[int, float]:
        import psutil

        return {t.id: t.user_time + t.system_time for t in psutil.Process().threads()}

    def _run(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            index = int(os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0])
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:
            handle = None
        last = 0
        while not self._stop.wait(self.period_s):
            if handle is None:
                continue
            try:
                self.gpu_util.append(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                samples = pynvml.nvmlDeviceGetProcessUtilization(handle, last)
            except Exception:
                continue
            for s in samples:
                self.sm.setdefault(s.pid, []).append(s.smUtil)
                last = max(last, s.timeStamp)

    def summary(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 2),
            "children_cpu_cores": self.children_cpu,
            "threads_cpu_cores": self.threads_cpu,
            "sm_util_by_pid": {str(pid): round(sum(v) / len(v), 1) for pid, v in self.sm.items() if v},
            "gpu_util_mean": round(sum(self.gpu_util) / len(self.gpu_util), 1) if self.gpu_util else None,
        }


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def child(spec_path: Path, out_path: Path) -> None:
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from trials.actor_state import build_actor_state
    from trials.device import compute_dtype
    from trials.distributed import actor_world
    from trials.rollout import get_backend
    from trials.rollout.children import child_pids
    from trials.rollout.phase import measure_rollout
    from trials.train import prepare_train, run_train
    from trials.types import TrialSpec

    spec = TrialSpec.from_json(spec_path.read_text())
    dtype = compute_dtype(spec.device, spec.dtype)
    report: dict[str, Any] = {
        "engine": spec.rollout.engine,
        "trial_id": spec.trial_id,
        "config": spec.to_dict()["rollout"],
        "stages": {},
    }

    def save() -> None:
        out_path.write_text(json.dumps(report, indent=1) + "\n")

    def stage(name: str, runs: int, state: Any, pids: list[int]) -> None:
        rows = []
        for _ in range(runs):
            metrics: dict[str, float] = {}
            with Watch(pids) as watch:
                run_train(spec, dtype, metrics, {}, state)
            rows.append(
                {
                    "tokens_per_s": {p: round(metrics.get(f"{p}_tokens_per_s", 0.0)) for p in SUBPHASES},
                    "watch": watch.summary(),
                }
            )
            print(f"PROBE {spec.rollout.engine} {name}: {rows[-1]['tokens_per_s']}", flush=True)
        report["stages"][name] = rows
        save()

    with contextlib.ExitStack() as stack:
        prepare_train(spec, dtype)
        world = stack.enter_context(actor_world(spec.device, spec.n_gpus)) if spec.actor_fsdp else None
        state = build_actor_state(spec, dtype, world)
        before_children = child_pids()
        stage("no_engine", 2, state, [])
        before = _snapshot()
        backend = get_backend(spec.rollout.engine)
        report["engine_startup_s"] = backend.start(spec, dtype)
        pids = sorted(child_pids() - before_children)
        rollout = measure_rollout(backend, spec)
        report["rollout_generated_tokens_per_s"] = rollout["rollout_generated_tokens_per_s"]
        if backend.can_sleep:  # (on a CPU vLLM cannot: the probe's own smoke test)
            report["engine_sleep_s"] = backend.sleep()
        report["changes_at_sleep"] = _changes(before, _snapshot())
        report["engine_pids"] = pids
        save()
        stage("engine_asleep", 2, state, pids)
        _signal_all(pids, signal.SIGSTOP)
        try:
            stage("children_stopped", 1, state, pids)
        finally:
            _signal_all(pids, signal.SIGCONT)
        backend.shutdown()
        report["changes_at_shutdown"] = _changes(before, _snapshot())
        stage("engine_gone", 1, state, [])
    save()


# ------------------------------------------------------------------ the parent


def build_spec(variant: str, job_path: Path) -> str:
    """The trial spec of ``job_path``'s verl-defaults config; ``variant``: ENGINE or
    ENGINE:KEY (``engine_kwargs`` KEY set True, e.g. ``sglang:sleep_on_idle``)."""
    from autotuner.jobs import build_space, memory_cap_gib, resolve_device
    from autotuner.settings import get_settings
    from autotuner.spec import load_job_spec
    from autotuner.trialspec import build_trial_spec

    settings = get_settings()
    job = load_job_spec(job_path)
    device = resolve_device(job)
    space = build_space(job, device, settings)
    config = space.baseline_config() | space.fixed
    spec = build_trial_spec(
        job,
        space.arch,
        config,
        f"probe-{variant.replace(':', '-')}",
        device,
        memory_cap_gib(job, device, settings),
    )
    if ":" in variant:
        spec.rollout.engine_kwargs[variant.split(":", 1)[1]] = True
    return spec.to_json()


def trial_env() -> dict[str, str]:
    """What a trial process gets on top of its worker's (the shared compile caches)."""
    from autotuner.settings import get_settings

    return get_settings().trial_env()


def engine_pythonpath(engine: str) -> str:
    from autotuner.settings import get_settings

    own = get_settings().engine_pythonpath.get(engine)
    return ":".join([str(REPO), own] if own else [str(REPO), os.environ.get("PYTHONPATH", "")])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--engines", default="sglang,vllm", help="ENGINE or ENGINE:KEY (engine_kwargs KEY=True), one per GPU."
    )
    parser.add_argument("--gpus", default="0,1", help="One GPU per engine, in order.")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")) / "probe")
    parser.add_argument(
        "--job",
        action="append",
        default=[],
        metavar="ENGINE=JOB.yaml",
        help="Another job for an engine (default: the SGLang job and its vLLM twin).",
    )
    parser.add_argument("--timeout-s", type=float, default=420.0)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.child_out)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    engines, gpus = args.engines.split(","), args.gpus.split(",")
    jobs = dict(JOBS) | {k: Path(v) for k, v in (j.split("=", 1) for j in args.job)}
    procs = {}
    for engine, gpu in zip(engines, gpus, strict=True):
        name = engine.replace(":", "-")
        spec_path = args.out / f"{name}-spec.json"
        spec_path.write_text(build_spec(engine, jobs[engine.split(":")[0]]))
        env = dict(
            os.environ,
            **trial_env(),
            CUDA_VISIBLE_DEVICES=gpu,
            PYTHONPATH=engine_pythonpath(engine.split(":")[0]),
        )
        env.setdefault("OMP_NUM_THREADS", "1")  # as Ray sets it for a trial's task
        log = (args.out / f"{name}.log").open("w")
        procs[engine] = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.gpu.engine_train_probe",
                "--child",
                str(spec_path),
                "--child-out",
                str(args.out / f"{name}.json"),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,
        )
    deadline = time.monotonic() + args.timeout_s
    for engine, proc in procs.items():
        try:
            proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        print(f"{engine}: exit {proc.returncode}")
    print(f"{'engine':<20} {'stage':<17} " + " ".join(f"{p:>13}" for p in SUBPHASES))
    for engine in engines:
        name = engine.replace(":", "-")
        path = args.out / f"{name}.json"
        if not path.exists():
            print(f"{engine:<7} (no result; see {args.out / (name + '.log')})")
            continue
        report = json.loads(path.read_text())
        for name, rows in report["stages"].items():
            for row in rows:
                print(
                    f"{engine:<20} {name:<17} " + " ".join(f"{row['tokens_per_s'][p]:>13}" for p in SUBPHASES)
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
