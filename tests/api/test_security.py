"""The token never reaches a log, a file or a child process; nothing from a request
reaches a shell. One real server (its own Ray in its own temp dir) runs one real job whose
baselines are named with shell metacharacters, while requests carry the right token, a
wrong one and metacharacters in every place a client controls. ~40 s on 2 cores."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import psutil
import pytest

from .conftest import FINISHED, Server, submit, train_job, wait_for

TOKEN = "tok-" + secrets.token_hex(16)


def _injections(marker_dir: Path) -> list[str]:
    """Strings that create a file in ``marker_dir`` if a shell ever evaluates them."""
    m = marker_dir
    return [
        f"$(touch {m}/dollar)",
        f"; touch {m}/semicolon",
        f"`touch {m}/backtick`",
        f"| touch {m}/pipe",
        f"&& touch {m}/and",
        f"\n touch {m}/newline",
        f"' ; touch {m}/quote ; '",
    ]


class Scene:
    def __init__(
        self,
        server: Server,
        markers: Path,
        ray_tmp: Path,
        job: dict[str, Any],
        child_environs: dict[int, bytes],
    ) -> None:
        self.server, self.markers, self.ray_tmp = server, markers, ray_tmp
        self.job, self.child_environs = job, child_environs


def _child_environs(root_pid: int) -> dict[int, bytes]:
    """The environment of every process below the server (Ray, its workers, trials)."""
    out = {}
    for child in psutil.Process(root_pid).children(recursive=True):
        try:
            out[child.pid] = Path(f"/proc/{child.pid}/environ").read_bytes()
        except OSError:
            continue
    return out


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    base = tmp_path_factory.mktemp("security")
    markers = base / "markers"
    markers.mkdir()
    # Ray's sockets live under its temp dir: keep the path short.
    ray_tmp = Path(tempfile.mkdtemp(prefix="rt-"))
    server = Server(
        base / "data", base / "server.log", AUTOTUNER_API_TOKEN=TOKEN, RAY_TMPDIR=str(ray_tmp)
    ).start()
    try:
        injections = _injections(markers)
        with server.client(token=TOKEN) as api, server.client(token=TOKEN[:-1] + "x") as wrong:
            baselines = {
                text: {"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2} for text in injections
            }
            job_id = submit(api, train_job(name="shell-test", baselines=baselines, budget={"max_trials": 1}))
            for text in injections:
                in_header = text.replace("\n", " ")  # a header cannot hold a line break
                for refused in (
                    train_job(name=text),
                    train_job(workload={"model": text}),
                    train_job(search={text: 1}),
                ):
                    assert api.post("/v1/jobs", json=refused).status_code == 422
                assert wrong.post("/v1/jobs", json=train_job()).status_code == 401
                assert (
                    httpx.post(
                        server.url + "/v1/jobs",
                        json=train_job(),
                        headers={"Authorization": f"Bearer {TOKEN} {in_header}"},
                    ).status_code
                    == 401
                )
                segment = quote(text, safe="")
                for path in (f"/v1/jobs/{segment}", f"/v1/jobs/{job_id}/trials/{segment}/config"):
                    assert api.get(path).status_code in (404, 422)
                assert api.get("/v1/jobs", params={"status": text}).status_code == 422
                response = api.post(
                    "/v1/jobs",
                    content=b"name: [x",  # never a valid job
                    headers={"Content-Type": f"application/yaml{in_header}"},
                )
                assert response.status_code in (415, 422)
            # While the job's trial runs: what its processes inherited.
            environs: dict[int, bytes] = {}
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                assert server.proc is not None
                trials = _trial_processes(server.proc.pid)
                environs = _child_environs(server.proc.pid)
                if any(p.pid in environs for p in trials):
                    break
                time.sleep(0.1)
            job = wait_for(api, job_id, lambda j: j["status"] in FINISHED, 240, "finished")
        yield Scene(server, markers, ray_tmp, job, environs)
    finally:
        server.stop(require_clean_log=False)
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _trial_processes(root_pid: int) -> list[psutil.Process]:
    out = []
    for child in psutil.Process(root_pid).children(recursive=True):
        try:
            if child.cmdline()[1:4] == ["-m", "trials", "run"]:
                out.append(child)
        except psutil.Error:
            continue
    return out


def _files_holding(root: Path, needle: bytes) -> list[str]:
    found = []
    for path in root.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
                found.append(str(path))
        except OSError:
            continue
    return found


def test_nothing_from_a_request_reaches_a_shell(scene: Scene) -> None:
    assert scene.job["status"] == "succeeded", scene.job
    assert scene.job["trials_done"] == 1  # the baseline named with metacharacters ran
    assert sorted(os.listdir(scene.markers)) == []


def test_the_token_is_never_logged_stored_or_inherited(scene: Scene) -> None:
    needle = TOKEN.encode()
    assert needle not in scene.server.log_path.read_bytes()
    assert _files_holding(scene.server.data_dir, needle) == []  # the database, its WAL
    assert _files_holding(scene.ray_tmp, needle) == []  # Ray's and the trials' logs
    # No process the server started carries it in its environment.
    assert scene.child_environs, "no child process was seen"
    assert not [pid for pid, env in scene.child_environs.items() if needle in env]
    assert not [pid for pid, env in scene.child_environs.items() if b"AUTOTUNER_API_TOKEN=" in env]
