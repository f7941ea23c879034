"""Reading job specs from YAML: libyaml's safe loader, with a fast path for plain integers.

A job spec can hold a dataset's measured lengths (a ``list`` distribution of 300,000
values, 1.6 MB of YAML). PyYAML's pure-Python loader takes seconds on that; libyaml's
``CSafeLoader`` a fraction, and resolving a plain decimal integer without the resolver's
regular expressions saves a third of what is left. Everything else loads exactly as
``yaml.safe_load`` loads it (PyYAML's pure-Python loader where libyaml is missing).
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import SafeConstructor

_INT_TAG = "tag:yaml.org,2002:int"
_Base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _plain_decimal(value: str) -> bool:
    """``123`` (not ``0123``, YAML 1.1's octal, nor ``1_000`` or ``+1``: those take the
    resolver's way)."""
    return value.isdigit() and value.isascii() and (value[0] != "0" or value == "0")


class SpecLoader(_Base):  # type: ignore[misc,valid-type]
    """``yaml.safe_load``'s loader (libyaml's where installed) that resolves plain decimal
    integers without regular expressions."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> str:
        if kind is yaml.ScalarNode and implicit[0] and _plain_decimal(value):
            return _INT_TAG
        resolved: str = super().resolve(kind, value, implicit)
        return resolved


def _construct_int(loader: SafeConstructor, node: yaml.ScalarNode) -> int:
    value = node.value
    if _plain_decimal(value):
        return int(value)
    constructed: int = SafeConstructor.construct_yaml_int(loader, node)
    return constructed


SpecLoader.add_constructor(_INT_TAG, _construct_int)


def load_spec_yaml(text: str) -> Any:
    """The document in ``text``, as ``yaml.safe_load`` reads it.

    Raises:
        yaml.YAMLError: the text is not YAML.
        ValueError: an integer literal too long to convert (over Python's digit limit).
        RecursionError: the document is nested too deeply.
    """
    return yaml.load(text, Loader=SpecLoader)  # noqa: S506 - a safe loader
