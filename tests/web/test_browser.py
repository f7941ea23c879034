"""The web page in a real browser (headless Chromium) against a real server running a real
job: live progress, the Pareto scatter, the trials table, downloads, the submit form."""

from __future__ import annotations

import base64
import re
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from autotuner.verl_check import CHECK_TIMEOUT_S

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
FINISHED = ("succeeded", "failed", "cancelled")
pytestmark = pytest.mark.timeout(400)


def _js(browser: Any, script: str, *args: Any) -> Any:
    return browser.execute_script(script, *args)


def _wait(browser: Any, condition: Any, timeout_s: float, what: str) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, timeout_s, poll_frequency=0.5).until(condition, message=what)


def _status(browser: Any) -> str:
    return str(_js(browser, "return document.getElementById('job').dataset.status"))


def _column(browser: Any, key: str) -> list[str]:
    """The trials table's ``data-sort`` values of one column, top to bottom."""
    return list(
        _js(
            browser,
            """
        const table = document.getElementById('trials-table');
        const index = Array.from(table.tHead.rows[0].cells).findIndex(th => th.dataset.key === arguments[0]);
        return Array.from(table.tBodies[0].rows).map(row => row.cells[index].dataset.sort);
    """,
            key,
        )
    )


def _click_header(browser: Any, key: str) -> None:
    button = browser.find_element("css selector", f"#trials-table th[data-key='{key}'] button")
    # Centred, so that the sticky trial-number column does not cover it.
    _js(browser, "arguments[0].scrollIntoView({block: 'center', inline: 'center'})", button)
    button.click()


