"""A job's measurement noise, measured on its baselines, and the rule that calls a tie.

Every job runs its baselines several times spread over the job (``budget.baseline_runs``:
first, again once half the trial budget is used, and last interleaved with the finalists;
``autotuner.proposals``). A baseline's spread is (max - min) / median of its runs; the
baselines' spreads, pooled (weighted by each one's runs less one), are the job's noise
estimate. The tie band is the largest of that estimate, ``budget.noise_band_pct`` (what the
job assumes before it has measured any) and the compared figures' own spreads.

Two throughputs tie when their medians differ by no more than the band, relative to the
larger: a difference inside the noise is no finding.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum


class Verdict(str, Enum):
    """How one throughput compares with another."""

    FASTER = "faster"
    SLOWER = "slower"
    TIE = "tie"  # the difference is inside the tie band

    def __str__(self) -> str:
        return self.value


def spread_pct(values: Sequence[float]) -> float | None:
    """(max - min) / median of ``values``, in percent; None for fewer than two or a zero median."""
    if len(values) < 2:
        return None
    median = statistics.median(values)
    if median <= 0:
        return None
    return 100.0 * (max(values) - min(values)) / median


def pooled_spread_pct(groups: Iterable[Sequence[float]]) -> tuple[float | None, int, int]:
    """The spreads of ``groups`` (each one config's runs) pooled, weighted by runs less one;
    with how many groups of two runs or more it rests on, and their runs in all."""
    weighted = [(spread, len(g) - 1) for g in groups if (spread := spread_pct(g)) is not None]
    if not weighted:
        return None, 0, 0
    weight = sum(w for _, w in weighted)
    return sum(s * w for s, w in weighted) / weight, len(weighted), weight + len(weighted)


@dataclass(frozen=True)
class Noise:
    """A job's noise: measured on its baselines' repeats (``measured_pct``; None before any
    baseline ran twice) and the floor its budget assumes (``floor_pct``)."""

    floor_pct: float
    measured_pct: float | None = None
    baselines: int = 0  # baselines with two runs or more
    runs: int = 0  # their runs in all

    @classmethod
    def of(cls, floor_pct: float, baseline_runs: Iterable[Sequence[float]]) -> Noise:
        measured, baselines, runs = pooled_spread_pct(baseline_runs)
        return cls(floor_pct, measured, baselines, runs)

    @property
    def band_pct(self) -> float:
        """The tie band (%): the measured noise, or the floor if that is larger."""
        return max(self.floor_pct, self.measured_pct or 0.0)

    def describe(self) -> str:
        """``noise 3.1% (2 baselines, 6 runs); tie band 3.1%`` or, unmeasured, the floor."""
        if self.measured_pct is None:
            return f"noise not measured (no baseline ran twice); tie band {self.band_pct:g}% (assumed)"
        return (
            f"noise {self.measured_pct:.1f}% ({self.baselines} baseline(s), {self.runs} runs); "
            f"tie band {self.band_pct:.1f}%"
        )


def tie_band_pct(noise: Noise, *spreads: float | None) -> float:
    """The band two figures are compared within: the job's, or either figure's own spread."""
    return max([noise.band_pct, *(s for s in spreads if s is not None)])


def compare(a: float, b: float, band_pct: float) -> Verdict:
    """Whether throughput ``a`` is faster than, slower than or ties ``b`` within ``band_pct``
    (the difference relative to the larger of the two)."""
    top = max(a, b)
    if top <= 0 or abs(a - b) <= top * band_pct / 100.0:
        return Verdict.TIE
    return Verdict.FASTER if a > b else Verdict.SLOWER


def versus(ratio: float | None, verdict: Verdict | str | None, band_pct: float, name: str) -> str:
    """``1.25x verl's defaults`` or ``ties verl's defaults (1.01x, inside the 3.1% band)``."""
    if ratio is None or verdict is None:
        return f"no figure for {name}"
    if Verdict(verdict) is Verdict.TIE:
        return f"ties {name} ({ratio:.2f}x, inside the {band_pct:.1f}% noise band)"
    return f"{ratio:.2f}x {name}"
