"""Hostile and extreme input against the real service (loopback HTTP, SQLite and PostgreSQL):
extreme literals, over-long strings, wrong encodings and wrong types in every part of every
endpoint get a 4xx, never a 5xx; the spec that once took the service down is refused at
once; every knob value is checked against its domain; a model config no model can have,
a device the cluster lacks and a CPU job the machine cannot hold are refused at submission;
Host headers of other sites are refused. Goes beyond the OpenAPI fuzz (test_fuzz.py): these
inputs are the ones a schema does not describe."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from autotuner.capacity import host_memory_gib
from autotuner.jobs import JobContext
from autotuner.settings import Settings

from .conftest import A, R, Server, postgres_server, train_job

# ----------------------------------------------------------------------------- helpers


def _refused(response: httpx.Response, loc: list[Any], *phrases: str) -> str:
    assert response.status_code == 422, response.text
    items = [d for d in response.json()["detail"] if d["loc"] == loc]
    assert items, (loc, response.json())
    message = items[0]["msg"]
    for phrase in phrases:
        assert phrase in message, (phrase, message)
    return str(message)


def _count(api: httpx.Client) -> int:
    return int(api.get("/v1/jobs").json()["count"])


# ----------------------------------------------------------------------------- bounded work


def test_the_spec_that_took_the_service_down_is_refused_at_once(api) -> None:
    job = train_job(name="huge")
    job["workload"].update(train_batch_size=1_000_000, ppo_mini_batch_size=1_000_000, n=1024)
    before = _count(api)
    started = time.monotonic()
    response = api.post("/v1/jobs", json=job)
    assert time.monotonic() - started < 1.0
    _refused(response, ["body", "workload"], "1024000000", "262144 requests per step")
    assert _count(api) == before
    assert api.get("/healthz").status_code == 200


def test_the_largest_step_validates_within_a_second(api) -> None:
    # 262,144 requests per step on one GPU: the micro-batch knobs range over the divisors
    # of a 262,144-sequence mini-batch; every choice is checked against verl's rules.
    job = train_job(name="largest")
    job["workload"].update(train_batch_size=16_384, ppo_mini_batch_size=16_384, n=16)
    job["search"][A + "ppo_micro_batch_size_per_gpu"] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    started = time.monotonic()
    response = api.post("/v1/jobs", json=job)
    elapsed = time.monotonic() - started
    assert response.status_code == 201, response.text
    assert elapsed < 1.0, elapsed
    api.post(f"/v1/jobs/{response.json()['id']}/cancel")


# ----------------------------------------------------------------------------- knob domains

MNS, GMU = R + "max_num_seqs", R + "gpu_memory_utilization"
DOMAIN_CASES = {
    "fixed negative": ({MNS: -5}, None, ["search", MNS, "fixed"], "-5", "an int in [1, 2147483647]"),
    "fixed zero": ({MNS: 0}, None, ["search", MNS, "fixed"], "= 0 ", "[1, 2147483647]"),
    "fixed 10^18": ({MNS: 10**18}, None, ["search", MNS, "fixed"], str(10**18), "[1, 2147483647]"),
    "choices below one": ({MNS: [-1, -2]}, None, ["search", MNS, "choices"], "-1", "[1, 2147483647]"),
    "mixed types": ({MNS: [64, "many"]}, None, ["search", MNS, "choices"], "'many' is not an int", ""),
    "float for an int": ({MNS: 64.5}, None, ["search", MNS, "fixed"], "64.5 is not an int", ""),
    "range below zero": ({GMU: {"low": -1, "high": 0.5}}, None, ["search", GMU, "low"], "-1", "(0, 1]"),
    "gmu above one": ({GMU: 1.5}, None, ["search", GMU, "fixed"], "1.5", "a number in (0, 1]"),
    "bool as text": ({R + "enforce_eager": "yes please"}, None, ["search", R + "enforce_eager", "fixed"],
                     "'yes please' is not a bool", "true or false"),
    "baseline gmu 7": ({}, {"prod": {GMU: 7}}, ["baselines", "prod", GMU], "7", "(0, 1]"),
    "baseline of a wrong type": ({}, {"prod": {MNS: [256]}}, ["baselines", "prod", MNS], "[256]", "an int"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(DOMAIN_CASES))
def test_every_knob_value_is_checked_against_its_domain(api, case) -> None:
    # The job measures the train phase only: its rollout knobs are checked all the same.
    search, baselines, loc, *phrases = DOMAIN_CASES[case]
    job = train_job(name="domains", search=search, baselines=baselines or {})
    before = _count(api)
    message = _refused(api.post("/v1/jobs", json=job), ["body", *loc], *phrases)
    path = loc[1] if loc[0] == "search" else loc[2]
    assert path in message  # the key, the value and the domain are named
    assert _count(api) == before


# ----------------------------------------------------------------------------- model and device

BAD_CONFIGS = {
    "zero heads": ({"num_attention_heads": 0}, "num_attention_heads = 0 is not a positive integer"),
    "negative size": ({"hidden_size": -64}, "hidden_size = -64 is not a positive integer"),
    "size as text": ({"num_hidden_layers": "2"}, "num_hidden_layers = '2' is not a positive integer"),
    "heads not dividing": ({"hidden_size": 100, "num_attention_heads": 3}, "not divisible by"),
    "kv heads not dividing": ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads"),
    "not a mapping": ([1, 2], "not a config.json mapping"),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_a_model_config_no_model_can_have_is_refused(api, models_dir, case) -> None:
    change, phrase = BAD_CONFIGS[case]
    tiny = json.loads((models_dir / "tiny-copy" / "config.json").read_text())
    folder = models_dir / f"bad-{case.replace(' ', '-')}"
    folder.mkdir(exist_ok=True)
    config = {**tiny, **change} if isinstance(change, dict) else change
    (folder / "config.json").write_text(json.dumps(config))
    job = train_job(name="bad-model", workload={"model": folder.name})
    message = _refused(api.post("/v1/jobs", json=job), ["body", "workload", "model"], phrase)
    assert str(models_dir) not in message and folder.name in message  # the client's name only


def test_a_device_or_memory_the_machine_lacks_is_refused(api) -> None:
    # The test server's Ray has no GPU.
    _refused(
        api.post("/v1/jobs", json=train_job(cluster={"device": "cuda"})),
        ["body", "cluster", "device"],
        "has no GPU",
    )
    host = host_memory_gib()
    _refused(
        api.post("/v1/jobs", json=train_job(cluster={"device": "cpu", "device_memory_gib": 4096})),
        ["body", "cluster", "device_memory_gib"],
        "4096 GiB exceeds this machine's memory",
        f"{host:.1f} GiB",
    )
    eight_b = train_job(
        workload={"model": "llama-3.1-8b"}, cluster={"device": "cpu", "device_memory_gib": 16}
    )
    _refused(
        api.post("/v1/jobs", json=eight_b),
        ["body", "workload", "model"],
        "8.03B parameters",
        "more than the 16.0 GiB",
    )


# ----------------------------------------------------------------------------- no 5xx, anywhere

HUGE_INT = "9" * 5000
LONG = "x" * 20_000


def _bodies() -> list[tuple[str, bytes, str]]:
    """(what, body, content type) of hostile POST /v1/jobs bodies."""
    job = json.dumps(train_job())
    out: list[tuple[str, bytes, str]] = []

    def add(what: str, text: str | bytes, media: str = "application/json") -> None:
        out.append((what, text if isinstance(text, bytes) else text.encode(), media))

    add("huge int literal", job.replace('"n": 1', f'"n": {HUGE_INT}'))
    add("huge int in yaml", f"name: x\nseed: {HUGE_INT}\n", "application/yaml")
    add(
        "huge int as a knob value",
        job.replace('"sampler"', f'"baselines": {{"b": {{"{MNS}": {HUGE_INT}}}}}, "sampler"'),
    )
    add("huge float literal", job.replace('"max_trials": 4', '"max_trials": 1e400'))
    add("negative huge float", job.replace('"trial_timeout_s": 120', '"trial_timeout_s": -1e400'))
    add("huge range end", json.dumps(train_job(search={GMU: {"low": 0.5, "high": 10**400}})))
    add("over-long name", json.dumps(train_job(name=LONG)))
    add("over-long knob", json.dumps(train_job(search={LONG: 1})))
    add("over-long model", json.dumps(train_job(workload={"model": LONG})))
    add("model with NUL", json.dumps(train_job(workload={"model": "tiny-copy\x00/config.json"})))
    add("model with a loop", json.dumps(train_job(workload={"model": "../" * 2000 + "etc"})))
    add("over-long baseline name", json.dumps(train_job(baselines={LONG: {MNS: 8}})))
    add("lone surrogate", job.replace('"sampler"', '"baselines": {"\\ud800": {}}, "sampler"'))
    add("NUL in a baseline name", job.replace('"sampler"', '"baselines": {"a\\u0000b": {}}, "sampler"'))
    add("latin-1 body", json.dumps(train_job(name="caf\u00e9")).encode("latin-1"))
    add("utf-16 body", json.dumps(train_job()).encode("utf-16"))
    add("utf-16 by charset", json.dumps(train_job()).encode("utf-16"), "application/json; charset=utf-16")
    add("binary", bytes(range(256)) * 4, "application/yaml")
    add("yaml python tag", "name: !!python/object/apply:os.system ['true']\n", "application/yaml")
    add("yaml date", f"seed: 2001-12-14\nsearch: {{{MNS}: 2001-12-14}}\n", "application/yaml")
    add("wrong types", json.dumps({"workload": [], "cluster": "gpu", "search": 5, "budget": [1]}))
    add("knob override of a wrong type", json.dumps(train_job(search={MNS: {"fixed": {"a": 1}}})))
    add("baseline of a wrong type", json.dumps(train_job(baselines={"b": [1, 2]})))
    add("objectives of a wrong type", json.dumps(train_job(objectives={"metric": "x"})))
    add(
        "lengths of a wrong type",
        json.dumps(train_job(workload={"response_length": {"kind": "list", "values": "12"}})),
    )
    add("a float where an int goes", json.dumps(train_job(workload={"n": 1.5})))
    add("null everywhere", json.dumps({k: None for k in train_job()}))
    add("deep lists", "[" * 20_000 + "]" * 20_000)
    return out  # fmt: skip


def _requests(job_id: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(method, path, httpx kwargs) of hostile requests to every other endpoint."""
    ids = [
        "a" * 10_000,
        "%00",
        "%ff%fe",
        quote("\u20ac" * 50),
        "..%2F..%2Fetc",
        "%F0%9F%98%80" * 100,
        "0" * 32,
    ]
    numbers = [str(10**30), str(-(10**30)), "NaN", "1e5", "0x10", "%00", "9" * 5000]
    out: list[tuple[str, str, dict[str, Any]]] = []
    for bad in ids:
        for suffix in ("", "/trials", "/pareto", "/best", "/trials/0", "/trials/0/config"):
            out.append(("GET", f"/v1/jobs/{bad}{suffix}", {}))
        out += [("POST", f"/v1/jobs/{bad}/cancel", {}), ("DELETE", f"/v1/jobs/{bad}", {})]
        out.append(("GET", f"/jobs/{bad}", {}))
        out.append(("GET", f"/static/{bad}", {}))
    for bad in numbers:
        out.append(("GET", f"/v1/jobs/{job_id}/trials/{bad}", {}))
        out.append(("GET", f"/v1/jobs/{job_id}/trials/{bad}/config", {}))
    queries: list[tuple[str, dict[str, str]]] = [
        ("/v1/jobs", {"limit": str(10**30)}),
        ("/v1/jobs", {"offset": str(10**30)}),
        ("/v1/jobs", {"offset": HUGE_INT}),
        ("/v1/jobs", {"status": LONG}),
        ("/v1/jobs", {"status": "\x00"}),
        ("/", {"offset": str(10**30)}),
        (f"/v1/jobs/{job_id}/trials", {"limit": "-1", "status": "\u20ac"}),
        (f"/v1/jobs/{job_id}/best", {"max_peak_memory_gib": "1e400"}),
        (f"/v1/jobs/{job_id}/best", {"max_peak_memory_gib": "nan"}),
        (f"/v1/jobs/{job_id}/best", {"max_peak_memory_gib": HUGE_INT}),
        (f"/v1/jobs/{job_id}/trials/0/config", {"format": LONG}),
    ]
    out += [("GET", path, {"params": params}) for path, params in queries]
    headers = [
        {"Authorization": b"Bearer \xff\xfe\x7f"},
        {"Authorization": "Bearer " + "t" * 60_000},
        {"Authorization": "Bearer"},
        {"Content-Type": "application/json; charset=" + "x" * 1000},
        {"Content-Length": "-1"},
        {"Content-Length": str(10**30)},
    ]
    out += [("POST", "/v1/jobs", {"headers": h, "content": b"[1]"}) for h in headers]
    out += [("DELETE", f"/v1/jobs/{job_id}", {"headers": headers[0]})]
    return out


