"""The values a knob may take at all: its type and verl's (or its engine's) valid range.

Every value a job names for a knob is checked here, wherever it appears (a search range's
ends, a choice, a fixed value, a baseline) and whatever the job's phases, before anything
is stored; the exporter checks again before it writes a config. Cross-knob rules (TP
divides the GPUs, micro-batches divide the mini-batch, ...) are ``autotuner.rules``'.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotuner.spec import JobSpec

# Engines and verl hand integer knobs to C++/CUDA code as 32-bit integers.
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class Domain:
    """Numbers within [low, high] (``low`` itself excluded when ``low_open``), plus the
    ``special`` values an engine reads as a switch (SGLang's chunked_prefill_size -1: off).
    A bool knob's domain is true and false; its bounds are unused."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    special: tuple[int, ...] = ()

    def holds(self, number: float) -> bool:
        if number in self.special:
            return True
        if self.low is not None and (number < self.low or (self.low_open and number == self.low)):
            return False
        return self.high is None or number <= self.high

    def describe(self, kind: str) -> str:
        if kind == "bool":
            return "true or false"
        left = "(" if self.low_open else "["
        low = "-inf" if self.low is None else _number(self.low)
        high = "inf" if self.high is None else _number(self.high)
        extra = "".join(f", or {v}" for v in self.special)
        return f"{'an int' if kind == 'int' else 'a number'} in {left}{low}, {high}]{extra}"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


# A knob's domain when its row names none: counts and sizes are positive 32-bit ints.
KIND_DOMAINS: dict[str, Domain] = {
    "int": Domain(low=1, high=INT32_MAX),
    "float": Domain(),
    "bool": Domain(),
}


class KnobValueError(ValueError):
    """Raised when a job names a knob value outside the knob's type or domain; ``loc`` is
    where in the job (``("search", path, "fixed")``, ``("baselines", name, path)``)."""

    def __init__(self, loc: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc


def refusal(path: str, kind: str, domain: Domain, value: Any, *, bound: bool = False) -> str | None:
    """Why ``value`` is no value of the knob (None when it is one). ``bound``: an end of a
    search range, which may be any number for an int knob."""
    if kind not in KIND_DOMAINS:
        return None  # a kind this table does not describe (yet): nothing to check against
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "bool":
        ok = isinstance(value, bool)
    elif kind == "int" and not bound:
        ok = number and isinstance(value, int)
    else:
        ok = number and math.isfinite(value)
    if not ok:
        what = {"bool": "a bool", "int": "an int", "float": "a finite number"}[kind]
        return f"{path} = {value!r} is not {what}; its domain: {domain.describe(kind)}"
    if kind == "bool" or domain.holds(value):
        return None
    return f"{path} = {value!r} is not in its domain: {domain.describe(kind)}"


def check_spec_values(spec: JobSpec) -> None:
    """Every knob value the job names, in its search section and its baselines.

    Raises:
        KnobValueError: the first value outside its knob's domain, naming where it is.
    """
    from autotuner.knobs import KNOBS  # the knob table imports this module

    for path, override in spec.search.items():
        knob = KNOBS.get(path)
        if knob is None:
            continue  # JobSpec names unknown knobs itself
        if knob.kind == "bool" and (override.low is not None or override.high is not None):
            raise KnobValueError(
                ("search", path), f"{path} is a bool knob and has no range; use fixed or choices"
            )
        named = [("fixed", override.fixed), ("low", override.low), ("high", override.high)]
        named += [("choices", v) for v in override.choices or ()]
        for where, value in named:
            if value is None:
                continue
            why = knob.refuses(value, bound=where in ("low", "high"))
            if why is not None:
                raise KnobValueError(("search", path, where), why)
    for name, config in spec.baselines.items():
        for path, value in config.items():
            knob = KNOBS.get(path)
            why = None if knob is None else knob.refuses(value)
            if why is not None:
                raise KnobValueError(("baselines", name, path), f"baseline {name!r}: {why}")


def config_refusals(config: dict[str, Any]) -> list[str]:
    """Why the values of a flat config (verl path -> value) are no values of their knobs."""
    from autotuner.knobs import KNOBS

    out = []
    for path, value in config.items():
        knob = KNOBS.get(path)
        why = None if knob is None else knob.refuses(value)
        if why is not None:
            out.append(why)
    return out
