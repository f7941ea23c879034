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
