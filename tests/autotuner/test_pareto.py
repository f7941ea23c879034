"""Pareto front and capped optimum, checked against brute-force references."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest

from autotuner.pareto import best_under_cap, pareto_front


@dataclass(frozen=True)
class Point:
    index: int  # makes duplicates distinguishable
    values: tuple[float, ...]


def _objectives(directions: list[str]):
    return [(lambda p, i=i: p.values[i], d) for i, d in enumerate(directions)]


def _at_least_as_good(a: Point, b: Point, directions: list[str]) -> list[bool]:
    return [
        (x >= y) if d == "maximize" else (x <= y)
        for x, y, d in zip(a.values, b.values, directions, strict=True)
    ]


def _dominates(a: Point, b: Point, directions: list[str]) -> bool:
    """Brute force, straight from the definition."""
    return all(_at_least_as_good(a, b, directions)) and not all(_at_least_as_good(b, a, directions))


def _reference(points: list[Point], directions: list[str]) -> set[Point]:
    return {p for p in points if not any(_dominates(q, p, directions) for q in points)}


def _random_points(rng: random.Random, n: int, dims: int) -> list[Point]:
    # Few distinct values per axis: many ties in one objective and exact duplicates.
    levels = rng.choice([3, 5, 20, 1000])
    points = [Point(i, tuple(float(rng.randrange(levels)) for _ in range(dims))) for i in range(n)]
    for _ in range(rng.randrange(0, n // 4 + 1)):  # copy some points outright
        src = rng.choice(points)
        points.append(Point(len(points), src.values))
    rng.shuffle(points)
    return points


DIRECTIONS = [
    ["maximize", "maximize"],
    ["maximize", "minimize"],
    ["minimize", "maximize"],
    ["minimize", "minimize"],
    ["maximize", "minimize", "maximize"],
    ["minimize", "minimize", "maximize"],
    ["maximize", "maximize", "maximize"],
]


@pytest.mark.parametrize("directions", DIRECTIONS, ids="-".join)
@pytest.mark.parametrize("seed", range(30))
def test_front_matches_brute_force(directions: list[str], seed: int) -> None:
    rng = random.Random(seed * 101 + len(directions))
    points = _random_points(rng, rng.randrange(0, 120), len(directions))
    front = pareto_front(points, _objectives(directions))

    assert len(front) == len(set(front)), "a point is returned twice"
    assert set(front) == _reference(points, directions)
    for p in front:  # no returned point is dominated by any input point
        assert not any(_dominates(q, p, directions) for q in points)
    # Best first by the first objective.
    sign = 1 if directions[0] == "maximize" else -1
    firsts = [sign * p.values[0] for p in front]
    assert firsts == sorted(firsts, reverse=True)


def test_equal_points_all_stay() -> None:
    points = [Point(i, (1.0, 2.0)) for i in range(4)] + [Point(9, (0.0, 0.0))]
    front = pareto_front(points, _objectives(["maximize", "maximize"]))
    assert sorted(p.index for p in front) == [0, 1, 2, 3]


def test_throughput_against_memory() -> None:
    trials = [
        {"name": "fast-big", "tps": 900.0, "gib": 70.0},
        {"name": "slow-small", "tps": 300.0, "gib": 20.0},
        {"name": "dominated", "tps": 300.0, "gib": 30.0},
        {"name": "middle", "tps": 600.0, "gib": 40.0},
        {"name": "worse-middle", "tps": 550.0, "gib": 45.0},
    ]
    objectives = [(lambda t: t["tps"], "maximize"), (lambda t: t["gib"], "minimize")]
    front = pareto_front(trials, objectives)
    assert [t["name"] for t in front] == ["fast-big", "middle", "slow-small"]


def test_front_of_nothing_and_bad_input() -> None:
    assert pareto_front([], [(float, "maximize")]) == []
    with pytest.raises(ValueError, match="objective"):
        pareto_front([1.0], [])
    with pytest.raises(ValueError, match="direction"):
        pareto_front([1.0], [(float, "max")])
    with pytest.raises(ValueError, match="NaN"):
        pareto_front([1.0, math.nan], [(float, "maximize")])


def test_infinite_values_are_ordered() -> None:
    front = pareto_front([math.inf, 1.0, -math.inf], [(float, "minimize")])
    assert front == [-math.inf]


# --------------------------------------------------------------------------- best_under_cap


@pytest.mark.parametrize("direction", ["maximize", "minimize"])
@pytest.mark.parametrize("seed", range(30))
def test_best_under_cap_matches_brute_force(direction: str, seed: int) -> None:
    rng = random.Random(seed)
    points = _random_points(rng, rng.randrange(0, 60), 2)
    cap = float(rng.randrange(0, 25))
    best = best_under_cap(points, lambda p: p.values[0], direction, lambda p: p.values[1], cap)

    allowed = [p for p in points if p.values[1] <= cap]
    if not allowed:
        assert best is None
        return
    pick = max if direction == "maximize" else min
    assert best is not None and best.values[1] <= cap
    assert best.values[0] == pick(p.values[0] for p in allowed)
    # Of equal values, the first in input order wins.
    assert best == next(p for p in allowed if p.values[0] == best.values[0])


def test_best_under_cap_skips_nan_and_honours_the_cap_exactly() -> None:
    trials = [(math.nan, 10.0), (500.0, 40.0), (800.0, 40.0001), (700.0, math.nan), (450.0, 40.0)]
    best = best_under_cap(trials, lambda t: t[0], "maximize", lambda t: t[1], 40.0)
    assert best == (500.0, 40.0)
    assert best_under_cap(trials, lambda t: t[0], "maximize", lambda t: t[1], 5.0) is None
    with pytest.raises(ValueError, match="direction"):
        best_under_cap(trials, lambda t: t[0], "up", lambda t: t[1], 40.0)
