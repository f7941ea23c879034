"""``launch_verl``'s clean-up and deadline: the sweep of a run's private Ray reaches the
processes that left its session and renamed themselves (as Ray's workers do) and those a
kill has already orphaned; a missing checkpoint is written before verl's deadline starts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from verl_helpers import DEMO, job_run_spec, verl_python

from trials.verl.checkpoint import COMPLETE_MARK, checkpoint_dir
from trials.verl.launch import launch_verl, ray_processes, run_processes, sweep_ray

# A "daemon" of the run's Ray (its temp folder on its command line) whose child leaves the
# session and names nothing of the run, as a Ray worker holding a GPU does.
_DAEMON = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import os, time; os.setsid(); time.sleep(600)"])
print(child.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _daemon(ray_temp: Path) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, "-c", _DAEMON, str(ray_temp)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def test_the_sweep_kills_a_descendant_that_left_the_session(tmp_path: Path) -> None:
    ray_temp = tmp_path / "vr-sweep"
    daemon, child = _daemon(ray_temp)
    try:
        assert ray_processes(ray_temp) == [daemon.pid]  # the child names nothing of the run
        assert set(run_processes(ray_temp)) == {daemon.pid, child}
        sweep_ray(ray_temp)
        daemon.wait(timeout=10)
        assert not _alive(child)
    finally:
        for pid in (daemon.pid, child):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_sweep_kills_what_a_kill_orphaned(tmp_path: Path) -> None:
    """A process known before its parent was killed is swept though nothing links it to the
    run any more."""
    ray_temp = tmp_path / "vr-orphan"
    daemon, child = _daemon(ray_temp)
    try:
        known = run_processes(ray_temp)
        daemon.kill()
        daemon.wait(timeout=10)
        assert _alive(child) and child not in run_processes(ray_temp)
        sweep_ray(ray_temp, known)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child)
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def test_a_python_that_cannot_start_is_named(tmp_path: Path) -> None:
    _, run = job_run_spec(DEMO, "demo-no-python")
    result = launch_verl(run, 30, tmp_path / "cache", python=str(tmp_path / "no-python"))
    assert result.error_type == "VerlLaunchError"
    assert "no-python" in (result.error_message or "")
    assert "AUTOTUNER_ENGINE_PYTHON__VERL" in (result.error_message or "")


@pytest.mark.slow
def test_a_missing_checkpoint_is_written_before_the_runs_deadline(tmp_path: Path) -> None:
    """The first run writes the checkpoint under a deadline of its own, then verl gets its
    whole deadline (on CPU verl never finishes a step: the deadline ends it); a later run
    finds it cached."""
    python = verl_python()
    _, run = job_run_spec(DEMO, "demo-checkpoint")
    cache = tmp_path / "cache"
    timeout_s = 20.0
    first = launch_verl(run, timeout_s, cache, python=python, checkpoint_timeout_s=300.0)
    assert first.error_type == "VerlTimeout", first.error_message
    assert first.checkpoint_s > 0
    assert first.wall_s >= first.checkpoint_s + timeout_s
    assert (checkpoint_dir(run.model_config, run.model_name, run.dtype, cache) / COMPLETE_MARK).exists()
    # Cached: no checkpoint step; the runner itself is what cannot start here.
    later = launch_verl(run, timeout_s, cache, python=str(tmp_path / "no-python"))
    assert later.checkpoint_s == 0.0
    assert later.error_type == "VerlLaunchError"
