"""Reading job specs from YAML: libyaml's safe loader, with a fast path for plain integers.

A job spec can hold a dataset's measured lengths (a ``list`` distribution of 300,000
values, 1.6 MB of YAML). PyYAML's pure-Python loader takes seconds on that; libyaml's
``CSafeLoader`` a fraction, and resolving a plain decimal integer without the resolver's
regular expressions saves a third of what is left. Everything else loads exactly as
``yaml.safe_load`` loads it (PyYAML's pure-Python loader where libyaml is missing), but for
a key given twice in one mapping: YAML forbids it, and PyYAML would keep the last value and
drop the first without a word (a second ``search:`` block would replace the first). JSON
specs are read with the same rule (``load_spec_json``).
"""

from __future__ import annotations

import json
from typing import Any

import yaml
from yaml.constructor import ConstructorError, SafeConstructor

_INT_TAG = "tag:yaml.org,2002:int"
_MERGE_TAG = "tag:yaml.org,2002:merge"
TWICE = "a key given twice keeps only its last value; give it once"
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

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:  # ``<<: *defaults``: its keys may be overridden
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    twice = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: the base constructor refuses it
                    continue
                if twice:
                    raise ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"found key {key!r} twice; {TWICE}",
                        key_node.start_mark,
                    )
        return super().construct_mapping(node, deep)


def _construct_int(loader: SafeConstructor, node: yaml.ScalarNode) -> int:
    value = node.value
    if _plain_decimal(value):
        return int(value)
    constructed: int = SafeConstructor.construct_yaml_int(loader, node)
    return constructed


SpecLoader.add_constructor(_INT_TAG, _construct_int)


class DuplicateKeyError(ValueError):
    """Raised when a JSON object names one key twice."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document: dict[str, Any] = {}
    for key, value in pairs:
        if key in document:
            raise DuplicateKeyError(f"an object names the key {key!r} twice; {TWICE}")
        document[key] = value
    return document


def load_spec_json(text: str) -> Any:
    """The JSON document in ``text``, as ``json.loads`` reads it, refusing an object that
    names a key twice (DuplicateKeyError)."""
    return json.loads(text, object_pairs_hook=_unique_keys)


def load_spec_yaml(text: str) -> Any:
    """The document in ``text``, as ``yaml.safe_load`` reads it.

    Raises:
        yaml.YAMLError: the text is not YAML, or a mapping gives a key twice.
        ValueError: an integer literal too long to convert (over Python's digit limit).
        RecursionError: the document is nested too deeply.
    """
    return yaml.load(text, Loader=SpecLoader)  # noqa: S506 - a safe loader
