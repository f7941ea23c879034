"""Retried submissions never make a second job (real service on loopback, SQLite and
PostgreSQL): a request with an ``Idempotency-Key`` that repeats an earlier one gets that
job back with 200; racing repeats store one job; the same key with another body is a 409
naming the header; the CLI sends a key and retries with it after losing the answer."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from .conftest import FINISHED, REPO, TOKEN, Server, postgres_server, train_job, wait_for


def _ids(api: httpx.Client) -> set[str]:
    return {j["id"] for j in api.get("/v1/jobs", params={"limit": 1000}).json()["data"]}


def _post(api: httpx.Client, body: bytes, key: str | None) -> httpx.Response:
    headers: dict[str, str | bytes] = {"Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key.encode("utf-8")  # as sent: UTF-8 bytes
    return api.post("/v1/jobs", content=body, headers=headers)


def _cancel_all(api: httpx.Client, ids: set[str]) -> None:
    for job_id in ids:
        api.post(f"/v1/jobs/{job_id}/cancel")
        wait_for(api, job_id, lambda j: j["status"] in FINISHED, 120, "finished")


def _holds(api: httpx.Client) -> None:
    before = _ids(api)
    body = json.dumps(train_job(name="retried", budget={"max_trials": 1})).encode()
    key = str(uuid.uuid4())
    first = _post(api, body, key)
    assert first.status_code == 201, first.text
    job_id = first.json()["id"]
    again = _post(api, body, key)
    assert again.status_code == 200, again.text
    assert again.json()["id"] == job_id and again.headers["Location"] == first.headers["Location"]

    # Eight clients racing with one key: one job, every answer names it.
    racing_key = str(uuid.uuid4())
    racing_body = json.dumps(train_job(name="raced", budget={"max_trials": 1})).encode()
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: _post(api, racing_body, racing_key), range(8)))
    assert sorted(a.status_code for a in answers) == [200] * 7 + [201], [a.text for a in answers]
    assert len({a.json()["id"] for a in answers}) == 1

    other = json.dumps(train_job(name="other", budget={"max_trials": 1})).encode()
    conflict = _post(api, other, key)
    assert conflict.status_code == 409, conflict.text
    assert conflict.json()["field"] == "Idempotency-Key"
    assert "Idempotency-Key" in conflict.json()["detail"] and job_id in conflict.json()["detail"]

    for bad in ("has space", "x" * 256, "", "clé"):
        refused = _post(api, body, bad)
        assert refused.status_code == 422, refused.text
        (item,) = refused.json()["detail"]
        assert item["loc"] == ["header", "Idempotency-Key"] and "visible ASCII" in item["msg"]

    # Without a key each request is a new job, as before.
    plain = [_post(api, other, None) for _ in range(2)]
    assert [p.status_code for p in plain] == [201, 201]
    assert plain[0].json()["id"] != plain[1].json()["id"]
    created = _ids(api) - before
    assert created == {job_id, answers[0].json()["id"], plain[0].json()["id"], plain[1].json()["id"]}
    _cancel_all(api, created)


def test_a_retried_submission_gets_its_job_back_on_sqlite(api) -> None:
    _holds(api)


@pytest.mark.postgres
@pytest.mark.slow
def test_a_retried_submission_gets_its_job_back_on_postgres(tmp_path, postgres_url) -> None:
    with postgres_server(tmp_path, postgres_url) as server, server.client() as api:
        _holds(api)


class _LosingProxy:
    """A loopback HTTP proxy to ``target`` that forwards the first request and drops its
    answer (the connection closes unanswered, as when a client's timeout strikes after the
    server did the work); later requests get their answers."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.keys: list[str | None] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                self._one(conn)

    def _one(self, conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        head, body = data.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ")
        headers = dict(line.split(": ", 1) for line in lines[1:])
        wanted = int(headers.get("content-length", headers.get("Content-Length", "0")))
        while len(body) < wanted:
            body += conn.recv(65536)
        forwarded = {k: v for k, v in headers.items() if k.lower() not in ("host", "content-length")}
        self.keys.append(forwarded.get("idempotency-key") or forwarded.get("Idempotency-Key"))
        answer = httpx.request(method, self.target + path, headers=forwarded, content=body, timeout=60)
        if len(self.keys) == 1:
            return  # the answer is lost
        status = f"HTTP/1.1 {answer.status_code} {answer.reason_phrase}\r\n"
        out = f"{status}Content-Type: application/json\r\nContent-Length: {len(answer.content)}\r\n"
        conn.sendall(out.encode() + b"Connection: close\r\n\r\n" + answer.content)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def losing_proxy(server: Server) -> Iterator[_LosingProxy]:
    proxy = _LosingProxy(server.url)
    yield proxy
    proxy.close()


def test_the_cli_retries_with_its_key_and_makes_one_job(api, losing_proxy, tmp_path: Path) -> None:
    before = _ids(api)
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps(train_job(name="cli-retried", budget={"max_trials": 1})))
    done = subprocess.run(
        [sys.executable, "-m", "autotuner.cli", "submit", str(job_file), "--server", losing_proxy.url],
        env={**os.environ, "AUTOTUNER_API_TOKEN": TOKEN, "COLUMNS": "200"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        len(losing_proxy.keys) == 2 and losing_proxy.keys[0] and losing_proxy.keys[0] == losing_proxy.keys[1]
    )
    created = _ids(api) - before
    assert len(created) == 1
    (job_id,) = created
    assert f"job {job_id}" in done.stdout
    _cancel_all(api, created)
