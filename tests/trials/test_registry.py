from __future__ import annotations

import subprocess
import sys

import pytest
from trial_helpers import REPO

from trials.errors import UnknownBackend
from trials.rollout import BACKENDS, RolloutBackend, get_backend


def test_unknown_engine_lists_the_valid_ones():
    with pytest.raises(UnknownBackend, match="valid engines: sglang, vllm"):
        get_backend("tgi")


def test_registered_backends_implement_the_interface():
    for name in BACKENDS:
        pytest.importorskip(name)
        backend = get_backend(name)
        assert isinstance(backend, RolloutBackend) and backend.name == name


def test_control_plane_imports_stay_light():
    code = (
        "import sys, trials, trials.types, trials.launcher, trials.rollout\n"
        "heavy = [m for m in ('torch', 'vllm', 'sglang', 'transformers', 'numpy') "
        "if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "assert callable(trials.run_trial) and callable(trials.launch_trial)\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_trials_never_imports_the_control_plane():
    offenders = [
        str(path.relative_to(REPO))
        for path in (REPO / "trials").rglob("*.py")
        if any(
            line.strip().startswith(("import autotuner", "from autotuner", "import storage", "from storage"))
            for line in path.read_text().splitlines()
        )
    ]
    assert offenders == []
