"""The pages as a real server renders them for a real job: the jobs list, the job page, the
404 page, Plotly's bundle from our own origin, and no reference to any other host."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest


class _Links(HTMLParser):
    """Every URL a page would load or link to: src, href, action."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [v for k, v in attrs if k in ("src", "href", "action") and v is not None]


def _urls(html: str) -> list[str]:
    parser = _Links()
    parser.feed(html)
    return parser.urls


def _figure(html: str) -> dict[str, Any]:
    found = re.search(r'<script type="application/json" id="figure-data">(.*?)</script>', html, re.S)
    assert found, "the job page carries no figure"
    return dict(json.loads(found.group(1)))


def test_jobs_page_lists_the_job_with_its_progress(server: Any, finished_job: dict[str, Any]) -> None:
    page = httpx.get(server.url + "/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    row = re.search(rf'<tr data-job-id="{finished_job["id"]}".*?</tr>', page.text, re.S)
    assert row, page.text
    assert f'href="/jobs/{finished_job["id"]}">web-e2e</a>' in row.group(0)
    assert "status-succeeded" in row.group(0) and "3 / 3" in row.group(0)
    assert 'id="submit-form"' in page.text and "name: my-first-job" in page.text
    assert 'id="submit-token"' not in page.text  # the service has no token
    assert "default-src 'self'" in page.headers["content-security-policy"]


def test_job_page_shows_status_front_trials_and_downloads(server: Any, finished_job: dict[str, Any]) -> None:
    job_id = finished_job["id"]
    page = httpx.get(f"{server.url}/jobs/{job_id}")
    assert page.status_code == 200
    assert "<h1>web-e2e</h1>" in page.text and "status-succeeded" in page.text
    assert "data-progress-text>3 / 3<" in page.text
    trials = httpx.get(f"{server.url}/v1/jobs/{job_id}/trials").json()["data"]
    figure = _figure(page.text)
    points = sorted(n for trace in figure["data"] for n in trace["customdata"])
    assert points == sorted(t["number"] for t in trials if t["measured"])
    assert len(re.findall(r'<tr id="trial-\d+"', page.text)) == len(trials)
    for t in trials:
        href = f"/v1/jobs/{job_id}/trials/{t['number']}/config?format=yaml"
        link = rf'<a [^>]*href="{re.escape(href)}"[^>]*download="web-e2e-trial{t["number"]}\.yaml"'
        assert re.search(link, page.text), href
        download = httpx.get(server.url + href, timeout=180)  # the first export runs verl's own check
        assert download.status_code == 200
        assert "attachment" in download.headers["content-disposition"]


def test_unknown_job_gets_a_404_page(server: Any) -> None:
    page = httpx.get(f"{server.url}/jobs/no-such-job")
    assert page.status_code == 404
    assert page.headers["content-type"].startswith("text/html")
    assert "No such job" in page.text and "no-such-job" in page.text


def test_plotly_comes_from_the_plotly_package(server: Any, finished_job: dict[str, Any]) -> None:
    import plotly.offline

    page = httpx.get(f"{server.url}/jobs/{finished_job['id']}").text
    src = next(u for u in _urls(page) if "plotly" in u)
    assert src.startswith("/static/plotly.min.js?v=")
    bundle = httpx.get(server.url + src)
    assert bundle.status_code == 200
    assert bundle.headers["content-type"].startswith("text/javascript")
    assert "immutable" in bundle.headers["cache-control"]
    assert len(bundle.content) > 1_000_000
    assert bundle.text.startswith(f"/**\n* plotly.js v{plotly.offline.get_plotlyjs_version()}")
    assert bundle.text == plotly.offline.get_plotlyjs()
    assert httpx.get(f"{server.url}/static/plotly.min.js").content == bundle.content
    assert httpx.get(f"{server.url}/static/nope.js").status_code == 404


@pytest.mark.parametrize("path", ["/", "/jobs/{id}", "/jobs/no-such-job"])
def test_pages_load_nothing_from_other_hosts(server: Any, finished_job: dict[str, Any], path: str) -> None:
    page = httpx.get(server.url + path.format(id=finished_job["id"])).text
    urls = _urls(page)
    assert any(u.startswith("/static/") for u in urls)
    for url in urls:
        parts = urlsplit(url)
        assert parts.scheme in ("", "data") and not parts.netloc, url
    assert not re.search(r"""(src|href|action)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    for name in re.findall(r"/static/([\w.-]+)\?v=", page):
        if name != "plotly.min.js":
            asset = httpx.get(f"{server.url}/static/{name}").text
            assert not re.search(r"https?://|url\(", asset), name
