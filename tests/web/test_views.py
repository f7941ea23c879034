"""What the page shows, from records and specs directly: one point per measured trial on
the figure, the trials table, the example job; and who may read the pages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from autotuner.api import web
from autotuner.api.app import create_app
from autotuner.api.service import JobService
from autotuner.api.submission import validate_job
from autotuner.jobs import JobContext
from autotuner.records import TrialRecord
from autotuner.settings import Settings
from autotuner.spec import JobSpec
from autotuner.summary import front

KNOB = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"


def _record(number: int, status: str, **metrics: float) -> TrialRecord:
    return TrialRecord(
        number=number,
        status=status,
        metrics=metrics,
        config={KNOB: 2 ** (number % 4), "actor_rollout_ref.rollout.n": 1},
    )


RECORDS = [
    _record(0, "ok", throughput_tokens_per_s_per_gpu=100.0, peak_memory_gib=2.0),
    _record(1, "ok", throughput_tokens_per_s_per_gpu=150.0, peak_memory_gib=3.0),
    _record(2, "ok", throughput_tokens_per_s_per_gpu=120.0, peak_memory_gib=4.0),  # dominated
    _record(3, "oom", peak_memory_gib=7.5),
    _record(4, "timeout"),
    _record(5, "error"),
    _record(6, "invalid"),
    _record(7, "duplicate"),
    _record(8, "running"),
]


def test_figure_has_one_point_per_measured_trial() -> None:
    spec = JobSpec()
    pareto = front(spec, RECORDS)
    figure = web.figure(spec, RECORDS, pareto, cap_gib=8.0)
    traces = {t["name"]: t for t in figure["data"]}
    numbers = sorted(n for t in figure["data"] for n in t["customdata"])
    assert numbers == [r.number for r in RECORDS if r.measured] == [0, 1, 2, 3, 4, 5]
    assert traces["Pareto front"]["customdata"] == [0, 1]  # sorted by memory
    assert traces["Pareto front"]["mode"] == "lines+markers"
    assert traces["feasible"]["customdata"] == [2]
    oom = traces["OOM / timeout"]
    assert oom["customdata"] == [3, 4]
    assert oom["x"] == [7.5, 8.0] and oom["y"] == [0.0, 0.0]  # its peak memory; else the cap
    assert traces["error"]["customdata"] == [5]
    assert "memory cap 8 GiB" in str(figure["layout"]["annotations"])
    hover = traces["feasible"]["text"][0]
    assert hover.startswith("<b>trial 2</b> · ok") and "actor.ppo_micro_batch_size_per_gpu = 4" in hover


def test_figure_escapes_what_trials_report() -> None:
    rec = TrialRecord(
        number=0, status="error", error_type="<img src=x onerror=alert(1)>", config={KNOB: "<script>"}
    )
    text = web.figure(JobSpec(), [rec], [], cap_gib=None)["data"][3]["text"][0]
    assert "<img" not in text and "<script>" not in text and "&lt;script&gt;" in text


def test_trials_table_has_every_metric_and_the_varying_knobs() -> None:
    table = web.trials_table(RECORDS, {0, 1})
    keys = [c.key for c in table.columns]
    assert keys[:4] == ["status", "m:throughput_tokens_per_s_per_gpu", "m:peak_memory_gib", f"k:{KNOB}"]
    assert len(table.rows) == len(RECORDS)
    assert table.fixed_knobs == {"actor_rollout_ref.rollout.n": 1}
    assert [r.pareto for r in table.rows[:3]] == [True, True, False]
    assert table.rows[3].cells[keys.index("m:peak_memory_gib")] == ("7.5", "7.5")
    assert table.rows[4].cells[keys.index("m:peak_memory_gib")] == ("", "")


def test_example_job_is_valid(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path / 'a.db'}")
    spec = validate_job(yaml.safe_load(web.EXAMPLE_JOB), settings)
    assert spec.budget.max_trials <= 5 and spec.cluster.device == "cpu"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, ""),
        (True, "true"),
        (3, "3"),
        (2213.0, "2,213"),
        (129.64003, "129.6"),
        (0.02252197, "0.02252"),
        ("auto", "auto"),
    ],
)
def test_fmt(value: Any, text: str) -> None:
    assert web.fmt(value) == text


def _client(tmp_path: Path, **settings: Any) -> tuple[TestClient, JobContext]:
    """The app without its lifespan (no Ray, no runner): just pages over a job store."""
    config = Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path / 'a.db'}", **settings)
    app = create_app(config)
    ctx = JobContext.open(config)
    app.state.service = JobService(ctx)
    return TestClient(app, base_url="http://127.0.0.1"), ctx


def test_jobs_newest_first_and_a_token_field_when_the_service_has_a_token(tmp_path: Path) -> None:
    client, ctx = _client(tmp_path, api_token="s3cret")
    older = ctx.submit(JobSpec(name="older-job"))
    newer = ctx.submit(JobSpec(name="newer-job"))
    page = client.get("/")
    assert page.status_code == 200  # loopback: reads are open, even with a token
    assert page.text.index(newer.id) < page.text.index(older.id)
    assert 'id="submit-token"' in page.text
    job_page = client.get(f"/jobs/{newer.id}")
    assert job_page.status_code == 200 and "status-queued" in job_page.text
    assert 'id="cancel-button"' in job_page.text and 'id="cancel-token"' in job_page.text
    assert "no measured trial yet" in job_page.text


def test_pages_need_the_token_on_a_network_address(tmp_path: Path) -> None:
    client, ctx = _client(tmp_path, host="0.0.0.0", api_token="s3cret")
    job = ctx.submit(JobSpec(name="private-job"))
    for path in ("/", f"/jobs/{job.id}"):
        page = client.get(path)
        assert page.status_code == 401, path
        assert "private-job" not in page.text and 'id="token-form"' in page.text
        assert client.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
        client.cookies.set(web.TOKEN_COOKIE, "wrong")
        assert client.get(path).status_code == 401
        client.cookies.set(web.TOKEN_COOKIE, "s3cret")
        by_cookie = client.get(path)
        assert by_cookie.status_code == 200 and "private-job" in by_cookie.text
        client.cookies.clear()
        by_header = client.get(path, headers={"Authorization": "Bearer s3cret"})
        assert by_header.status_code == 200
    assert client.get("/static/app.css").status_code == 200  # assets hold no job data
