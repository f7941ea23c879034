"""``launch_trial``: run one trial in a fresh process and always come back with a result.

The trial runs as ``python -m trials run`` in a new process session (its own process
group), so the engine's processes can be killed with it. Spec, result and progress
travel through files in a temporary directory; stdout and stderr go to a log file whose
tail ends up in the result. Outcomes:

- the trial's Python cannot be run, or (a trial with a rollout) does not find its
  engine's package (``engine_importable``): status ``error``, ``TrialLaunchError`` (a
  failure of the environment, not of the config), without starting the trial;
- the process wrote a result: that result (its ``log_tail`` filled from the log when
  it failed without one);
- the deadline passed: the group gets SIGTERM, then SIGKILL after ``grace_s``; status
  ``timeout`` with the phase and metrics it had reached (from the progress file);
- the process died without a result (a signal, the kernel's OOM killer, a library
  that calls ``exit`` when an allocation fails): status ``oom`` when the end of its log
  speaks of memory exhaustion (see ``failures``) or it was SIGKILLed while the cgroup's
  ``oom_kill`` counter rose, otherwise ``error``; the message gives the exit code or
  signal.

Whatever the outcome, every process left in the trial's session is killed before this
returns, so the next trial starts on a clean machine; for a CUDA trial the memory its
GPUs still hold then is recorded as ``gpu_memory_after_gib`` (NVML, where readable).
A death whose log names its cause in the table of ``failures`` (NCCL, the driver) takes
that error type. Imports no torch and no engine: the control plane wraps this function
in a Ray task.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from trials.failures import OOM, exit_text, match_text
from trials.memory import gpu_readings
from trials.rollout import BACKENDS
from trials.types import TrialResult, TrialSpec

LOG_TAIL_CHARS = 12_000
# A process that dies without a result and whose last words are about memory is ``oom``.
DEATH_NOTE_CHARS = 2_000
# The engines' own lines timing a step of their start-up, sleep or wake (vLLM: "Model loading
# took 2.9 GiB memory and 1.1 seconds", "Graph capturing finished in 12 secs", "init engine
# (profile, create kv cache, warmup model) took 30.1 s"; SGLang: "Capture cuda graph end.
# Time elapsed: 3.1 s"), with their timestamps: kept for every trial, so that a slow
# start-up can be taken apart afterwards.
TIMING_LINE = re.compile(rb"\b(took|takes|finished in|time elapsed)\b", re.IGNORECASE)
TIMING_LINES_MAX = 40
TIMING_LINE_CHARS = 300
SWEEP_WAIT_S = 10.0
AFTER_WAIT_S = 5.0
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)
ENGINE_PROBE_TIMEOUT_S = 60.0
_NOT_FOUND = 3
_FIND_PACKAGE = (
    f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec(sys.argv[1]) else {_NOT_FOUND})"
)


# A trial's scratch folder: ``<temp dir>/trial-<trial id>-<random>``, removed when the trial
# ends; a trial whose Ray task was killed (a cancelled job) leaves it to ``remove_scratch``.
SCRATCH_PREFIX = "trial-"


def scratch_dirs(trial_id: str) -> list[Path]:
    """This host's scratch folders of trial ``trial_id``, or of every trial whose id starts
    with ``trial_id + "-"`` (a job's study name: its trials are ``<study>-<number>``)."""
    root = Path(tempfile.gettempdir())
    return [p for p in root.glob(f"{SCRATCH_PREFIX}{trial_id}-*") if p.is_dir() and not p.is_symlink()]


def remove_scratch(trial_id: str) -> int:
    """Remove ``scratch_dirs(trial_id)``; how many there were."""
    found = scratch_dirs(trial_id)
    for path in found:
        shutil.rmtree(path, ignore_errors=True)
    return len(found)


def launch_trial(
    spec: TrialSpec,
    timeout_s: float,
    python: str = sys.executable,
    env: dict[str, str] | None = None,
    grace_s: float = 10.0,
) -> TrialResult:
    """Run ``spec`` with ``python`` (an engine's environment), killing it after ``timeout_s``.

    ``env`` adds variables to this process's environment for the trial. Never raises
    for a trial's failure; see the module docstring for the statuses.
    """
    workdir = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{spec.trial_id}-"))
    try:
        return _launch(spec, timeout_s, python, env or {}, grace_s, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _launch(
    spec: TrialSpec,
    timeout_s: float,
    python: str,
    extra_env: dict[str, str],
    grace_s: float,
    workdir: Path,
) -> TrialResult:
    spec_path, out_path = workdir / "spec.json", workdir / "result.json"
    progress_path, log_path = workdir / "progress.json", workdir / "trial.log"
    spec_path.write_text(spec.to_json())
    cmd = [
        python,
        "-m",
        "trials",
        "run",
        "--spec",
        str(spec_path),
        "--out",
        str(out_path),
        "--progress",
        str(progress_path),
    ]
    child_env = _child_env(extra_env)
    # Whatever the trial and its engine write to temporary files (the dummy model, the
    # engine's IPC sockets) lands in its scratch folder and goes with it.
    child_env["TMPDIR"] = str(workdir)
    if "rollout" in spec.phases and spec.rollout.engine in BACKENDS:
        missing = engine_importable(spec.rollout.engine, python, extra_env, cwd=workdir)
        if missing is not None:  # every trial of this environment would fail alike: nothing ran
            return TrialResult(
                spec.trial_id,
                "error",
                phase="startup",
                error_type="TrialLaunchError",
                error_message=f"{missing}; {engine_fix(spec.rollout.engine)}",
            )
    oom_kills_before = _cgroup_oom_kills()
    start, started_at = time.monotonic(), time.time()
    with open(log_path, "wb") as log_file:
        try:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=child_env,
                cwd=str(workdir),
            )
        except OSError as exc:  # e.g. the engine's Python is missing: nothing ran
            return TrialResult(
                spec.trial_id,
                "error",
                phase="startup",
                error_type="TrialLaunchError",
                error_message=f"cannot start the trial with {python!r}: {exc}; check "
                "AUTOTUNER_TRIAL_PYTHON (or AUTOTUNER_ENGINE_PYTHON__<ENGINE>)",
            )
    timed_out = False
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        _kill_session(proc, grace_s)
    wall_s = time.monotonic() - start
    log_tail = _tail(log_path)
    if timed_out:
        result = _from_progress(spec, progress_path, "timeout")
        result.error_type = "TrialTimeout"
        result.error_message = (
            f"the trial did not finish within {timeout_s:g} s; its process group was killed"
        )
    elif out_path.exists():
        result = TrialResult.from_json(out_path.read_text())
    else:
        result = _from_progress(spec, progress_path, "error")
        oom_killed = proc.returncode == -signal.SIGKILL and _cgroup_oom_kills() > oom_kills_before
        death_note = match_text(log_tail[-DEATH_NOTE_CHARS:])
        said_memory = death_note is not None and death_note.status == OOM
        result.status = "oom" if oom_killed or said_memory else "error"
        named = death_note.error_type if death_note is not None and not oom_killed else None
        result.error_type = named or "TrialProcessDied"
        result.error_message = f"the trial process {exit_text(proc.returncode)} without writing a result"
    if result.status != "ok" and not result.log_tail:
        result.log_tail = log_tail
    result.timing_lines = timing_lines(log_path)
    if spec.device == "cuda":
        visible = child_env.get("CUDA_VISIBLE_DEVICES")
        _record_gpu_memory_after(result, visible, spec.gpu_clean_threshold_gib)
    result.wall_s = wall_s  # what the trial cost, interpreter start-up and clean-up included
    result.started_at = started_at  # [started_at, started_at + wall_s]: the process's life
    result.visible_gpus = child_env.get("CUDA_VISIBLE_DEVICES")
    return result


def engine_importable(
    engine: str,
    python: str = sys.executable,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
) -> str | None:
    """What is wrong when ``python``, in the environment a trial gets (``env`` added to
    this process's, this package first on ``PYTHONPATH``), cannot be run or does not find
    the package of ``engine`` (the engine's name); else None, also when the probe fails
    otherwise (the trial then says what it is). The package is found, not imported: this
    runs in the control plane too, which must not import an engine (and a separate
    process answers for the trial's environment, not this one's)."""
    child_env = _child_env(env or {})
    try:
        probe = subprocess.run(
            [python, "-c", _FIND_PACKAGE, engine],
            env=child_env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=ENGINE_PROBE_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run the trials' Python {python!r}: {exc}"
    if probe.returncode != _NOT_FOUND:
        return None
    where = f"{python} (PYTHONPATH={child_env.get('PYTHONPATH', '')})"
    return f"the rollout engine {engine!r} is not importable by {where}"


def engine_fix(engine: str) -> str:
    """How to give the trials of ``engine`` an environment that has it."""
    name = engine.upper()
    return (
        f"install {engine} for that Python, or point the trials of {engine} jobs at an "
        f"environment that has it: AUTOTUNER_ENGINE_PYTHON__{name}=/path/to/venv/bin/python "
        f"(its interpreter) and/or AUTOTUNER_ENGINE_PYTHONPATH__{name}=/path/to/site (a folder "
        f"its wheels were installed into with pip --target); AUTOTUNER_TRIAL_PYTHON sets the "
        "Python of every engine"
    )


def _record_gpu_memory_after(result: TrialResult, visible: str | None, clean_gib: float) -> None:
    """The most memory any of the trial's GPUs holds once its processes are gone (the
    driver frees an exited process's memory within moments: up to ``AFTER_WAIT_S``)."""
    deadline = time.monotonic() + AFTER_WAIT_S
    while (readings := gpu_readings(visible)) is not None:
        used = max((r.used_gib for r in readings), default=0.0)
        if used <= clean_gib or time.monotonic() >= deadline:
            result.metrics["gpu_memory_after_gib"] = used
            return
        time.sleep(0.2)


def _child_env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    # Let any interpreter find this package, whatever its own site-packages hold.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    return env


def _from_progress(spec: TrialSpec, progress_path: Path, status: str) -> TrialResult:
    """A result carrying the phase and metrics the trial had reached."""
    result = TrialResult(spec.trial_id, status)  # type: ignore[arg-type]
    try:
        partial = TrialResult.from_json(progress_path.read_text())
    except (OSError, ValueError, TypeError):
        return result
    result.phase, result.device, result.hostname = partial.phase, partial.device, partial.hostname
    result.metrics, result.phase_timings_s = partial.metrics, partial.phase_timings_s
    return result


def timing_lines(path: Path) -> list[str]:
    """The log's first ``TIMING_LINES_MAX`` lines that time a step (``TIMING_LINE``)."""
    found: list[str] = []
    try:
        with open(path, "rb") as f:
            for line in f:
                if TIMING_LINE.search(line):
                    found.append(line.decode("utf-8", errors="replace").rstrip()[:TIMING_LINE_CHARS])
                    if len(found) == TIMING_LINES_MAX:
                        break
    except OSError:
        pass
    return found


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4 * LOG_TAIL_CHARS))
            return f.read().decode("utf-8", errors="replace")[-LOG_TAIL_CHARS:]
    except OSError:
        return ""


