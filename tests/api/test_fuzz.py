"""Schemathesis against the live server's own OpenAPI: every operation, schema-valid and
invalid inputs, boundary values and sequences of calls; no 5xx, every status and body
as documented, invalid input refused, and the server still up afterwards.

The server has one finished job (with trials) and one queued job, so that operations on
a job reach their logic instead of stopping at 404; no trial can run on it (its trial
Python does not exist), whatever job the fuzzer manages to submit. ~40 s on 2 cores.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import httpx
import optuna
import pytest

from autotuner.jobs import JobContext, build_space
from autotuner.settings import Settings
from autotuner.spec import parse_job_spec

from .conftest import TOKEN, Server, train_job

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("schemathesis") is None,
    reason="schemathesis is not installed (pip install -e '.[dev]')",
)

CHECKS = (
    "not_a_server_error,status_code_conformance,content_type_conformance,"
    "response_headers_conformance,response_schema_conformance,negative_data_rejection"
)


def _seed(data_dir: Path) -> list[str]:
    """A finished job with two measured trials, and a queued job; their ids."""
    ctx = JobContext.open(Settings(data_dir=data_dir))
    spec = parse_job_spec(train_job(name="seeded"))
    done, queued = ctx.submit(spec), ctx.submit(spec)
    space = build_space(spec, "cpu", ctx.settings)
    study = optuna.create_study(
        study_name=done.study_name,
        storage=ctx.settings.resolved_database_url,
        directions=[o.resolved_direction for o in spec.objectives],
    )
    base = space.baseline_config()
    for number, (micro, throughput) in enumerate(((1, 900.0), (2, 1200.0))):
        config = {**base, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": micro}
        metrics = {"throughput_tokens_per_s_per_gpu": throughput, "peak_memory_gib": 1.0 + number}
        study.add_trial(
            optuna.trial.create_trial(
                values=[metrics["throughput_tokens_per_s_per_gpu"], metrics["peak_memory_gib"]],
                user_attrs={
                    "status": "ok",
                    "config": config,
                    "metrics": metrics,
                    "device": "cpu",
                    "phase_timings_s": {"update_actor": 1.0},
                    "wall_s": 5.0,
                },
            )
        )
    ctx.store.claim(done.id, "seed:1")
    ctx.store.finish(done.id, "succeeded", stop_reason="reached max_trials (2)")
    ctx.database.dispose()
    return [done.id, queued.id]


@pytest.mark.slow
def test_fuzz_every_endpoint_finds_no_server_error(tmp_path) -> None:
    job_ids = _seed(tmp_path / "data")
    server = Server(
        tmp_path / "data",
        tmp_path / "server.log",
        AUTOTUNER_API_TOKEN=TOKEN,
        AUTOTUNER_TRIAL_PYTHON=str(tmp_path / "no-python"),
        AUTOTUNER_MAX_JOB_TRIALS="5",
        AUTOTUNER_MAX_REQUEST_BYTES="65536",
    ).start()
    config = tmp_path / "schemathesis.toml"
    config.write_text(
        f"[dictionaries.jobs]\nvalues = {job_ids!r}\n".replace("'", '"')
        + '[parameters]\n"path.job_id" = { dictionary = "jobs", probability = 0.7 }\n'
    )
    try:
        done = subprocess.run(
            [
                str(Path(sys.executable).parent / "schemathesis"),
                "--config-file",
                str(config),
                "run",
                server.url + "/openapi.json",
                "--header",
                f"Authorization: Bearer {TOKEN}",
                "--checks",
                CHECKS,
                "--max-examples",
                "15",
                "--seed",
                "8",
                "--workers",
                "1",
                "--request-timeout",
                "150",  # a config's first export waits for verl's own check (a process importing verl)
                "--suppress-health-check",
                "all",
            ],
            capture_output=True,
            text=True,
            timeout=480,
            cwd=tmp_path,
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0, output[-8000:]
        assert re.search(r"\d+ generated, \d+ passed", output), output[-3000:]
        assert "Missing test data" not in output, output[-3000:]  # the seeded ids were used
        assert server.proc is not None and server.proc.poll() is None, "the server died"
        health = httpx.get(server.url + "/healthz", timeout=30)
        assert health.status_code == 200 and health.json()["runner"] == "running"
    finally:
        server.stop(require_clean_log=False)
    log = server.log_path.read_text()
    assert not re.findall(r'HTTP/1\.1" 5\d\d', log), "a request got a 5xx"
    assert "Traceback" not in log, log[-6000:]
