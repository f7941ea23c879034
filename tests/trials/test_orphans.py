"""A trial whose launcher dies (a Ray worker killed with its driver) takes its engine with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from trial_helpers import REPO, TINY_CONFIG, make_spec

pytestmark = pytest.mark.engine

# The launcher stand-in: starts the trial in its own session, as launch_trial does, prints
# the trial's pid, then waits (it is killed with SIGKILL by the test, cleanup-free).
LAUNCHER = """
import subprocess, sys
proc = subprocess.Popen([sys.executable, "-m", "trials", "run", "--spec", sys.argv[1],
                         "--out", sys.argv[2]], start_new_session=True,
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(proc.pid, flush=True)
proc.wait()
"""


def _session(sid: int) -> list[psutil.Process]:
    out = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == sid and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return out


def test_killing_the_launcher_mid_rollout_leaves_no_engine_behind(tmp_path):
    spec = make_spec(json.loads(TINY_CONFIG.read_text()), trial_id="orphan", phases=["rollout"])
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(spec.to_json())
    env = dict(os.environ, PYTHONPATH=str(REPO))
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(spec_path), str(tmp_path / "out.json")],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    trial_pid = int(launcher.stdout.readline())
    # Wait until the engine process exists: the trial is then blocked inside vLLM. Alone this
    # takes seconds; beside the suite's other engines on 2 cores, importing vLLM took over 120 s.
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(_session(trial_pid)) < 2:
        time.sleep(0.5)
    assert len(_session(trial_pid)) >= 2, "the engine never started"
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _session(trial_pid):
        time.sleep(0.5)
    assert _session(trial_pid) == [], [p.name() for p in _session(trial_pid)]
    assert not (tmp_path / "out.json").exists()
