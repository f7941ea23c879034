"""Load on the service: N concurrent clients submit small jobs and poll them for a while.

    python -m benchmarks.load.run [--clients 50] [--duration-s 60] [--think-s 0.1]
                                  [--database-url URL] [--out FILE]

Starts a real ``autotuner serve`` (a fresh data dir, its own local Ray, a token) on a free
loopback port, unless ``--server URL`` names a running one. Each client loops until the
time is up: submit a job (``POST /v1/jobs``), poll it (``GET /v1/jobs/{id}``) a few times,
list jobs (``GET /v1/jobs``) and read the job's trials (``GET /v1/jobs/{id}/trials``),
with ``--think-s`` between requests. The jobs are real but cheap: the service's trial
Python is a path that does not exist, so each job's trials fail to launch at once and its
infrastructure breaker fails it after three, while the runner still claims, writes and
finishes jobs beside the API. Afterwards every submitted job must be listed and readable
(no job lost), then the table of latency percentiles per endpoint and the error counts
are printed and written as JSON (default ``benchmarks/load/results/load-<host>.json``).

Exit status: 0 when no request failed and no job was lost, else 1. A benchmark, not a
test: the latencies depend on the machine; the JSON says which one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
POLLS_PER_JOB = 5
A = "actor_rollout_ref.actor."
R = "actor_rollout_ref.rollout."

# A small train-only job on the built-in tiny model (the trials never start here).
SMALL_JOB: dict[str, Any] = {
    "name": "load",
    "workload": {
        "model": "tiny",
        "dtype": "float32",
        "phases": "train",
        "prompt_length": {"kind": "fixed", "value": 16},
        "response_length": {"kind": "fixed", "value": 16},
        "max_prompt_length": 16,
        "max_response_length": 16,
        "train_batch_size": 8,
        "n": 1,
        "ppo_mini_batch_size": 4,
        "use_kl_loss": False,
    },
    "cluster": {"device": "cpu", "device_memory_gib": 2},
    "search": {A + "use_dynamic_bsz": False, A + "ppo_micro_batch_size_per_gpu": [1, 2, 4]},
    "budget": {"max_trials": 3, "trial_timeout_s": 60},
    "sampler": "random",
}


@dataclass
class Stats:
    """Latencies (s) and failures of one endpoint."""

    latencies_s: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def summary(self) -> dict[str, Any]:
        ordered = sorted(self.latencies_s)
        return {
            "requests": len(ordered),
            "errors": sum(self.errors.values()),
            "error_kinds": dict(self.errors),
            **{f"p{q}_ms": _ms(_percentile(ordered, q)) for q in (50, 95, 99)},
            "max_ms": _ms(ordered[-1] if ordered else None),
        }


def _percentile(ordered: list[float], q: float) -> float | None:
    """The nearest-rank percentile of sorted values."""
    if not ordered:
        return None
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


class Load:
    def __init__(self, url: str, token: str, think_s: float) -> None:
        self.url, self.token, self.think_s = url, token, think_s
        self.stats: dict[str, Stats] = defaultdict(Stats)
        self.submitted: list[str] = []

    async def call(
        self, client: httpx.AsyncClient, endpoint: str, method: str, path: str, expect: int, **kwargs: Any
    ) -> httpx.Response | None:
        started = time.perf_counter()
        try:
            response = await client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            self.stats[endpoint].errors[type(exc).__name__] += 1
            return None
        self.stats[endpoint].latencies_s.append(time.perf_counter() - started)
        if response.status_code != expect:
            self.stats[endpoint].errors[str(response.status_code)] += 1
            return None
        return response

    async def client(self, number: int, until: float) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        async with httpx.AsyncClient(base_url=self.url, headers=headers, timeout=60) as client:
            while time.monotonic() < until:
                job = {**SMALL_JOB, "name": f"load-{number}-{len(self.submitted)}"}
                created = await self.call(client, "POST /v1/jobs", "POST", "/v1/jobs", 201, json=job)
                if created is not None:
                    job_id = created.json()["id"]
                    self.submitted.append(job_id)
                    for _ in range(POLLS_PER_JOB):
                        if time.monotonic() >= until:
                            break
                        await asyncio.sleep(self.think_s)
                        await self.call(client, "GET /v1/jobs/{id}", "GET", f"/v1/jobs/{job_id}", 200)
                    await self.call(
                        client, "GET /v1/jobs/{id}/trials", "GET", f"/v1/jobs/{job_id}/trials", 200
                    )
                await self.call(client, "GET /v1/jobs", "GET", "/v1/jobs", 200, params={"limit": 20})
                await asyncio.sleep(self.think_s)

    async def run(self, clients: int, duration_s: float) -> float:
        started = time.monotonic()
        until = started + duration_s
        await asyncio.gather(*(self.client(n, until) for n in range(clients)))
        return time.monotonic() - started


def check_no_job_lost(url: str, token: str, submitted: list[str]) -> dict[str, Any]:
    """Every submitted job is listed and readable; the statuses they are in."""
    headers = {"Authorization": f"Bearer {token}"}
    listed: dict[str, str] = {}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
        while True:
            page = client.get("/v1/jobs", params={"offset": len(listed), "limit": 1000})
            page.raise_for_status()
            body = page.json()
            listed.update({job["id"]: job["status"] for job in body["data"]})
            if not body["data"] or len(listed) >= body["count"]:
                break
        unreadable = [job_id for job_id in submitted if client.get(f"/v1/jobs/{job_id}").status_code != 200]
    missing = sorted(set(submitted) - set(listed))
    statuses: dict[str, int] = defaultdict(int)
    for job_id in submitted:
        statuses[listed.get(job_id, "missing")] += 1
    return {
        "submitted": len(submitted),
        "listed": len(listed),
        "missing": missing,
        "unreadable": unreadable,
        "statuses": dict(statuses),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def served(database_url: str | None, ray_cpus: int) -> Any:
    """``autotuner serve`` in its own session with a fresh data dir; yields (url, token)."""
    token = secrets.token_hex(16)
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="autotuner-load-") as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOTUNER_")}
        env.update(
            {
                "AUTOTUNER_DATA_DIR": str(Path(tmp) / "data"),
                "AUTOTUNER_API_TOKEN": token,
                "AUTOTUNER_RAY_NUM_CPUS": str(ray_cpus),
                "AUTOTUNER_TRIAL_PYTHON": str(Path(tmp) / "no-python"),
            }
        )
        if database_url:
            env["AUTOTUNER_DATABASE_URL"] = database_url
        log_path = Path(tmp) / "server.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "autotuner.cli",
                    "serve",
                    "--port",
                    str(port),
                    "--log-level",
                    "warning",
                ],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_healthy(url, proc, log_path)
            yield url, token
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], log_path: Path, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited:\n{log_path.read_text()[-4000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise SystemExit(f"the server did not answer in {timeout_s:g} s")


def table(endpoints: dict[str, dict[str, Any]]) -> str:
    head = f"{'endpoint':<28}{'requests':>9}{'errors':>8}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'max ms':>9}"
    lines = [head, "-" * len(head)]
    for name, s in endpoints.items():
        cells = [s[k] if s[k] is not None else "-" for k in ("p50_ms", "p95_ms", "p99_ms", "max_ms")]
        lines.append(f"{name:<28}{s['requests']:>9}{s['errors']:>8}" + "".join(f"{c:>9}" for c in cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.load.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--think-s", type=float, default=0.1, help="pause between one client's requests")
    parser.add_argument("--server", help="a running server's URL (default: start one)")
    parser.add_argument(
        "--token", default=os.environ.get("AUTOTUNER_API_TOKEN"), help="its token (with --server)"
    )
    parser.add_argument("--database-url", help="the started server's AUTOTUNER_DATABASE_URL")
    parser.add_argument("--ray-cpus", type=int, default=1, help="the started server's Ray CPUs")
    parser.add_argument("--note", default="", help="recorded in the JSON (how it was run)")
    parser.add_argument("--out", type=Path, default=RESULTS / f"load-{socket.gethostname()}.json")
    args = parser.parse_args(argv)

    server = (
        contextlib.nullcontext((args.server, args.token or ""))
        if args.server
        else served(args.database_url, args.ray_cpus)
    )
    load_before = os.getloadavg()
    with server as (url, token):
        load = Load(url, token, args.think_s)
        elapsed_s = asyncio.run(load.run(args.clients, args.duration_s))
        jobs = check_no_job_lost(url, token, load.submitted)
    endpoints = {name: load.stats[name].summary() for name in sorted(load.stats)}
    requests = sum(s["requests"] for s in endpoints.values())
    errors = sum(s["errors"] for s in endpoints.values())
    lost = len(jobs["missing"]) + len(jobs["unreadable"])
    result = {
        "what": "API load: concurrent clients submitting small jobs and polling them",
        "machine": {
            "host": socket.gethostname(),
            "cpu": platform.processor() or _cpu(),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "note": "client and server (and its Ray and job runner) share this machine",
        },
        "command": shlex.join(
            ["python", "-m", "benchmarks.load.run", *(argv if argv is not None else sys.argv[1:])]
        ),
        "note": args.note,
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "clients": args.clients,
        "duration_s": round(elapsed_s, 1),
        "think_s": args.think_s,
        "database": "sqlite (default)"
        if not (args.database_url or args.server)
        else ("external server" if args.server else args.database_url.split("@")[-1]),
        "requests": requests,
        "errors": errors,
        "requests_per_s": round(requests / elapsed_s, 1),
        "jobs": jobs,
        "lost_jobs": lost,
        "endpoints": endpoints,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(table(endpoints))
    print(
        f"\n{requests} requests in {elapsed_s:.1f} s ({result['requests_per_s']}/s) from "
        f"{args.clients} clients; {errors} errors; {jobs['submitted']} jobs submitted, "
        f"{lost} lost; statuses {jobs['statuses']}\nwritten to {args.out}"
    )
    return 0 if errors == 0 and lost == 0 else 1


def _cpu() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    sys.exit(main())