def _assert_no_server_error(server: Server, job_id: str) -> None:
    failures = []
    with server.client() as api:
        for what, body, media in _bodies():
            response = api.post("/v1/jobs", content=body, headers={"Content-Type": media})
            if not 400 <= response.status_code < 500:
                failures.append((what, response.status_code, response.text[:300]))
        for method, path, kwargs in _requests(job_id):
            try:
                response = api.request(method, path, **kwargs)
            except (httpx.RemoteProtocolError, httpx.LocalProtocolError):  # never sent, or refused unread
                continue
            if response.status_code >= 500 or (response.status_code < 400 and method != "GET"):
                failures.append((method, path[:80], response.status_code, response.text[:300]))
    assert not failures, failures
    with server.client() as api:  # still up, still answering
        assert api.get("/healthz").status_code == 200
        assert api.get(f"/v1/jobs/{job_id}").status_code == 200
    assert "Traceback" not in server.log(), server.log()


def test_no_input_gets_a_server_error_on_sqlite(server, finished_job) -> None:
    _assert_no_server_error(server, finished_job["id"])


@pytest.mark.postgres
@pytest.mark.slow
def test_no_input_gets_a_server_error_on_postgres(tmp_path, postgres_url) -> None:
    with postgres_server(tmp_path, postgres_url) as server:
        with server.client() as api:
            created = api.post("/v1/jobs", json=train_job(name="pg-hostile", budget={"max_trials": 1}))
            assert created.status_code == 201, created.text
            job_id = created.json()["id"]
            api.post(f"/v1/jobs/{job_id}/cancel")
        _assert_no_server_error(server, job_id)