def _severe_console_errors(browser: Any) -> list[str]:
    return [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def test_job_page_follows_a_real_job(server: Any, e2e_job_id: str, browser: Any) -> None:
    browser.get(f"{server.url}/jobs/{e2e_job_id}")
    assert browser.find_element("css selector", "h1").text == "web-e2e"
    assert browser.find_element("css selector", "[data-progress]").is_displayed()
    opened_while_active = _status(browser) not in FINISHED
    _js(browser, "window.sameDocument = true")  # gone if the page reloads

    _wait(browser, lambda b: _status(b) in FINISHED, 300, "the page never showed the job finished")
    assert _status(browser) == "succeeded", server.log()
    if opened_while_active:  # the page followed the job by polling, without a reload
        assert _js(browser, "return window.sameDocument === true")
    job = httpx.get(f"{server.url}/v1/jobs/{e2e_job_id}").json()
    trials = httpx.get(f"{server.url}/v1/jobs/{e2e_job_id}/trials").json()["data"]
    pareto = httpx.get(f"{server.url}/v1/jobs/{e2e_job_id}/pareto").json()["data"]
    measured = sorted(t["number"] for t in trials if t["measured"])
    assert len(measured) == job["trials_done"] == 3
    progress = browser.find_element("css selector", "[data-progress-text]").text
    assert progress == "3 / 3"

    # The scatter: exactly one point per measured trial, the front in its own trace.
    traces = _js(
        browser,
        """
        return document.getElementById('pareto-plot').data.map(t => ({
            name: t.name, numbers: Array.from(t.customdata || []), x: Array.from(t.x),
            y: Array.from(t.y), text: Array.from(t.text || [])}));
    """,
    )
    assert sorted(n for t in traces for n in t["numbers"]) == measured
    by_name = {t["name"]: t for t in traces}
    assert sorted(by_name["Pareto front"]["numbers"]) == sorted(p["number"] for p in pareto)
    metrics = {t["number"]: t["metrics"] for t in trials}
    for trace in traces:
        for number, x, y, text in zip(trace["numbers"], trace["x"], trace["y"], trace["text"], strict=True):
            assert x == pytest.approx(metrics[number]["peak_memory_gib"])
            assert y == pytest.approx(metrics[number]["throughput_tokens_per_s_per_gpu"])
            assert f"trial {number}</b> · ok" in text
            assert "actor.ppo_micro_batch_size_per_gpu" in text or "use_dynamic_bsz" in text

    # The trials table: one row per trial; a header click sorts, a second reverses.
    rows = browser.find_elements("css selector", "#trials-table tbody tr")
    assert len(rows) == len(trials)
    key = "m:throughput_tokens_per_s_per_gpu"
    _click_header(browser, key)
    values = [float(v) for v in _column(browser, key)]
    assert values == sorted(values, reverse=True) and len(set(values)) > 1
    _click_header(browser, key)
    assert [float(v) for v in _column(browser, key)] == sorted(values)
    _click_header(browser, "number")
    assert [int(v) for v in _column(browser, "number")] == sorted(t["number"] for t in trials)

    # Clicking a point selects its trial and offers its config.
    star = browser.find_element("css selector", "#pareto-plot .scatterlayer .trace .points path")
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(browser).move_to_element(star).pause(0.3).click().perform()
    _wait(
        browser,
        lambda b: b.find_element("id", "selection").is_displayed(),
        10,
        "clicking a point showed no selection",
    )
    assert browser.find_element("css selector", "#selection a[data-download]").is_displayed()

    # Download: the row's link is a real download (a file in Chromium's download folder),
    # and its YAML is a verl config.
    best = job["best"]["number"]
    link = browser.find_element("css selector", f"#trial-{best} a[data-download][href$='format=yaml']")
    assert link.get_attribute("download") == f"web-e2e-trial{best}.yaml"
    # A config's first export waits for verl's own check of it (a process that imports verl),
    # longer than Selenium's default 30 s for a script on a loaded machine.
    browser.set_script_timeout(CHECK_TIMEOUT_S + 30)
    fetched = _js(browser, "return fetch(arguments[0]).then(r => r.text())", link.get_attribute("href"))
    assert "actor_rollout_ref" in yaml.safe_load(fetched)
    _js(browser, "arguments[0].scrollIntoView({block: 'center'})", link)
    link.click()
    saved: Path = browser.download_dir / f"web-e2e-trial{best}.yaml"
    deadline = time.monotonic() + 20
    while not saved.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert saved.exists(), list(browser.download_dir.iterdir())
    config = yaml.safe_load(saved.read_text())
    assert "actor_rollout_ref" in config and "rollout" in config["actor_rollout_ref"]

    # Everything the page loaded came from the server itself.
    origins = _js(
        browser,
        """
        return performance.getEntriesByType('resource').map(e => new URL(e.name).origin);
    """,
    )
    assert set(origins) <= {server.url}
    assert _severe_console_errors(browser) == []

    ARTIFACTS.mkdir(exist_ok=True)
    _click_header(browser, key)
    _js(browser, "window.scrollTo(0, 0)")
    size = browser.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    shot = browser.execute_cdp_cmd(
        "Page.captureScreenshot",
        {
            "format": "png",
            "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1},
        },
    )
    (ARTIFACTS / "job-page.png").write_bytes(base64.b64decode(shot["data"]))


def test_submit_form_reports_the_field_then_submits_and_cancels(server: Any, browser: Any) -> None:
    browser.get(server.url + "/")
    spec = browser.find_element("id", "spec")
    error = browser.find_element("id", "submit-error")

    # A spec the API refuses: the page shows its message, naming the field.
    example = spec.get_attribute("value")
    assert "train_batch_size: 16" in example
    _js(
        browser,
        "arguments[0].value = arguments[1]",
        spec,
        example.replace("train_batch_size: 16", "train_batch_size: 0"),
    )
    browser.find_element("id", "submit-button").click()
    _wait(
        browser,
        lambda b: b.find_element("id", "submit-error").is_displayed(),
        30,
        "no error shown for an invalid spec",
    )
    assert "422" in error.text and "workload.train_batch_size" in error.text
    assert browser.current_url == server.url + "/"

    # A valid one (JSON this time): 201, and the browser lands on the new job's page.
    _js(
        browser,
        "arguments[0].value = arguments[1]",
        spec,
        '{"name": "web-form", "workload": {"model": "tiny", "phases": "train", "dtype": "float32"},'
        ' "cluster": {"device": "cpu"}, "budget": {"max_trials": 2, "trial_timeout_s": 60}}',
    )
    browser.find_element("id", "submit-button").click()
    _wait(browser, lambda b: "/jobs/" in b.current_url, 30, "no navigation to the new job")
    job_id = browser.current_url.rsplit("/", 1)[1]
    assert browser.find_element("css selector", "h1").text == "web-form"
    assert _status(browser) in ("queued", "running")
    # The form sent an Idempotency-Key with it: a retry after a lost answer gets this job back.
    db = sqlite3.connect(server.data_dir / "autotuner.db")
    try:
        (key,) = db.execute("SELECT idempotency_key FROM jobs WHERE id = ?", (job_id,)).fetchone()
    finally:
        db.close()
    assert key is not None and re.fullmatch(r"[0-9a-f]{32}", key), key

    # Cancel it from the page.
    browser.find_element("id", "cancel-button").click()
    browser.switch_to.alert.accept()
    job = server.wait_for_job(job_id, lambda j: j["status"] in FINISHED, 120)
    assert job["status"] == "cancelled"
    _wait(browser, lambda b: _status(b) == "cancelled", 30, "the page never showed the cancel")
    assert not browser.find_elements("id", "cancel-button")
    refused = "/v1/jobs - Failed to load resource: the server responded with a status of 422"
    assert [e for e in _severe_console_errors(browser) if refused not in e] == []
