"""Phase composition: an unmeasured config's throughput, predicted from measured ones.

A step is its phases one after another (``trials.runner``; ``step_time_s`` is the sum of
the phase timings less the start-up): the engine's side (``rollout``, ``engine_sleep``,
``engine_wake``) depends on the rollout knobs, the actor's side (``old_log_prob``,
``ref_log_prob``, ``update_actor``, ``actor_reload``) on the train knobs. The actor's
offload is on both sides' rows (each knob's side is on its row, ``Knob.side``;
``reuse.rollout_key`` keys a trial's rollout by it, since it sets the memory the rollout's
peaks hold beside the engine). Its time is the actor's (reloads count as ``actor_reload``),
and with vLLM so is all of it: vLLM's budget is a share of the whole device whatever is
resident beside it, so an engine side measured beside one offload composes with a train
side measured with another. SGLang's budget is a share of what is free, so there the
offload changes the rollout's KV cache and the sides compose only with the same offload
(``memory.budget_beside_resident``). Whether a composition fits is the memory model's to
say, as for any proposal (``StudyRunner._screen``). So a config whose
rollout knobs were measured in trial A and whose train knobs were measured in trial B has
a predicted step time: A's engine side plus B's actor side, and a predicted throughput:
A's tokens per GPU per step over that time. On the H200 landscape
(``benchmarks/search/landscapes/qwen2.5-1.5b-h200.json``, 16 measured configs, every
(A, B) pair) the prediction is within 1.6% of the measured step time in the median and
12% at worst.

``best_composition`` names the unmeasured config predicted fastest; the study runs it
ahead of the sampler when the prediction beats the best measured throughput by more
than the noise band (``Budget.compose_phases``). Its rollout was measured already, so on
one GPU it reuses that rollout (``Budget.reuse_rollouts``) and costs only its training:
a search that has seen each rollout setting once and each train setting once can go
straight to their best combination, where a black-box sampler has to find it by chance.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from autotuner.knobs import KNOBS
from autotuner.records import TrialRecord, TrialStatus
from trials.metrics import THROUGHPUT

ENGINE_PHASES = ("weight_sync", "rollout", "rollout_poll", "engine_sleep", "engine_wake")
ACTOR_PHASES = ("old_log_prob", "ref_log_prob", "update_actor", "actor_reload")


def side_of(path: str) -> str:
    """``engine``, ``actor`` or ``both``: the knob's ``Knob.composition_side`` (a key that is
    no knob, e.g. ``max_model_len``, is the engine's)."""
    knob = KNOBS.get(path)
    return "engine" if knob is None else knob.composition_side


def _key(config: dict[str, Any], sides: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((p, repr(v)) for p, v in config.items() if side_of(p) in sides))


@dataclass(frozen=True)
class Composition:
    """An unmeasured config: the engine side of trial ``engine_from``, the actor side of
    trial ``actor_from``, and the throughput that predicts."""

    params: dict[str, Any]  # the searched knobs' values
    engine_from: int
    actor_from: int
    predicted_throughput: float


def _seconds(rec: TrialRecord, phases: Iterable[str]) -> float:
    return sum(float(rec.phase_timings_s.get(p, 0.0)) for p in phases)


def engine_seconds(rec: TrialRecord) -> float:
    """The seconds of a trial's step on the engine's side (``ENGINE_PHASES``)."""
    return _seconds(rec, ENGINE_PHASES)


