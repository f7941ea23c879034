"""Bad requests get a 4xx that names the field, nothing is stored, and nothing is a 5xx."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi.testclient import TestClient

from autotuner.api.app import create_app
from autotuner.settings import Settings

from .conftest import REPO, TOKEN, A, R, train_job

MB = A + "ppo_micro_batch_size_per_gpu"


def _with(section: str, **changes: Any) -> dict[str, Any]:
    job = train_job()
    job[section] = {**job[section], **changes}
    return job


# (body, loc the error names, a phrase its message holds)
INVALID_JOBS = {
    "wrong type": (
        _with("workload", train_batch_size="many"),
        ["body", "workload", "train_batch_size"],
        "valid integer",
    ),
    "wrong type deep": (
        _with("workload", prompt_length={"kind": "fixed", "value": [1]}),
        ["body", "workload", "prompt_length", "fixed", "value"],
        "integer",
    ),
    "unknown field": (_with("budget", max_trails=3), ["body", "budget", "max_trails"], "Extra inputs"),
    "unknown knob": (
        _with("search", **{R + "max_num_sequences": 8}),
        ["body", "search", R + "max_num_sequences"],
        "unknown knob",
    ),
    "unknown knob in a baseline": (
        {**train_job(), "baselines": {"mine": {R + "max_num_sequences": 8}}},
        ["body", "baselines", "mine", R + "max_num_sequences"],
        "use knob paths from the search space",
    ),
    "repeated objective": (
        {**train_job(), "objectives": [{"metric": "step_time_s"}, {"metric": "step_time_s"}]},
        ["body", "objectives"],
        "list each metric once",
    ),
    "impossible range": (
        _with("search", **{MB: {"low": 5, "high": 7}}),
        ["body", "search", MB],
        "no valid value in [5.0, 7.0]",
    ),
    "reversed range": (
        _with("search", **{MB: {"low": 4, "high": 1}}),
        ["body", "search", MB],
        "low (4.0) must be <= high (1.0)",
    ),
    "value verl rejects": (
        _with("search", **{R + "gpu_memory_utilization": 3.0}),
        ["body", "search", R + "gpu_memory_utilization", "fixed"],
        "not in its domain: a number in (0, 1]",
    ),
    "choice verl rejects": (
        _with("search", **{MB: [1, 3]}),
        ["body", "search", MB, "choices"],
        "does not divide",
    ),
    "range on a bool knob": (
        _with("search", **{A + "use_dynamic_bsz": {"low": 0, "high": 1}}),
        ["body", "search", A + "use_dynamic_bsz"],
        "bool knob",
    ),
    "unknown model": (
        _with("workload", model="no-such-model"),
        ["body", "workload", "model"],
        "neither a built-in model",
    ),
    "model path escaping": (
        _with("workload", model="../outside/config.json"),
        ["body", "workload", "model"],
        "outside the models directory",
    ),
    "batch rule": (
        _with("workload", ppo_mini_batch_size=16),
        ["body", "workload"],
        "ppo_mini_batch_size (16) must be <= train_batch_size (8)",
    ),
    "too many trials": (
        _with("budget", max_trials=51),
        ["body", "budget", "max_trials"],
        "AUTOTUNER_MAX_JOB_TRIALS",
    ),
    "too many minutes": (
        _with("budget", max_minutes=601),
        ["body", "budget", "max_minutes"],
        "AUTOTUNER_MAX_JOB_MINUTES",
    ),
    "not a mapping": ([1, 2], ["body"], "mapping"),
    # Infinity spelled as text gets past JSON's own number rules, and would be stored as null:
    # the job could then never be read back (its listing, page and export would all fail).
    "infinite mean as text": (
        _with("workload", response_length={"kind": "normal", "mean": "inf", "std": 1}),
        ["body", "workload", "response_length", "normal", "mean"],
        "finite number",
    ),
    "overflowing median as text": (
        _with("workload", response_length={"kind": "lognormal", "median": "1e999"}),
        ["body", "workload", "response_length", "lognormal", "median"],
        "finite number",
    ),
    "infinite std": (
        _with("workload", prompt_length={"kind": "normal", "mean": 100, "std": "Infinity"}),
        ["body", "workload", "prompt_length", "normal", "std"],
        "finite number",
    ),
    "NaN as text": (_with("budget", max_minutes="nan"), ["body", "budget", "max_minutes"], "finite number"),
    "length past 64-bit integers": (
        _with("workload", response_length={"kind": "list", "values": [8, 2**63]}),
        ["body", "workload", "response_length", "list", "values", 1],
        "less than or equal to 1000000000",
    ),
    "uniform high past what draws compute in": (
        _with("workload", response_length={"kind": "uniform", "low": 1, "high": 2**63 - 1}),
        ["body", "workload", "response_length", "uniform", "high"],
        "less than or equal to 1000000000",
    ),
    "baseline named as a built-in one": (
        {**train_job(), "baselines": {"verl-v0.9-defaults": {MB: 2}}},
        ["body", "baselines", "verl-v0.9-defaults"],
        "give your baseline another name",
    ),
    "sglang on a CPU": (
        _with("workload", engine="sglang", phases="both"),
        ["body", "workload", "engine"],
        "sglang runs on CUDA GPUs only",
    ),
    "bad objective": (
        {**train_job(), "objectives": [{"metric": "speed"}]},
        ["body", "objectives", 0, "metric"],
        "throughput_tokens_per_s_per_gpu",
    ),
}


@pytest.fixture(scope="module")
def outside(tmp_path_factory: pytest.TempPathFactory, models_dir: Path) -> Path:
    """A real config.json outside the models dir, and a symlink to it from inside."""
    root = tmp_path_factory.mktemp("outside")
    config = root / "config.json"
    config.write_text((REPO / "autotuner" / "catalog" / "tiny.json").read_text())
    link = models_dir / "sneaky"
    if not link.exists():
        link.symlink_to(root)
    return config


def _job_count(api: httpx.Client) -> int:
    return int(api.get("/v1/jobs").json()["count"])


def _assert_names(response: httpx.Response, loc: list[Any], phrase: str) -> None:
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert isinstance(detail, list) and detail, detail
    assert any(d["loc"] == loc and phrase in d["msg"] for d in detail), (loc, phrase, detail)


@pytest.mark.parametrize("case", list(INVALID_JOBS))
def test_an_invalid_job_is_refused_naming_the_field(api, case, outside) -> None:
    body, loc, phrase = INVALID_JOBS[case]
    before = _job_count(api)
    _assert_names(api.post("/v1/jobs", json=body), loc, phrase)
    assert _job_count(api) == before


def test_model_paths_must_stay_inside_the_models_dir(api, outside, models_dir) -> None:
    loc = ["body", "workload", "model"]
    for model in (str(outside), "sneaky/config.json", "sneaky", "tiny-copy/../../x"):
        _assert_names(api.post("/v1/jobs", json=_with("workload", model=model)), loc, "outside")
    _assert_names(
        api.post("/v1/jobs", json=_with("workload", model="tiny-copy/nothing.json")), loc, "models directory"
    )
    # "~" names no home folder on the server: it is a plain name inside the models dir.
    for model in ("~nosuchuser/config.json", "~/config.json", "~root"):
        _assert_names(api.post("/v1/jobs", json=_with("workload", model=model)), loc, "models directory")


def test_a_file_too_big_for_a_config_is_refused_unread(api, models_dir) -> None:
    """A weights file beside the config (gigabytes on a real model) is refused by its size,
    before the service reads it into memory."""
    weights = models_dir / "tiny-copy" / "model.safetensors"
    with weights.open("wb") as f:  # sparse: 8 GiB on disk costs nothing
        f.truncate(8 * 1024**3)
    try:
        response = api.post("/v1/jobs", json=_with("workload", model="tiny-copy/model.safetensors"))
    finally:
        weights.unlink()
    _assert_names(response, ["body", "workload", "model"], "more than a config.json holds")
    assert "8,589,934,592 bytes" in response.text


def test_unparsable_and_odd_bodies(api) -> None:
    def post(content: bytes | str, media: str = "application/json") -> httpx.Response:
        return api.post("/v1/jobs", content=content, headers={"Content-Type": media})

    _assert_names(post("{not json"), ["body"], "invalid JSON")
    _assert_names(post("a: [1, 2", "application/yaml"), ["body"], "invalid YAML")
    _assert_names(post("- 1\n- 2\n", "text/yaml"), ["body"], "mapping")
    # A key given twice: YAML forbids it, and keeping the last value would drop the first.
    twice = yaml.safe_dump(train_job()) + "search: {}\n"
    _assert_names(post(twice, "application/yaml"), ["body"], "found key 'search' twice")
    budget = json.dumps(_with("budget", max_trials=2)).replace(
        '"max_trials": 2', '"max_trials": 2, "max_trials": 3'
    )
    _assert_names(post(budget), ["body"], "names the key 'max_trials' twice; a key given twice keeps only")
    _assert_names(post(""), ["body"], "empty")
    _assert_names(post(b"\xff\xfe{}"), ["body"], "UTF-8")
    nan = json.dumps(_with("budget", max_minutes=1)).replace('"max_minutes": 1', '"max_minutes": NaN')
    _assert_names(post(nan), ["body", "budget", "max_minutes"], "finite")
    _assert_names(post("[" * 5000 + "]" * 5000), ["body"], "nested too deeply")
    # Aliases that would expand to 10**9 values.
    bomb = "a: &a [1,1,1,1,1,1,1,1,1,1]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8)
    )
    _assert_names(post(bomb, "application/yaml"), ["body"], "more than")
    # Aliases nested 1,500 deep: refused by counting each shared node once, not by walking
    # the 2**1500 values they stand for (nor by spelling out a 1,500-long path at each).
    deep = "a0: &a0 [1, x]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}]\n" for i in range(1, 1500))
    _assert_names(post(deep, "application/yaml"), ["body"], "more than")
    # A node that holds itself: YAML allows it, a tree of values cannot be one.
    for cycle, loc in (
        ("workload: &w [*w]", ["body", "workload", 0]),
        ("workload: &w {a: *w}", ["body", "workload", "a"]),
    ):
        _assert_names(post(f"name: x\n{cycle}\n", "application/yaml"), loc, "contains itself")
    # A node shared by two aliases is no cycle: this one gets as far as the trial cap.
    shared = (
        "workload: {prompt_length: &lengths {kind: fixed, value: 8}, response_length: *lengths}\n"
        "budget: {max_trials: 51}\nextra: [*lengths, *lengths]\n"
    )
    _assert_names(post(shared, "application/yaml"), ["body", "extra"], "Extra inputs")
    # YAML reads 1e999 as text (its floats need a dot); as a length it is infinite.
    huge = yaml.safe_dump(_with("workload", response_length={"kind": "normal", "mean": 5, "std": 1}))
    huge = huge.replace("mean: 5", "mean: 1e999")
    assert "mean: 1e999" in huge
    _assert_names(
        post(huge, "application/yaml"),
        ["body", "workload", "response_length", "normal", "mean"],
        "finite number",
    )
    unsupported = post("name: x", "text/plain")
    assert unsupported.status_code == 415 and unsupported.json()["field"] == "Content-Type"


def test_huge_bodies_get_413(api, server) -> None:
    huge = json.dumps({**train_job(), "padding": "x" * 100_000})
    refused = api.post("/v1/jobs", content=huge, headers={"Content-Type": "application/json"})
    assert refused.status_code == 413, refused.text
    assert "65536" in refused.json()["detail"] and refused.json()["field"] == "body"

    def chunks():  # no Content-Length: the limit holds while streaming too
        for _ in range(20):
            yield b"x" * 10_000

    with server.client() as fresh:
        streamed = fresh.post("/v1/jobs", content=chunks(), headers={"Content-Type": "application/json"})
    assert streamed.status_code == 413


def test_the_token_is_required_for_writes(server, api) -> None:
    job_id = api.get("/v1/jobs").json()["data"]
    target = job_id[0]["id"] if job_id else "0" * 32
    with server.client(token=None) as anonymous, server.client(token="wrong") as impostor:
        for client, phrase in ((anonymous, "missing bearer token"), (impostor, "wrong bearer")):
            for method, path in (
                ("POST", "/v1/jobs"),
                ("POST", f"/v1/jobs/{target}/cancel"),
                ("DELETE", f"/v1/jobs/{target}"),
            ):
                response = client.request(method, path, json=train_job())
                assert response.status_code == 401, (method, path, response.text)
                assert phrase in response.json()["detail"]
                assert response.json()["field"] == "Authorization"
                assert response.headers["www-authenticate"] == "Bearer"
                assert TOKEN not in response.text
            # Bound to loopback: reads need no token.
            assert client.get("/v1/jobs").status_code == 200
    basic = httpx.post(server.url + "/v1/jobs", json=train_job(), headers={"Authorization": f"Basic {TOKEN}"})
    assert basic.status_code == 401
    assert TOKEN not in server.log_path.read_text()


def test_reads_need_the_token_off_loopback(tmp_path) -> None:
    settings = Settings(data_dir=tmp_path, host="0.0.0.0", api_token="s3cret")
    client = TestClient(create_app(settings))  # no lifespan: the checks come first
    for path in ("/v1/jobs", "/v1/jobs/x", "/v1/jobs/x/trials", "/v1/hardware"):
        response = client.get(path)
        assert response.status_code == 401, (path, response.text)
    wrong = client.get("/v1/jobs", headers={"Authorization": "Bearer s3cre"})
    assert wrong.status_code == 401 and "wrong bearer token" in wrong.json()["detail"]


@pytest.mark.parametrize(
    "query, loc",
    [
        ({"limit": 0}, ["query", "limit"]),
        ({"limit": 5000}, ["query", "limit"]),
        ({"limit": "ten"}, ["query", "limit"]),
        ({"offset": -1}, ["query", "offset"]),
        ({"status": "finished"}, ["query", "status"]),
    ],
)
def test_bad_list_parameters(api, query, loc) -> None:
    response = api.get("/v1/jobs", params=query)
    assert response.status_code == 422
    assert [d["loc"] for d in response.json()["detail"]] == [loc]


def test_unknown_jobs_and_trials_are_404(api, finished_job) -> None:
    missing = "0123456789abcdef" * 2
    for method, path in (
        ("GET", f"/v1/jobs/{missing}"),
        ("GET", f"/v1/jobs/{missing}/trials"),
        ("GET", f"/v1/jobs/{missing}/pareto"),
        ("GET", f"/v1/jobs/{missing}/best"),
        ("GET", f"/v1/jobs/{missing}/trials/0/config"),
        ("POST", f"/v1/jobs/{missing}/cancel"),
        ("DELETE", f"/v1/jobs/{missing}"),
        ("GET", "/v1/jobs/not-even-hex"),
    ):
        response = api.request(method, path)
        assert response.status_code == 404, (method, path, response.text)
        assert response.json()["field"] == "job_id" and "no job with id" in response.json()["detail"]
    job_id = finished_job["id"]
    for path in (f"/v1/jobs/{job_id}/trials/99", f"/v1/jobs/{job_id}/trials/99/config"):
        response = api.get(path)
        assert response.status_code == 404 and response.json()["field"] == "number"
        assert "has no trial 99" in response.json()["detail"]
    bad = [
        api.get(f"/v1/jobs/{job_id}/trials/-1/config"),
        api.get(f"/v1/jobs/{job_id}/trials/zero/config"),
        api.get(f"/v1/jobs/{job_id}/trials/0/config", params={"format": "toml"}),
        api.get(f"/v1/jobs/{job_id}/trials", params={"status": "great"}),
        api.get(f"/v1/jobs/{job_id}/best", params={"max_peak_memory_gib": -1}),
        api.get(f"/v1/jobs/{job_id}/best", params={"max_peak_memory_gib": "inf"}),
    ]
    assert [r.status_code for r in bad] == [422] * len(bad), [r.text for r in bad]
    assert bad[2].json()["detail"][0]["loc"] == ["query", "format"]


def test_docs_are_served_without_a_cdn(server) -> None:
    docs = httpx.get(server.url + "/docs")
    assert docs.status_code == 200
    assert "cdn" not in docs.text.lower() and "https://" not in docs.text.split("<body>")[0]
    assets = [
        a for a in ("/docs-static/swagger-ui-bundle.js", "/docs-static/swagger-ui.css") if a in docs.text
    ]
    assert len(assets) == 2
    for asset in assets:
        assert httpx.get(server.url + asset).status_code == 200
    schema = httpx.get(server.url + "/openapi.json").json()
    body = schema["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]
    assert {"application/json", "application/yaml"} <= set(body)
    assert "JobCreate" in schema["components"]["schemas"]
    assert "workload" in schema["components"]["schemas"]["JobCreate"]["properties"]
    # The choices of a registry are listed from it (trials.rollout.BACKENDS, autotuner.samplers).
    assert schema["components"]["schemas"]["Workload"]["properties"]["engine"]["enum"] == ["sglang", "vllm"]
    assert schema["components"]["schemas"]["JobCreate"]["properties"]["sampler"]["enum"] == [
        "nsga2",
        "random",
        "tpe",
    ]


def test_health_and_hardware(server, api) -> None:
    health = httpx.get(server.url + "/healthz").json()
    assert health["status"] == "ok" and health["runner"] == "running"
    hardware = api.get("/v1/hardware").json()
    assert hardware["ray"]["resources"]["CPU"] == 2
    assert hardware["ray"]["gpus"] == 0 and hardware["host_gpus"] == []
    assert hardware["host_cpu"].startswith("cpu:")


def test_serve_refuses_a_non_loopback_address_without_a_token(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOTUNER_")}
    env["AUTOTUNER_DATA_DIR"] = str(tmp_path)
    env["COLUMNS"] = "200"
    done = subprocess.run(
        [sys.executable, "-m", "autotuner.cli", "serve", "--host", "0.0.0.0", "--port", "1"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    message = " ".join(done.stderr.split())
    assert "AUTOTUNER_HOST=0.0.0.0 is not a loopback address" in message
    assert "AUTOTUNER_API_TOKEN is unset" in message and "Traceback" not in done.stderr


def test_storage_unavailable_is_503(tmp_path) -> None:
    from autotuner.api.service import JobService
    from autotuner.jobs import JobContext
    from storage import Database, JobStore

    # A real driver error: nothing listens on port 1.
    settings = Settings(data_dir=tmp_path, database_url="postgresql+psycopg://u@127.0.0.1:1/db")
    app = create_app(settings)
    database = Database(settings.resolved_database_url, retry_backoff_s=0.01)
    app.state.service = JobService(JobContext(settings, database, JobStore(database)))
    client = TestClient(
        app, base_url="http://127.0.0.1"
    )  # no lifespan: the service above stands in for the real one
    job = "0" * 32  # a well-formed id: one that is not never reaches the database
    for path in ("/healthz", "/v1/jobs", f"/v1/jobs/{job}", f"/v1/jobs/{job}/trials"):
        response = client.get(path)
        assert response.status_code == 503, (path, response.text)
        assert response.json()["detail"].startswith("storage unavailable:")
        assert "127.0.0.1:1" in response.json()["detail"]
    created = client.post("/v1/jobs", json=train_job())
    assert created.status_code == 503
