"""verl's environment is found like an engine's: AUTOTUNER_ENGINE_PYTHON__VERL and
AUTOTUNER_ENGINE_PYTHONPATH__VERL, the .venv-verl setup.sh makes otherwise."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from autotuner.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_verl_has_its_own_python_and_pythonpath(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNER_ENGINE_PYTHON__VERL", "/opt/verl/bin/python")
    monkeypatch.setenv("AUTOTUNER_ENGINE_PYTHONPATH__VERL", "/tmp/site-verl:/tmp/site")
    monkeypatch.setenv("AUTOTUNER_TRIAL_PYTHON", "/opt/vllm/bin/python")
    settings = Settings()
    assert settings.verl_python() == "/opt/verl/bin/python"
    assert settings.trial_env_for("verl")["PYTHONPATH"] == "/tmp/site-verl:/tmp/site"
    assert settings.python_for("vllm") == "/opt/vllm/bin/python"  # the engines keep theirs


def test_without_a_setting_verl_is_the_venv_setup_made(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AUTOTUNER_ENGINE_PYTHON__VERL", raising=False)
    monkeypatch.delenv("AUTOTUNER_TRIAL_PYTHON", raising=False)
    made = ROOT / ".venv-verl" / "bin" / "python"
    assert Settings().verl_python() == (str(made) if made.exists() else sys.executable)


def test_an_unknown_environment_is_refused_naming_verl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNER_ENGINE_PYTHON__VERLL", "/opt/x/bin/python")
    with pytest.raises(ValueError, match=r"AUTOTUNER_ENGINE_PYTHON__VERLL: unknown engine 'verll'.*verl"):
        Settings()
