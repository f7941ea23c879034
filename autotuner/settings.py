"""Service and CLI settings: environment variables with the AUTOTUNER_ prefix, read once."""

from __future__ import annotations

import ipaddress
import os
import sys
from functools import cache
from pathlib import Path

import platformdirs
from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# The Python of verl's own environment as ``scripts/setup.sh`` makes it, beside this package.
SETUP_VERL_PYTHON = Path(__file__).resolve().parent.parent / ".venv-verl" / "bin" / "python"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Settings(BaseSettings):
    """Every setting has a safe embedded default: SQLite file, local Ray, loopback bind."""

    model_config = SettingsConfigDict(env_prefix="AUTOTUNER_", extra="ignore", env_nested_delimiter="__")

    data_dir: Path = Field(
        default_factory=lambda: Path(platformdirs.user_data_dir("autotuner")),
        description="Where the default SQLite database and exported configs live.",
    )
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL; default sqlite:///<data_dir>/autotuner.db."
    )
    ray_address: str | None = Field(
        default=None, description="Existing Ray cluster (e.g. ray://head:10001); default: local Ray."
    )
    ray_num_cpus: int | None = Field(default=None, ge=1, description="CPUs of the local Ray.")
    models_dir: Path | None = Field(default=None, description="Root for models given as paths.")
    trial_python: str | None = Field(
        default=None, description="Python that runs trials (an engine's environment); default: ours."
    )
    engine_python: dict[str, str] = Field(
        default_factory=dict,
        description="Python that runs the trials of one engine's jobs, by engine, e.g. "
        "AUTOTUNER_ENGINE_PYTHON__SGLANG=/opt/sglang/bin/python (the engines pin different "
        "versions of shared packages: one environment each); default: trial_python.",
    )
    engine_pythonpath: dict[str, str] = Field(
        default_factory=dict,
        description="PYTHONPATH of the trials of one engine's jobs, by engine, replacing the one "
        "inherited (a folder the engine's wheels were installed into with pip --target), e.g. "
        "AUTOTUNER_ENGINE_PYTHONPATH__SGLANG=/opt/site-sglang; this repository always comes first.",
    )
    compile_cache_dir: Path | None = Field(
        default=None,
        description="Where trial processes keep vLLM's and torch's compile caches (torch.compile, "
        "Inductor, Triton), shared by every trial on a host so only the first compiles; default "
        "<data_dir>/compile-cache.",
    )
    cpu_device_memory_gib: float = Field(
        default=8.0, gt=0, description="Memory cap per CPU trial when the job sets none."
    )
    api_token: SecretStr | None = Field(default=None, description="Bearer token for the API.")
    host: str = Field(default="127.0.0.1", description="Address the API binds to.")
    port: int = Field(default=8000, ge=1, le=65535, description="Port the API binds to.")
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Host names requests may carry besides the bind address (and, bound to "
        "loopback, localhost); a JSON list, e.g. '[\"tuner.example.org\"]', or '[\"*\"]' for any. "
        "Other Host headers get 400 (DNS rebinding).",
    )
    runner_concurrency: int = Field(
        default=1, ge=1, le=64, description="Jobs the service runs at once (the rest wait queued)."
    )
    orphan_after_s: float = Field(
        default=120.0,
        ge=5,
        description="A running job whose runner sent no heartbeat for this long is requeued "
        "(hosts sharing a database need clocks in sync well within it).",
    )
    heartbeat_s: float = Field(
        default=15.0,
        gt=0,
        description="How often a runner's heartbeat thread marks the jobs it holds alive; at "
        "most a third of orphan_after_s.",
    )
    setup_gate: Path | None = Field(
        default=None,
        description="Testing aid: each job's set-up waits, after building its search space, "
        "until this file exists (at most setup_gate_timeout_s). Unset in production.",
    )
    setup_gate_timeout_s: float = Field(
        default=300.0, gt=0, description="The longest a set-up waits for setup_gate."
    )
    max_request_bytes: int = Field(
        default=4 * 1_048_576,
        ge=1024,
        description="Largest request body the API accepts (413 above); a spec holding a dataset's "
        "300,000 measured lengths is about 1.6 MB of YAML.",
    )
    max_job_trials: int = Field(
        default=1000,
        ge=1,
        description="Largest budget.max_trials a job submitted over HTTP may ask.",
    )
    max_job_minutes: float = Field(
        default=7 * 24 * 60,
        gt=0,
        description="Largest budget.max_minutes a job submitted over HTTP may ask.",
    )

    @field_validator("engine_python", "engine_pythonpath")
    @classmethod
    def _known_engines(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        from trials.rollout import BACKENDS  # names only: no engine is imported
        from trials.verl import VERL

        variable = f"AUTOTUNER_{(info.field_name or '').upper()}"
        known = {*BACKENDS, VERL}  # the engines, and verl's own environment (trials.verl)
        for engine, path in value.items():
            if engine not in known:
                raise ValueError(
                    f"{variable}__{engine.upper()}: unknown engine {engine!r}; engines: "
                    + ", ".join(sorted(known))
                )
            if not path.strip():
                raise ValueError(f"{variable}__{engine.upper()} is empty; give a path or unset it")
        return value

    @model_validator(mode="after")
    def _heartbeat_within_orphan_window(self) -> Settings:
        if self.heartbeat_s * 3 > self.orphan_after_s:
            raise ValueError(
                f"AUTOTUNER_HEARTBEAT_S={self.heartbeat_s:g} is more than a third of "
                f"AUTOTUNER_ORPHAN_AFTER_S={self.orphan_after_s:g}: a live runner's job could be "
                "taken for an orphan; lower the heartbeat or raise the orphan window"
            )
        return self

    @model_validator(mode="after")
    def _safe_bind(self) -> Settings:
        if not _is_loopback(self.host) and self.api_token is None:
            raise ValueError(
                f"AUTOTUNER_HOST={self.host} is not a loopback address and AUTOTUNER_API_TOKEN is "
                "unset; set a token or bind to 127.0.0.1"
            )
        return self

    @property
    def loopback_bind(self) -> bool:
        """Whether the API binds to a loopback address (reachable from this host only)."""
        return _is_loopback(self.host)

    @property
    def resolved_compile_cache_dir(self) -> Path:
        return self.compile_cache_dir or self.data_dir / "compile-cache"

    def trial_env(self) -> dict[str, str]:
        """Environment a trial process gets on top of its worker's: the shared compile caches
        (vLLM's ``VLLM_CACHE_ROOT`` holds its torch.compile artifacts; Inductor's and Triton's
        own directories), so trials that compile the same graphs reuse each other's work.
        A variable already set in this process's environment is left as it is."""
        root = self.resolved_compile_cache_dir
        dirs = {
            "VLLM_CACHE_ROOT": root / "vllm",
            "TORCHINDUCTOR_CACHE_DIR": root / "inductor",
            "TRITON_CACHE_DIR": root / "triton",
        }
        return {name: str(path) for name, path in dirs.items() if name not in os.environ}

    def python_for(self, engine: str) -> str | None:
        """The Python that runs trials of ``engine`` (None: the tuner's own)."""
        return self.engine_python.get(engine) or self.trial_python

    def verl_python(self) -> str:
        """The Python of verl's environment (``trials.verl``): ``AUTOTUNER_ENGINE_PYTHON__VERL``,
        else the one ``scripts/setup.sh`` makes (``.venv-verl`` beside this package) when it
        exists, else ``trial_python``, else the tuner's own (verl installed beside it, or put
        on ``AUTOTUNER_ENGINE_PYTHONPATH__VERL``). Whether verl is there is the caller's check
        (``autotuner.verification.verl_environment``)."""
        from trials.verl import VERL

        if VERL in self.engine_python:
            return self.engine_python[VERL]
        made = SETUP_VERL_PYTHON
        return str(made) if made.exists() else self.trial_python or sys.executable

    def trial_env_for(self, engine: str) -> dict[str, str]:
        """``trial_env`` plus, where one is set, the engine's own ``PYTHONPATH``."""
        env = self.trial_env()
        pythonpath = self.engine_pythonpath.get(engine)
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        return env

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.data_dir / 'autotuner.db'}"


@cache
def get_settings() -> Settings:
    return Settings()
