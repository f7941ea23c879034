"""Where the winner is shown, its runs are: a job whose finalists were re-measured (trials
replayed from the recorded CPU landscape into the job's own study), read through the
page and the JSON API."""

from __future__ import annotations

from pathlib import Path

import optuna
from fastapi.testclient import TestClient

from autotuner.api.web import duration, fmt
from autotuner.memory import MemoryModel
from autotuner.replay import Landscape, ReplayExecutor
from autotuner.space import SearchSpace
from autotuner.spec import JobSpec
from autotuner.study import StudyRunner
from autotuner.summary import runs_of, summarize

from .conftest import app_with_job, replay_runner

REPO = Path(__file__).resolve().parents[2]
LANDSCAPE = REPO / "benchmarks" / "search" / "landscapes" / "cpu-train-mid.json"
optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_the_page_and_the_api_show_the_winners_median_and_spread(tmp_path: Path) -> None:
    landscape = Landscape.load(LANDSCAPE)
    data = landscape.spec.model_dump(mode="json")
    data["budget"] |= {"max_trials": 8, "remeasure_finalists": 2, "remeasure_runs": 3, "patience_trials": 0}
    spec = JobSpec.model_validate(data)
    app, job, study = app_with_job(tmp_path, spec)
    runner = StudyRunner(
        spec,
        study,
        SearchSpace.build(spec, landscape.arch, "cpu"),
        ReplayExecutor(landscape),
        "cpu",
        landscape.memory_cap_gib,
        memory_model=MemoryModel(spec, landscape.arch, "cpu", 2.0, train_order=landscape.train_order),
    )
    runner.enqueue_baseline()
    result = runner.run()
    summary = summarize(spec, result.records, result.stop_reason)
    winner = runs_of(result.records)[summary.best]
    assert winner.n == 3

    client = TestClient(app, base_url="http://127.0.0.1")
    shown = client.get(f"/v1/jobs/{job.id}").json()["best"]
    assert shown["number"] == summary.best and shown["runs"]["runs"] == 3
    assert shown["throughput_tokens_per_s_per_gpu"] == winner.median
    assert shown["runs"]["spread_pct"] == winner.spread_pct
    best = client.get(f"/v1/jobs/{job.id}/best").json()
    assert best["number"] == summary.best and best["runs"]["median"] == winner.median
    trials = client.get(f"/v1/jobs/{job.id}/trials").json()["data"]
    assert sum(1 for t in trials if t["repeat_of"] == summary.best) == 2
    assert all(t["predicted_memory_gib"] for t in trials if t["measured"])
    exported = client.get(f"/v1/jobs/{job.id}/trials/{summary.best}/config").text
    assert "median of 3 runs" in exported and f"spread {winner.spread_pct:.1f}%" in exported
    page = client.get(f"/jobs/{job.id}").text
    assert f"(median of 3 runs, spread {winner.spread_pct:.1f}%)" in page
    # The Pareto table gives each front trial's median, spread and n too.
    table = page[page.index('id="pareto-table"') : page.index("</table>", page.index('id="pareto-table"'))]
    row = table[table.index(f'data-trial="{summary.best}"') :].split("</tr>")[0]
    assert f"(median of 3, spread {winner.spread_pct:.1f}%)" in row
    assert f">{fmt(winner.median)} <" in row, row
    others = [r for r in table.split("<tr data-trial=")[1:] if f'"{summary.best}"' not in r[:8]]
    assert all("(1 run)" in r or "(median of 3" in r for r in others)
    # The jobs list gives the best's median with its runs too.
    listed = client.get("/").text
    row = listed[listed.index(f'data-job-id="{job.id}"') :].split("</tr>")[0]
    assert f"<span data-best-throughput>{fmt(winner.median)}</span>" in row
    assert f"(median of 3, spread {winner.spread_pct:.1f}%)" in row
    assert f"re-run of #{summary.best}" in page and "predicted peak GiB" in page
    assert "memory model" in page
    # What the job cost in GPU time, and what it had cost when the winner first ran.
    assert 0 < summary.gpu_seconds_to_best < summary.gpu_seconds  # type: ignore[operator]
    cost = f"{duration(summary.gpu_seconds)}, the best found after {duration(summary.gpu_seconds_to_best)}"
    assert "<dd data-gpu-time" in page and cost in page, cost
    # And once a config the noise cannot tell from the winner had run, linked to its row: on
    # this CPU landscape the baselines' runs spread wide, so an earlier trial ties the winner.
    tied = summary.first_tied
    assert tied is not None and tied < summary.best and summary.gpu_seconds_to_tie is not None
    assert 0 < summary.gpu_seconds_to_tie < summary.gpu_seconds_to_best  # type: ignore[operator]
    shown_tie = f'(<a href="#trial-{tied}">#{tied}</a>) after <span data-gpu-time-to-tie>'
    assert f"{shown_tie}{duration(summary.gpu_seconds_to_tie)}</span>" in page
    # Where that earlier trial is one of verl's baselines, the search's own first one too.
    own = summary.first_tied_proposed
    if own in (None, tied, summary.best):
        assert "data-gpu-time-to-search-tie" not in page
    else:
        shown_own = f'(<a href="#trial-{own}">#{own}</a>) after <span data-gpu-time-to-search-tie>'
        assert f"{shown_own}{duration(summary.gpu_seconds_to_tie_proposed)}</span>" in page


def test_where_verls_defaults_win_the_page_names_the_searchs_first_config_inside_their_band(
    tmp_path: Path,
) -> None:
    """Replayed with seed 1, verl's defaults are the winner: the page's GPU-time line names
    the search's first config inside their tie band, linked to its row, and what it cost."""
    landscape = Landscape.load(LANDSCAPE)
    data = landscape.spec.model_dump(mode="json") | {"seed": 1}
    data["budget"] |= {"max_trials": 8, "remeasure_finalists": 2, "remeasure_runs": 3, "patience_trials": 0}
    spec = JobSpec.model_validate(data)
    app, job, study = app_with_job(tmp_path, spec)
    runner = replay_runner(spec, study, landscape)
    runner.enqueue_baseline()
    result = runner.run()
    summary = summarize(spec, result.records, result.stop_reason)
    baselines = {r.number for r in result.records if r.baseline}
    assert summary.best in baselines and summary.first_tied == summary.best
    own = summary.first_tied_proposed
    assert own is not None and own not in baselines and summary.gpu_seconds_to_tie_proposed is not None
    page = TestClient(app, base_url="http://127.0.0.1").get(f"/jobs/{job.id}").text
    shown = f'the search\'s first inside its tie band (<a href="#trial-{own}">#{own}</a>) after '
    assert (
        f"{shown}<span data-gpu-time-to-search-tie>{duration(summary.gpu_seconds_to_tie_proposed)}</span>"
        in page
    )
    assert f'id="trial-{own}"' in page  # the link's target, the trial's row
