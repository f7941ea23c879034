"""Shared fixtures for control-plane tests that run real trials."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The trial tests' helper modules (trial_watch: process watchers) serve these tests too.
if str(REPO / "tests" / "trials") not in sys.path:
    sys.path.append(str(REPO / "tests" / "trials"))


@pytest.fixture(scope="module")
def ray_local():
    """A real local Ray with the machine's CPUs (trials reserve CPUs on a CPU machine).

    Shut down after each module: a driver left connected while later modules launch
    engine trials directly was seen to exit pytest abruptly (status 1, no summary) during
    tests/trials' KV-too-small trial; not reproduced outside pytest."""
    import ray

    if not ray.is_initialized():
        # "local": a cluster of this test's own, never one a `ray start` left on the machine.
        ray.init(
            address="local",
            num_cpus=os.cpu_count() or 2,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    yield ray
    ray.shutdown()


def run_cli(args: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "autotuner.cli", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def cli_env(tmp_path) -> dict[str, str]:
    """Environment for a CLI run with its own data dir (SQLite) and a 2-CPU local Ray."""
    env = dict(os.environ)
    env["AUTOTUNER_DATA_DIR"] = str(tmp_path / "data")
    env["AUTOTUNER_RAY_NUM_CPUS"] = "2"
    env["COLUMNS"] = "200"
    env.pop("AUTOTUNER_DATABASE_URL", None)
    return env


def write_job(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data))
    return path


def dumped_job(path: Path):
    """The first job of a results file (``benchmarks/gpu/dump_results.py``): its spec and its
    trials that have a config, as ``TrialRecord`` (the dump's extra keys, e.g. ``error_cause``,
    left out)."""
    import dataclasses

    from autotuner.records import TrialRecord
    from autotuner.spec import JobSpec

    job = json.loads(path.read_text())["jobs"][0]
    names = {f.name for f in dataclasses.fields(TrialRecord)}
    trials = [
        TrialRecord(**{k: v for k, v in t.items() if k in names}) for t in job["trials"] if t.get("config")
    ]
    return JobSpec.model_validate(job["spec"]), trials
