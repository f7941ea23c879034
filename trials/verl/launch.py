"""``launch_verl``: run the verl step runner in verl's environment, and always come back.

The runner (``python -m trials.verl run``) starts in a new process session with verl's
Python; verl's trainer and the Ray it starts are its children. At the deadline, or when
this function's caller is cancelled (Ray kills its worker; the runner, told by the kernel
that its parent died, kills its own group), every process of the session is killed
(``trials.launcher.kill_session``), and so is every process still naming the run's private
Ray temp folder on its command line (Ray's daemons, which may leave the session). A
run killed at its deadline is ``timeout`` with the steps verl had logged by then.
Imports no verl: the control plane wraps this in a Ray task.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trials.launcher import kill_session, proc_stats
from trials.verl.runner import collect, run_paths
from trials.verl.types import VerlRunResult, VerlRunSpec

RAY_SWEEP_WAIT_S = 10.0


def launch_verl(
    spec: VerlRunSpec,
    timeout_s: float,
    cache_dir: Path,
    python: str = sys.executable,
    env: dict[str, str] | None = None,
    grace_s: float = 10.0,
    command: str = "run",
) -> VerlRunResult:
    """Run ``spec`` in verl with ``python`` (verl's environment), killed after ``timeout_s``."""
    workdir = Path(tempfile.mkdtemp(prefix=f"verl-{spec.run_id}-"))
    ray_temp = Path(tempfile.mkdtemp(prefix="vr-", dir="/tmp"))  # short: Ray's socket paths
    try:
        return _launch(spec, timeout_s, cache_dir, python, env or {}, grace_s, workdir, ray_temp, command)
    finally:
        sweep_ray(ray_temp)
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(ray_temp, ignore_errors=True)


def _launch(
    spec: VerlRunSpec,
    timeout_s: float,
    cache_dir: Path,
    python: str,
    extra_env: dict[str, str],
    grace_s: float,
    workdir: Path,
    ray_temp: Path,
    command: str,
) -> VerlRunResult:
    spec_path, out_path = workdir / "spec.json", workdir / "result.json"
    spec_path.write_text(spec.to_json())
    root = str(Path(__file__).resolve().parents[2])
    child_env = dict(os.environ) | extra_env
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (root, child_env.get("PYTHONPATH")) if p)
    cmd = [python, "-m", "trials.verl", command, "--spec", str(spec_path), "--out", str(out_path)]
    cmd += ["--workdir", str(workdir / "run"), "--cache-dir", str(cache_dir), "--ray-temp-dir", str(ray_temp)]
    start = time.monotonic()
    with open(workdir / "runner.log", "wb") as log:
        try:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, env=child_env, cwd=str(workdir),
            )  # fmt: skip
        except OSError as exc:
            return VerlRunResult(
                spec.run_id, "error", error_type="VerlLaunchError",
                error_message=f"cannot start verl's runner with {python!r}: {exc}; set "
                "AUTOTUNER_ENGINE_PYTHON__VERL (and/or AUTOTUNER_ENGINE_PYTHONPATH__VERL)",
            )  # fmt: skip
    timed_out = False
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        kill_session(proc, grace_s)
        sweep_ray(ray_temp)
    paths = run_paths(spec, workdir / "run", cache_dir, ray_temp)
    if out_path.exists() and not timed_out:
        result = VerlRunResult.from_json(out_path.read_text())
    else:
        result = collect(VerlRunResult(spec.run_id, "error", warmup_steps=spec.warmup_steps), paths, None)
        result.device = spec.device
        if timed_out:
            result.status, result.error_type = "timeout", "VerlTimeout"
            result.error_message = f"verl did not finish {spec.steps} steps within {timeout_s:g} s; killed"
        else:
            result.error_type = "VerlRunnerDied"
            result.error_message = f"verl's runner exited with {proc.returncode} without writing a result"
        result.log_tail = result.log_tail or _read(workdir / "runner.log")[-12_000:]
    result.wall_s = time.monotonic() - start
    return result


def ray_processes(ray_temp: Path) -> list[int]:
    """Processes whose command line names ``ray_temp`` (the run's own Ray daemons and workers)."""
    marker = str(ray_temp).encode()
    found = []
    for pid, _fields in proc_stats():
        with contextlib.suppress(OSError):
            if marker in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
    return found


def sweep_ray(ray_temp: Path) -> None:
    """SIGKILL every process of the run's private Ray until none is left (or time is up)."""
    deadline = time.monotonic() + RAY_SWEEP_WAIT_S
    while (pids := ray_processes(ray_temp)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
