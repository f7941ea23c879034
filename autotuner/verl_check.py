"""Export's last check: the config as verl itself composes and validates it.

An exported config passes the tuner's own rules (``autotuner.rules``, ``autotuner.domains``);
before it is written it also goes through verl's, in verl's environment (``.venv-verl``,
found by ``Settings.verl_python``): ``python -m trials.verl preflight --config-only``
composes the config as ``verl.trainer.main_ppo`` does, with the export's own override
lines, and runs ``validate_config`` and the typed configs' checks (``trials.verl.overrides``).
A config verl refuses is not written: ``VerlRejectedError`` names verl's complaint. A
verdict is kept per config (in memory, and under ``<data_dir>/verl-checks`` for later
processes), so a config is composed once, in seconds. Without verl's environment the
export says in its header that verl's own check was not run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from autotuner.errors import ExportError
from autotuner.settings import Settings
from autotuner.spec import JobSpec, ModelArch
from autotuner.verl_run import verl_run_spec
from trials.launcher import kill_session
from trials.verl import VERL

ROOT = Path(__file__).resolve().parents[1]
CHECK_TIMEOUT_S = 300.0
# Steps of the run the check composes (one measured after the warm-up; only composed).
CHECK_STEPS = 2
# verl's installed version, read without importing it (an import of verl takes seconds of CPU:
# torch, transformers, Ray); a verl that is installed but fails to import fails the check
# itself, which says so in the export's header.
_PROBE = "from importlib.metadata import version; print(version('verl'))"


class VerlRejectedError(ExportError):
    """Raised when verl's own validation refuses a config the tuner would export; the
    message quotes verl's complaint."""


@dataclass(frozen=True)
class VerlVerdict:
    """What verl's own check said of one config: ``version`` None when verl's environment
    was not found (``reason`` says why); else ``error`` None when verl accepted it."""

    version: str | None
    error: str | None = None
    reason: str = ""

    @property
    def header(self) -> str:
        """The export header's line."""
        if self.version is None:
            return f"not run ({self.reason}); the config passed the tuner's own checks only"
        return (
            f"passed verl {self.version}'s own validation (composed as main_ppo composes it; "
            "validate_config and its typed configs' checks)"
        )


class VerlChecker:
    """Runs verl's own check on configs, one at a time, each config once. Thread-safe."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._verdicts: dict[str, VerlVerdict] = {}
        self._python: tuple[str, str | None, str] | None = None

    def environment(self) -> tuple[str, str | None, str]:
        """(verl's Python, its verl version, why not) once per checker."""
        if self._python is None:
            python = self.settings.verl_python()
            self._python = (python, *_version(python, self._env()))
        return self._python

    def check(self, spec: JobSpec, arch: ModelArch, config: dict[str, Any]) -> VerlVerdict:
        """verl's verdict on ``config`` (a trial's flat config) of the job ``spec``.

        Raises:
            VerlRejectedError: verl's own validation refuses the config.
        """
        with self._lock:
            verdict = self._verdict(spec, arch, config)
        if verdict.error is not None:
            raise VerlRejectedError(
                f"refusing to export a config verl {verdict.version} rejects: {verdict.error}; "
                "export another trial"
            )
        return verdict

    def _verdict(self, spec: JobSpec, arch: ModelArch, config: dict[str, Any]) -> VerlVerdict:
        python, version, reason = self.environment()
        if version is None:
            return VerlVerdict(None, reason=reason)
        device: Literal["cuda", "cpu"] = "cpu" if spec.cluster.device == "cpu" else "cuda"
        run = verl_run_spec(spec, arch, config, "export-check", device=device, steps=CHECK_STEPS)
        key = hashlib.sha256(
            json.dumps([python, version, run.overrides, run.model_config, device], sort_keys=True).encode()
        ).hexdigest()
        if key in self._verdicts:
            return self._verdicts[key]
        stored = self.settings.data_dir / "verl-checks" / f"{key}.json"
        try:
            verdict = VerlVerdict(**json.loads(stored.read_text()))
        except (OSError, ValueError, TypeError):
            finished, error = _preflight(python, self._env(), run.to_json(), self.settings)
            if not finished:  # not a verdict: said in the header, asked again next time
                return VerlVerdict(None, reason=error or "")
            verdict = VerlVerdict(version, error)
            with contextlib.suppress(OSError):  # a data dir we cannot write: kept in memory only
                stored.parent.mkdir(parents=True, exist_ok=True)
                stored.write_text(json.dumps(verdict.__dict__))
        self._verdicts[key] = verdict
        return verdict

    def _env(self) -> dict[str, str]:
        env = dict(os.environ) | self.settings.trial_env_for(VERL)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        return env


def _version(python: str, env: dict[str, str]) -> tuple[str | None, str]:
    """verl's version in ``python``'s environment, or None and why not."""
    try:
        done = subprocess.run(
            [python, "-c", _PROBE], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"cannot run verl's Python: {type(exc).__name__}"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return None, (
            f"verl is not installed in its environment ({last[:200]}); run scripts/setup.sh or set "
            "AUTOTUNER_ENGINE_PYTHON__VERL"
        )
    return done.stdout.strip().splitlines()[-1], ""


def _preflight(
    python: str, env: dict[str, str], run_json: str, settings: Settings
) -> tuple[bool, str | None]:
    """``python -m trials.verl preflight --config-only`` on one run: (whether it finished,
    verl's complaint or None when verl accepts the config; why not when it did not finish)."""
    cache = settings.data_dir / "verl-cache"
    with (
        tempfile.TemporaryDirectory(prefix="verl-check-") as tmp,
        tempfile.TemporaryDirectory(prefix="vc-", dir="/tmp") as ray_temp,
    ):
        work = Path(tmp)
        (work / "spec.json").write_text(run_json)
        cmd = [python, "-m", "trials.verl", "preflight", "--spec", str(work / "spec.json")]
        cmd += ["--out", str(work / "out.json"), "--workdir", str(work / "run"), "--config-only"]
        cmd += ["--cache-dir", str(cache), "--ray-temp-dir", ray_temp]
        with open(work / "log", "wb") as log:
            proc = subprocess.Popen(
                cmd, env=env, cwd=work, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
            try:
                proc.wait(timeout=CHECK_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                return False, f"verl's check did not finish within {CHECK_TIMEOUT_S:g} s"
            finally:
                kill_session(proc, 5.0)
        try:
            (report,) = json.loads((work / "out.json").read_text())
        except (OSError, ValueError):
            tail = (work / "log").read_text(errors="replace")[-600:]
            return (
                False,
                f"verl's check exited with {proc.returncode} without a verdict ({' '.join(tail.split())})",
            )
    error = report.get("error")
    if error is None:
        return True, None
    text = str(error).replace(str(work), "<check dir>").replace(str(cache), "<verl cache>")
    return True, " ".join(text.split())[:2000]  # no server path in what a client reads
