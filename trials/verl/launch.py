"""``launch_verl``: run the verl step runner in verl's environment, and always come back.

The run's random checkpoint (``trials.verl.checkpoint``), written once per model and cache
folder, is written first when it is missing (``python -m trials.verl checkpoint``, under
a deadline of its own, ``checkpoint_timeout_s``, by default as long as the run's):
``timeout_s`` bounds verl's run, not that write, which on a 7B model is minutes of a host's
first run only. ``VerlRunResult.checkpoint_s`` says what it took.

The runner (``python -m trials.verl run``) starts in a new process session with verl's
Python; verl's trainer and the Ray it starts are its children. At the deadline, or when
this function's caller is cancelled (Ray kills its worker; the runner, told by the kernel
that its parent died, kills its own group), every process of the session is killed
(``trials.launcher.kill_session``), and so is every process of the run's private Ray:
those naming its temp folder on their command line (Ray's daemons, which may leave the
session) and every descendant of theirs or of the runner's, taken before anything is
killed (Ray's workers: they rename themselves ``ray::WorkerDict`` and the like, and an
orphaned one holds its GPU memory until it notices its raylet is gone). A run killed at
its deadline is ``timeout`` with the steps verl had logged by then.
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
from trials.verl.checkpoint import COMPLETE_MARK, checkpoint_dir
from trials.verl.runner import collect, run_paths
from trials.verl.types import VerlRunResult, VerlRunSpec

# A killed worker holding GPU memory may take a while to exit while its driver frees it.
RAY_SWEEP_WAIT_S = 30.0
LAUNCH_FAILED = -1000  # _run_session's status when the command could not start


def launch_verl(
    spec: VerlRunSpec,
    timeout_s: float,
    cache_dir: Path,
    python: str = sys.executable,
    env: dict[str, str] | None = None,
    grace_s: float = 10.0,
    command: str = "run",
    checkpoint_timeout_s: float | None = None,
) -> VerlRunResult:
    """Run ``spec`` in verl with ``python`` (verl's environment), killed after ``timeout_s``
    (its checkpoint, when it is not cached yet, written first under a deadline of its own:
    ``checkpoint_timeout_s``, default ``timeout_s``)."""
    workdir = Path(tempfile.mkdtemp(prefix=f"verl-{spec.run_id}-"))
    ray_temp = Path(tempfile.mkdtemp(prefix="vr-", dir="/tmp"))  # short: Ray's socket paths
    try:
        deadlines = (timeout_s, timeout_s if checkpoint_timeout_s is None else checkpoint_timeout_s)
        return _launch(spec, deadlines, cache_dir, python, env or {}, grace_s, workdir, ray_temp, command)
    finally:
        sweep_ray(ray_temp)
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(ray_temp, ignore_errors=True)


def _launch(
    spec: VerlRunSpec,
    deadlines: tuple[float, float],  # the run's, the checkpoint's
    cache_dir: Path,
    python: str,
    extra_env: dict[str, str],
    grace_s: float,
    workdir: Path,
    ray_temp: Path,
    command: str,
) -> VerlRunResult:
    timeout_s, checkpoint_timeout_s = deadlines
    spec_path, out_path = workdir / "spec.json", workdir / "result.json"
    spec_path.write_text(spec.to_json())
    root = str(Path(__file__).resolve().parents[2])
    child_env = dict(os.environ) | extra_env
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (root, child_env.get("PYTHONPATH")) if p)
    start = time.monotonic()
    checkpoint_s = 0.0
    cached = checkpoint_dir(spec.model_config, spec.model_name, spec.dtype, cache_dir) / COMPLETE_MARK
    if not cached.exists():
        cmd = [python, "-m", "trials.verl", "checkpoint", "--spec", str(spec_path)]
        cmd += ["--cache-dir", str(cache_dir)]
        ended = _run_session(
            cmd, checkpoint_timeout_s, child_env, workdir, "checkpoint.log", ray_temp, grace_s
        )
        checkpoint_s = time.monotonic() - start
        if ended == LAUNCH_FAILED:
            return _launch_error(spec, python, workdir / "checkpoint.log")
        if ended != 0:
            return VerlRunResult(
                spec.run_id, "timeout" if ended is None else "error", error_type="VerlCheckpointError",
                error_message=f"the run's random checkpoint was not written within {checkpoint_timeout_s:g} s"
                if ended is None else f"writing the run's random checkpoint exited with {ended}",
                wall_s=checkpoint_s, checkpoint_s=checkpoint_s,
                log_tail=_read(workdir / "checkpoint.log")[-12_000:],
            )  # fmt: skip
    cmd = [python, "-m", "trials.verl", command, "--spec", str(spec_path), "--out", str(out_path)]
    cmd += ["--workdir", str(workdir / "run"), "--cache-dir", str(cache_dir), "--ray-temp-dir", str(ray_temp)]
    returncode = _run_session(cmd, timeout_s, child_env, workdir, "runner.log", ray_temp, grace_s)
    timed_out = returncode is None
    paths = run_paths(spec, workdir / "run", cache_dir, ray_temp)
    if returncode == LAUNCH_FAILED:
        return _launch_error(spec, python, workdir / "runner.log")
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
            result.error_message = f"verl's runner exited with {returncode} without writing a result"
        result.log_tail = result.log_tail or _read(workdir / "runner.log")[-12_000:]
    result.wall_s = time.monotonic() - start
    result.checkpoint_s = checkpoint_s
    return result


def _launch_error(spec: VerlRunSpec, python: str, log: Path) -> VerlRunResult:
    return VerlRunResult(
        spec.run_id, "error", error_type="VerlLaunchError",
        error_message=f"cannot start verl's runner with {python!r}: {_read(log)}; set "
        "AUTOTUNER_ENGINE_PYTHON__VERL (and/or AUTOTUNER_ENGINE_PYTHONPATH__VERL)",
    )  # fmt: skip


def _run_session(
    cmd: list[str], timeout_s: float, env: dict[str, str], workdir: Path, log_name: str,
    ray_temp: Path, grace_s: float,
) -> int | None:  # fmt: skip
    """Run ``cmd`` as the leader of a new session, its output in ``workdir/log_name``; kill
    the session and the run's Ray when it ends or at ``timeout_s``. Its exit status, None at
    the deadline, ``LAUNCH_FAILED`` (the reason in the log) when it could not start."""
    with open(workdir / log_name, "wb") as log:
        try:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, env=env, cwd=str(workdir),
            )  # fmt: skip
        except OSError as exc:
            log.write(str(exc).encode())
            return LAUNCH_FAILED
    returncode: int | None = None  # None: the deadline came first
    try:
        returncode = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pass
    finally:
        # Taken before a kill orphans them; the runner itself only while it lives (once
        # reaped, its PID may name another process).
        run_tree = run_processes(ray_temp, roots=(proc.pid,) if proc.returncode is None else ())
        kill_session(proc, grace_s)
        sweep_ray(ray_temp, run_tree)
    return returncode


def ray_processes(ray_temp: Path) -> list[int]:
    """Processes whose command line names ``ray_temp`` (the run's own Ray daemons and workers)."""
    marker = str(ray_temp).encode()
    found = []
    for pid, _fields in proc_stats():
        with contextlib.suppress(OSError):
            if marker in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
    return found


def run_processes(
    ray_temp: Path, roots: tuple[int, ...] = (), stats: dict[int, list[str]] | None = None
) -> dict[int, str]:
    """The run's processes: those naming ``ray_temp``, the live ``roots`` and every
    descendant of either, each with its start time (which tells a reused PID apart);
    ``stats``: ``proc_stats()`` read already."""
    stats = dict(proc_stats()) if stats is None else stats
    children: dict[int, list[int]] = {}
    for pid, fields in stats.items():
        children.setdefault(int(fields[1]), []).append(pid)
    todo = [*ray_processes(ray_temp), *roots]
    found: dict[int, str] = {}
    while todo:
        pid = todo.pop()
        if pid in found or pid not in stats:
            continue
        found[pid] = stats[pid][19]
        todo.extend(children.get(pid, ()))
    return found


def sweep_ray(ray_temp: Path, known: dict[int, str] | None = None) -> None:
    """SIGKILL every process of the run's private Ray and their descendants, and those of
    ``known`` (``run_processes`` taken earlier), until none is left (or time is up); a
    zombie counts as gone."""
    targets = dict(known or {})
    deadline = time.monotonic() + RAY_SWEEP_WAIT_S
    while time.monotonic() < deadline:
        stats = dict(proc_stats())
        targets.update(run_processes(ray_temp, stats=stats))
        alive = [
            pid
            for pid, started in targets.items()
            if pid in stats and stats[pid][19] == started and stats[pid][0] not in ("Z", "X")
        ]
        if not alive:
            return
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