def best_composition(
    records: Iterable[TrialRecord],
    searched: dict[str, list[Any]],
    exclude: set[str],
    key_of: Callable[[dict[str, Any]], str],
    offload_shapes_rollout: bool = True,
) -> Composition | None:
    """The searched-knob values, not in ``exclude`` (``key_of(params)`` keys), of the
    unmeasured combination of a measured engine side and a measured actor side predicted
    fastest; None when there is none. Repeated runs of a side count by their median.
    ``offload_shapes_rollout``: the knobs on both sides (the actor's offload) must match
    between the two (SGLang); False: they come with the train side (vLLM)."""
    engine_sides = ("engine", "both") if offload_shapes_rollout else ("engine",)
    engine: dict[tuple, list[TrialRecord]] = {}
    actor: dict[tuple, list[TrialRecord]] = {}
    measured: set[tuple] = set()
    for rec in records:
        if rec.status != TrialStatus.OK or not rec.metrics.get(THROUGHPUT):
            continue
        if not any(p in rec.phase_timings_s for p in ENGINE_PHASES) or not any(
            p in rec.phase_timings_s for p in ACTOR_PHASES
        ):
            continue
        engine.setdefault(_key(rec.config, engine_sides), []).append(rec)
        actor.setdefault(_key(rec.config, ("actor", "both")), []).append(rec)
        measured.add(_key(rec.config, engine_sides) + _key(rec.config, ("actor", "both")))
    best: Composition | None = None
    for ekey, erecs in engine.items():
        e_s = statistics.median(_seconds(r, ENGINE_PHASES) for r in erecs)
        # tokens per GPU per step: the same for every config on this engine side's GPUs
        per_gpu = statistics.median(
            r.metrics[THROUGHPUT] * (_seconds(r, ENGINE_PHASES) + _seconds(r, ACTOR_PHASES)) for r in erecs
        )
        shared = {p: v for p, v in ekey if side_of(p) == "both"}
        for akey, arecs in actor.items():
            if ekey + akey in measured or any(shared.get(p, v) != v for p, v in akey):
                continue
            a_s = statistics.median(_seconds(r, ACTOR_PHASES) for r in arecs)
            if e_s + a_s <= 0:
                continue
            params = {
                p: erecs[0].config[p] for p in searched if p in erecs[0].config and side_of(p) in engine_sides
            }
            params |= {
                p: arecs[0].config[p]
                for p in searched
                if p in arecs[0].config and side_of(p) not in engine_sides
            }
            if key_of(params) in exclude:
                continue
            guess = per_gpu / (e_s + a_s)
            if best is None or guess > best.predicted_throughput:
                best = Composition(params, erecs[0].number, arecs[0].number, guess)
    return best


# Engine-side settings (products of the searched engine knobs' values) up to this many are
# explored one by one; a larger engine space is left to the sampler.
EXPLORE_MAX_ENGINE_SIDES = 32


def explorable(searched: dict[str, list[Any]]) -> bool:
    """Whether the searched engine knobs have at most ``EXPLORE_MAX_ENGINE_SIDES`` settings."""
    paths = [p for p in searched if side_of(p) == "engine"]
    return bool(paths) and math.prod(len(searched[p]) for p in paths) <= EXPLORE_MAX_ENGINE_SIDES


def next_engine_side(
    records: Iterable[TrialRecord],
    searched: dict[str, list[Any]],
    tried: Iterable[dict[str, Any]],
    order_seed: int,
) -> tuple[dict[str, Any], TrialRecord] | None:
    """An engine-side setting (values of the searched engine knobs) that none of the
    configs ``tried`` has, with the fastest measured trial whose train side it should be
    paired with; None when every setting was tried, there are more than
    ``EXPLORE_MAX_ENGINE_SIDES``, or nothing was measured. The settings come in an order
    shuffled by ``order_seed``.

    A new engine side costs a whole trial (start-up and rollout); paired with the best train
    side found so far, that trial is itself a contender, and its engine side then composes
    with every measured train side (``best_composition``). Train sides are explored by the
    sampler, cheaply where the rollout is reused."""
    if not explorable(searched):
        return None
    paths = [p for p in searched if side_of(p) == "engine"]
    best = max(
        (
            r
            for r in records
            if r.status == TrialStatus.OK and r.repeat_of is None and r.metrics.get(THROUGHPUT)
        ),
        key=lambda r: r.metrics[THROUGHPUT],
        default=None,
    )
    if best is None:
        return None
    seen = {tuple(repr(config.get(p)) for p in paths) for config in tried}
    combos = list(itertools.product(*(searched[p] for p in paths)))
    random.Random(order_seed).shuffle(combos)
    for values in combos:
        if tuple(repr(v) for v in values) not in seen:
            return dict(zip(paths, values, strict=True)), best
    return None