# ----------------------------------------------------------------------------- host, token, body


def test_a_job_whose_stored_spec_no_longer_reads_takes_down_nothing_else(server, api, finished_job) -> None:
    """A job stored by a version that let an infinite length through (stored as null, as JSON
    has no infinity) cannot be read back: the list and the page leave it out, its own
    endpoints say so with 409 and how to be rid of it, and it can be deleted."""
    spec = json.loads(json.dumps(train_job(name="unreadable")))
    spec["workload"]["response_length"] = {"kind": "normal", "mean": None, "std": 1.0}
    ctx = JobContext.open(Settings(data_dir=server.data_dir))
    try:
        job = ctx.store.create("unreadable", json.dumps(spec), 4)
        ctx.store.claim(job.id, "an older version")
        ctx.store.finish(job.id, "failed", stop_reason="(stored before the check)")
    finally:
        ctx.database.dispose()
    listed = api.get("/v1/jobs", params={"limit": 1000})
    assert listed.status_code == 200, listed.text
    ids = {j["id"] for j in listed.json()["data"]}
    assert finished_job["id"] in ids and job.id not in ids
    assert api.get("/").status_code == 200
    for path in ("", "/trials", "/pareto", "/best"):
        response = api.get(f"/v1/jobs/{job.id}{path}")
        assert response.status_code == 409, (path, response.text)
        detail = response.json()["detail"]
        assert "stored spec can no longer be read" in detail and "workload.response_length" in detail
        assert f"DELETE /v1/jobs/{job.id}" in detail
    assert "left out of the job list" in server.log()
    assert api.delete(f"/v1/jobs/{job.id}").status_code == 204
    assert api.get(f"/v1/jobs/{job.id}").status_code == 404


