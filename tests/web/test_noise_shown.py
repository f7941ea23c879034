"""The job's noise, measured on its baselines' repeats, the tie rule it sets, and the kinds
of host its runs came from, as the API, the page and the CLI's status show them: trials
replayed from the recorded CPU landscape into a real job's study, read back over HTTP
(TestClient)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from fastapi.testclient import TestClient
from markupsafe import escape

from autotuner.cli import _best_line, _noise_lines
from autotuner.records import config_key
from autotuner.replay import Landscape
from autotuner.spec import JobSpec
from autotuner.summary import runs_of, summarize
from trials.metrics import PEAK_MEMORY, THROUGHPUT

from .conftest import app_with_job, replay_runner

REPO = Path(__file__).resolve().parents[2]
LANDSCAPE = REPO / "benchmarks" / "search" / "landscapes" / "cpu-train-mid.json"
optuna.logging.set_verbosity(optuna.logging.WARNING)


def _job(tmp_path: Path, noise_band_pct: float, landscape: Landscape | None = None):
    landscape = landscape or Landscape.load(LANDSCAPE)
    data = landscape.spec.model_dump(mode="json")
    data["budget"] |= {
        "max_trials": 8,
        "remeasure_finalists": 1,
        "patience_trials": 0,
        "noise_band_pct": noise_band_pct,
    }
    spec = JobSpec.model_validate(data)
    app, job, study = app_with_job(tmp_path, spec)
    runner = replay_runner(spec, study, landscape)
    runner.enqueue_baseline()
    result = runner.run()
    return TestClient(app, base_url="http://127.0.0.1"), job, summarize(spec, result.records, ""), result


@pytest.mark.parametrize("floor", [2.0, 49.0])
def test_the_api_page_and_cli_report_the_noise_and_call_ties(tmp_path: Path, floor: float) -> None:
    client, job, summary, result = _job(tmp_path, floor)
    defaults = summary.baselines["verl-v0.9-defaults"]
    assert defaults["runs"] == 3  # first, mid-job, last
    shown = client.get(f"/v1/jobs/{job.id}").json()
    noise = shown["noise"]
    assert noise["measured_pct"] == pytest.approx(summary.noise_pct) and noise["runs"] >= 3
    assert noise["band_pct"] == pytest.approx(max(floor, summary.noise_pct))
    by_name = {b["name"]: b for b in shown["baselines"]}
    runs = runs_of(result.records)[defaults["trial"]]
    api = by_name["verl-v0.9-defaults"]
    assert api["throughput"] == {
        "runs": 3,
        "median": runs.median,
        "low": runs.low,
        "high": runs.high,
        "spread_pct": runs.spread_pct,
    }
    assert api["verdict"] == defaults["verdict"]
    # Every trial that ran to a throughput carries median, spread and n.
    trials = client.get(f"/v1/jobs/{job.id}/trials").json()["data"]
    assert all(t["runs"]["runs"] >= 1 for t in trials if t["feasible"])
    front = client.get(f"/v1/jobs/{job.id}/pareto").json()["data"]
    by_number = {t["number"]: t for t in trials}
    assert front and all(p["runs"] == by_number[p["number"]]["runs"] for p in front)
    page = client.get(f"/jobs/{job.id}").text
    assert f"noise {summary.noise_pct:.1f}%, measured on {summary.noise_runs} runs" in page
    assert 'data-key="r:median"' in page and 'data-key="r:n"' in page  # the trials table's runs
    status = "\n".join(_noise_lines(shown))
    assert f"tie band {noise['band_pct']:.1f}%" in status
    if floor == 49.0:  # every difference on this landscape is inside a 49% band
        assert summary.verdict_over_baseline == "tie" and api["verdict"] == "tie"


def _defaults_slower_and_larger(landscape: Landscape, defaults: dict) -> Landscape:
    """The landscape with verl's defaults' runs 25% slower and three times as large in peak
    memory, so that another config wins while the gap stays inside this landscape's noise."""
    out = Landscape.from_dict(landscape.to_dict())
    point = next(p for p in out.points if config_key(p.config) == config_key(defaults))
    for run in point.runs:
        run.metrics[THROUGHPUT] *= 0.75
        run.metrics[PEAK_MEMORY] *= 3
    return out


def test_a_winner_inside_the_noise_of_verls_defaults_is_shown_as_a_tie(tmp_path: Path) -> None:
    landscape = Landscape.load(LANDSCAPE)
    *_, first = _job(tmp_path / "first", 2.0, landscape)
    defaults = next(r for r in first.records if r.baseline == "verl-v0.9-defaults").config
    client, job, summary, _ = _job(
        tmp_path / "derived", 2.0, _defaults_slower_and_larger(landscape, defaults)
    )
    assert summary.best != summary.baseline and summary.gain_over_baseline is not None
    band = summary.baselines["verl-v0.9-defaults"]["tie_band_pct"]
    assert summary.gain_over_baseline - 1 < band / 100  # inside the measured noise
    assert summary.verdict_over_baseline == "tie"
    page = client.get(f"/jobs/{job.id}").text
    assert 'data-verdict="tie">ties</strong> verl' in page
    # The band that comparison used: here the defaults' own spread, wider than the job's.
    assert summary.band_over_baseline == band > summary.tie_band_pct
    assert f"{summary.gain_over_baseline:.2f}×, inside the {band:.1f}% noise band" in page
    status = "\n".join(_noise_lines(client.get(f"/v1/jobs/{job.id}").json()))
    assert "the best ties it" in status
    # So does the CLI's line for the winner when a job ends.
    said = _best_line(summary, "cpu")
    assert (
        f"ties verl's defaults ({summary.gain_over_baseline:.2f}x, inside the {band:.1f}% noise band)" in said
    )


def test_runs_from_two_kinds_of_host_are_named_by_the_api_page_and_cli(tmp_path: Path) -> None:
    landscape = Landscape.load(LANDSCAPE)
    for n, point in enumerate(landscape.points):  # configs alternate between two kinds of host
        for run in point.runs:
            run.software = {**run.software, "cpu": "Test CPU", "host_cpus": "32" if n % 2 else "16"}
    client, job, summary, result = _job(tmp_path, 2.0, landscape)
    assert set(summary.hosts) == {"Test CPU, 16 CPUs", "Test CPU, 32 CPUs"}
    assert sum(summary.hosts.values()) == sum(r.ran for r in result.records)
    line = summary.hosts_line()
    assert line is not None
    shown = client.get(f"/v1/jobs/{job.id}").json()
    assert shown["hosts"] == summary.hosts
    assert f'<div class="muted small" data-hosts>{escape(line)}</div>' in client.get(f"/jobs/{job.id}").text
    assert f"  {line}" in _noise_lines(shown)
