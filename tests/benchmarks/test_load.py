"""The load benchmark runs end to end (a few clients for a few seconds against the real
server it starts) and reports what it promises; the latencies themselves are not judged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENDPOINTS = {"POST /v1/jobs", "GET /v1/jobs", "GET /v1/jobs/{id}", "GET /v1/jobs/{id}/trials"}


@pytest.mark.slow
def test_the_load_benchmark_runs_and_reports(tmp_path) -> None:
    out = tmp_path / "load.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.load.run",
            "--clients",
            "3",
            "--duration-s",
            "3",
            "--out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["clients"] == 3 and result["errors"] == 0 and result["lost_jobs"] == 0
    jobs = result["jobs"]
    assert jobs["submitted"] > 0 and jobs["listed"] == jobs["submitted"], jobs
    assert set(result["endpoints"]) == ENDPOINTS
    for name, stats in result["endpoints"].items():
        assert stats["requests"] > 0, name
        assert stats["p50_ms"] <= stats["p95_ms"] <= stats["p99_ms"] <= stats["max_ms"], stats
    assert sum(s["requests"] for s in result["endpoints"].values()) == result["requests"]
    for name in ENDPOINTS:  # the printed table has a row per endpoint
        assert any(line.startswith(name + " ") for line in done.stdout.splitlines()), done.stdout
