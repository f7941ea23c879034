"""The web page's fixtures: a real `autotuner serve` on a free loopback port (its own SQLite
file, its own local Ray), a real train-only job on the tiny model, and headless Chromium
driven by Selenium through Debian's chromium + chromedriver (nothing is ever downloaded)."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ..serving import Server

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FINISHED = ("succeeded", "failed", "cancelled")

# A train-only job on the tiny model: 3 trials of real torch steps on the CPU.
E2E_JOB: dict[str, Any] = {
    "name": "web-e2e",
    "workload": {
        "model": "tiny",
        "dtype": "float32",
        "phases": "train",
        "prompt_length": {"kind": "uniform", "low": 16, "high": 48},
        "response_length": {"kind": "uniform", "low": 16, "high": 64},
        "max_prompt_length": 48,
        "max_response_length": 64,
        "train_batch_size": 16,
        "n": 2,
        "ppo_mini_batch_size": 8,
        "use_kl_loss": False,
    },
    "cluster": {"device": "cpu"},
    "budget": {"max_trials": 3, "trial_timeout_s": 120, "baseline_runs": 1},  # noise: test_noise_shown
    "sampler": "random",
}


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for the web tests: loopback, no token, a fresh SQLite file."""
    base = tmp_path_factory.mktemp("web-server")
    srv = Server(base / "data", base / "server.log").start()
    try:
        yield srv
    finally:
        try:
            srv.stop(require_clean_log=False)
        finally:
            ARTIFACTS.mkdir(exist_ok=True)  # the server's log, to read when a test fails
            shutil.copyfile(srv.log_path, ARTIFACTS / "web-server.log")


@pytest.fixture(scope="session")
def e2e_job_id(server: Server) -> str:
    """The id of the train-only job, submitted over HTTP (it runs in the background)."""
    response = httpx.post(f"{server.url}/v1/jobs", json=E2E_JOB, timeout=60)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


@pytest.fixture(scope="session")
def finished_job(server: Server, e2e_job_id: str) -> dict[str, Any]:
    """That job, once finished (as GET /v1/jobs/{id} returns it)."""
    job = server.wait_for_job(e2e_job_id, lambda j: j["status"] in FINISHED, 300)
    assert job["status"] == "succeeded", f"{job}\n{server.log()}"
    return job


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Headless Chromium under Selenium, with a fresh profile and a download folder
    (``browser.download_dir``). Skips without chromium, except on CI (``CI=true``)."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not path.exists():
            _unavailable(f"{path} is missing: apt-get install chromium chromium-driver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as exc:
        _unavailable(f"selenium is not installed ({exc}): pip install -e '.[dev]'")
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager: never download a driver or browser
    profile = tmp_path_factory.mktemp("chromium-profile")
    downloads = tmp_path_factory.mktemp("downloads")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        "--disable-sync",
        "--disable-quic",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.execute_cdp_cmd("Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    driver.download_dir = downloads
    try:
        yield driver
    finally:
        driver.quit()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A screenshot of the browser's page when a browser test fails, beside the server log."""
    report = yield
    browser = getattr(item, "funcargs", {}).get("browser")
    if report.when == "call" and report.failed and browser is not None:
        ARTIFACTS.mkdir(exist_ok=True)
        with contextlib.suppress(Exception):  # the browser may be what failed
            browser.save_screenshot(str(ARTIFACTS / f"failed-{item.name}.png"))
    return report


def app_with_job(tmp_path: Path, spec: Any) -> tuple[Any, Any, Any]:
    """An API app on a SQLite file of its own, the job ``spec`` submitted to it, and that
    job's study: for tests that replay trials into a real job and read them back."""
    from autotuner.api.app import create_app
    from autotuner.api.service import JobService
    from autotuner.jobs import JobContext
    from autotuner.settings import Settings
    from autotuner.study import open_study

    config = Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path / 'a.db'}")
    app = create_app(config)
    ctx = JobContext.open(config)
    app.state.service = JobService(ctx)
    job = ctx.submit(spec)
    return app, job, open_study(spec, job.study_name, config.resolved_database_url)


def replay_runner(spec: Any, study: Any, landscape: Any) -> Any:
    """A ``StudyRunner`` for ``spec``'s study whose trials are answered from the recorded
    ``landscape`` (``ReplayExecutor``), on its device and under its memory cap."""
    from autotuner.replay import ReplayExecutor
    from autotuner.space import SearchSpace
    from autotuner.study import StudyRunner

    return StudyRunner(
        spec,
        study,
        SearchSpace.build(spec, landscape.arch, landscape.device),
        ReplayExecutor(landscape),
        landscape.device,
        landscape.memory_cap_gib,
    )
