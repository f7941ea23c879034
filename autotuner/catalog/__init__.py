"""Built-in model architectures: HF ``config.json`` files, looked up by name."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

_HERE = Path(__file__).parent


def catalog_names() -> list[str]:
    return sorted(p.stem for p in _HERE.glob("*.json"))


@cache
def _load(name: str) -> dict[str, Any]:
    return json.loads((_HERE / f"{name}.json").read_text())


def lookup(name: str) -> dict[str, Any] | None:
    """Return a copy of the catalog config called ``name``, or None if there is none."""
    if name in catalog_names():
        return dict(_load(name))
    return None