def proc_stats() -> Iterator[tuple[int, list[str]]]:
    """(pid, the fields of /proc/<pid>/stat after the command name) of every process:
    ``[0]`` its state, ``[1]`` its parent, ``[3]`` its session."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                yield int(entry), f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue


def session_processes(sid: int) -> list[int]:
    """Live (non-zombie) processes in session ``sid``, from /proc."""
    return [pid for pid, fields in proc_stats() if int(fields[3]) == sid and fields[0] not in ("Z", "X")]


def _signal_session(sid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(sid, sig)
    for pid in session_processes(sid):  # members that left the group but not the session
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _kill_session(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``, everything in the trial's session; reap."""
    sid = proc.pid  # start_new_session: the child leads its session and group
    if proc.poll() is None:
        _signal_session(sid, signal.SIGTERM)
        _signal_session(sid, signal.SIGCONT)  # a stopped (hung, traced) process acts on it too
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    deadline = time.monotonic() + grace_s
    while session_processes(sid) and time.monotonic() < deadline and proc.poll() is not None:
        time.sleep(0.1)  # the trial's children are shutting down after it exited
    deadline = time.monotonic() + SWEEP_WAIT_S
    while (proc.poll() is None or session_processes(sid)) and time.monotonic() < deadline:
        _signal_session(sid, signal.SIGKILL)
        time.sleep(0.1)
    proc.wait()


def _cgroup_oom_kills() -> int:
    """This cgroup's ``oom_kill`` count (cgroup v2), or 0 where it cannot be read."""
    try:
        with open("/proc/self/cgroup") as f:
            path = next(line.split(":", 2)[2].strip() for line in f if line.startswith("0::"))
        events = Path("/sys/fs/cgroup") / path.lstrip("/") / "memory.events"
        for line in events.read_text().splitlines():
            key, value = line.split()
            if key == "oom_kill":
                return int(value)
    except (OSError, StopIteration, ValueError):
        pass
    return 0


def log_tail(path: Path) -> str:
    """The last ``LOG_TAIL_CHARS`` characters of the log at ``path`` ("" if unreadable)."""
    return _tail(path)


def kill_session(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """Kill every process in the session ``proc`` leads (started with ``start_new_session``):
    SIGTERM, SIGKILL after ``grace_s``; reaps ``proc``. For other launchers (``trials.verl``)."""
    _kill_session(proc, grace_s)


def sigterm_when_parent_dies() -> None:
    """Ask the kernel for SIGTERM when this process's parent dies (Linux, glibc); elsewhere
    the launcher's own clean-up still applies."""
    try:
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
