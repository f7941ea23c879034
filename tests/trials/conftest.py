"""Fixtures for the trial worker's tests.

The repository root goes first on ``sys.path`` so ``import trials`` finds the package
itself even where an older editable install registered it as a namespace; this folder
goes there too, for the helper modules (``trial_helpers``, ``trial_watch``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
for path in (str(HERE), str(HERE.parents[1])):
    if path in sys.path:
        sys.path.remove(path)
    sys.path.insert(0, path)

from trial_helpers import TINY_CONFIG  # noqa: E402


@pytest.fixture(scope="session")
def tiny_config() -> dict:
    return json.loads(TINY_CONFIG.read_text())


STAND_IN = Path(__file__).resolve().parent / "stand_in_sglang"


@pytest.fixture
def stand_in(monkeypatch):
    """The stand-in ``sglang`` importable, reset; the real one (if any) restored after."""
    saved = {name: mod for name, mod in sys.modules.items() if name.split(".")[0] == "sglang"}
    for name in saved:
        del sys.modules[name]
    monkeypatch.syspath_prepend(str(STAND_IN))
    from sglang.srt.entrypoints.engine import Engine

    Engine.kv_tokens, Engine.retractions, Engine.block_in_generate = 4096, 0, False
    Engine.instances.clear()
    yield Engine
    for name in [n for n in sys.modules if n.split(".")[0] == "sglang"]:
        del sys.modules[name]
    sys.modules.update(saved)
