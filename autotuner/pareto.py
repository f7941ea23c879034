"""Pareto fronts and capped optima over measured trials, for any point type.

A point is scored by objective functions, each maximized or minimized. One point
dominates another if it is at least as good in every objective and strictly better in
one; points equal in every objective do not dominate each other, so all of them stay.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal, TypeVar

T = TypeVar("T")
Direction = Literal["maximize", "minimize"]
ObjectiveFn = tuple[Callable[[T], float], Direction]

_SIGN = {"maximize": 1.0, "minimize": -1.0}


def _sign(direction: str) -> float:
    if direction not in _SIGN:
        raise ValueError(f"direction {direction!r} is not 'maximize' or 'minimize'")
    return _SIGN[direction]


def _scores(point: T, objectives: Sequence[ObjectiveFn[T]]) -> tuple[float, ...]:
    """The point's objective values, each turned so that larger is better."""
    scores = tuple(_sign(direction) * float(fn(point)) for fn, direction in objectives)
    if any(math.isnan(v) for v in scores):
        raise ValueError(f"an objective of {point!r} is NaN; leave such points out")
    return scores


def _dominates(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return a != b and all(x >= y for x, y in zip(a, b, strict=True))


def pareto_front(points: Sequence[T], objectives: Sequence[ObjectiveFn[T]]) -> list[T]:
    """The non-dominated points, best first by the first objective (then the next ones).

    Points are visited in decreasing lexicographic order of their (larger-is-better)
    scores, so any dominator of a point comes before it; by transitivity a dominated
    point is dominated by some point already on the front. O(n log n + n * front size).
    """
    if not objectives:
        raise ValueError("give at least one objective")
    for _, direction in objectives:
        _sign(direction)  # reject a bad direction even when there are no points
    scored = [(_scores(p, objectives), p) for p in points]
    scored.sort(key=lambda item: tuple(-v for v in item[0]))  # stable: ties keep input order
    front: list[tuple[tuple[float, ...], T]] = []
    for scores, point in scored:
        if not any(_dominates(kept, scores) for kept, _ in front):
            front.append((scores, point))
    return [point for _, point in front]


def best_under_cap(
    points: Sequence[T],
    value_fn: Callable[[T], float],
    direction: Direction,
    cap_fn: Callable[[T], float],
    cap: float,
) -> T | None:
    """The best point by ``value_fn`` among those with ``cap_fn(point) <= cap``; None if none.

    Points whose value or capped metric is NaN never qualify; of equal values the first wins.
    """
    sign = _sign(direction)
    best: T | None = None
    best_score = -math.inf
    for point in points:
        capped, value = float(cap_fn(point)), float(value_fn(point))
        if not capped <= cap or math.isnan(value):
            continue
        if best is None or sign * value > best_score:
            best, best_score = point, sign * value
    return best