def test_a_host_of_another_site_is_refused(server) -> None:
    port = server.url.rsplit(":", 1)[1]
    for host in (f"evil.example:{port}", "rebind.attacker.test", f"127.0.0.1.evil.example:{port}"):
        response = httpx.get(server.url + "/v1/jobs", headers={"Host": host})
        assert response.status_code == 400, (host, response.text)
        assert response.json()["field"] == "Host" and "AUTOTUNER_ALLOWED_HOSTS" in response.json()["detail"]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST"):
        assert httpx.get(server.url + "/v1/jobs", headers={"Host": host}).status_code == 200, host


UTF8_TOKEN = "t\u00f6k\u20acn-\u5bc6\u94a5-5f1c"


@pytest.fixture(scope="module")
def utf8_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server with a non-ASCII token and the default body limit (4 MiB)."""
    base = tmp_path_factory.mktemp("utf8")
    srv = Server(base / "data", base / "server.log", AUTOTUNER_API_TOKEN=UTF8_TOKEN).start()
    yield srv
    srv.stop(require_clean_log=False)


def test_a_non_ascii_token_matches_as_utf8(utf8_server) -> None:
    job = json.dumps(train_job(name="utf8-token", budget={"max_trials": 1})).encode()
    url = utf8_server.url + "/v1/jobs"

    def post(token: bytes) -> httpx.Response:
        return httpx.post(
            url,
            content=job,
            headers={"Authorization": b"Bearer " + token, "Content-Type": b"application/json"},
        )

    created = post(UTF8_TOKEN.encode("utf-8"))
    assert created.status_code == 201, created.text
    assert post(UTF8_TOKEN.encode("utf-8")[:-1]).status_code == 401
    assert post(UTF8_TOKEN.encode("latin-1", errors="replace")).status_code == 401
    httpx.post(
        f"{url}/{created.json()['id']}/cancel", headers={"Authorization": b"Bearer " + UTF8_TOKEN.encode()}
    )


def test_a_dataset_of_measured_lengths_is_accepted_quickly(utf8_server, tmp_path: Path) -> None:
    import numpy as np
    import yaml

    from autotuner.api.submission import validate_job
    from autotuner.settings import Settings
    from autotuner.yamlload import load_spec_yaml

    lengths = [int(v) for v in np.random.default_rng(0).integers(1, 16, 300_000)]
    job = train_job(name="measured-lengths")
    job["workload"]["response_length"] = {"kind": "list", "values": lengths}
    text = yaml.safe_dump(job, default_flow_style=None, width=120)
    assert 1_000_000 < len(text) < 4 * 1_048_576
    document = load_spec_yaml(text)
    started = time.monotonic()
    validate_job(document, Settings(data_dir=tmp_path))
    assert time.monotonic() - started < 1.0  # validation proper, once parsed
    started = time.monotonic()
    created = httpx.post(
        utf8_server.url + "/v1/jobs",
        content=text.encode(),
        headers={"Content-Type": "application/yaml", "Authorization": b"Bearer " + UTF8_TOKEN.encode()},
        timeout=60,
    )
    elapsed = time.monotonic() - started
    assert created.status_code == 201, created.text[:500]
    assert elapsed < 10.0, elapsed  # libyaml parses it; PyYAML's pure-Python loader took 9 s
    # Kept as its 15 distinct lengths and their counts: each read of the job costs that much.
    # A listing leaves specs out; the job's page shows the stored spec.
    auth = {"Authorization": b"Bearer " + UTF8_TOKEN.encode()}
    job_url = created.headers["location"]
    stored = httpx.get(job_url, headers=auth, timeout=30).json()["spec"]["workload"]["response_length"]
    assert stored["values"] == sorted(set(lengths)) and sum(stored["counts"]) == len(lengths)
    listed = httpx.get(utf8_server.url + "/v1/jobs", headers=auth, timeout=30).json()["data"]
    assert [j["spec"] for j in listed if j["id"] == created.json()["id"]] == [None]
    httpx.post(job_url + "/cancel", headers=auth, timeout=30)
