"""The lengths of one PPO step's batch, drawn in the trial process from the job's seed.

The control plane sends the job's length distributions, its seed and the batch's counts
(``BatchDraw``), never a list per request: the trial draws the step's batch here, so a
step of a million requests costs the service nothing. Every trial of a job draws the same
batch: ``train_batch_size`` prompt lengths, then ``train_batch_size * n`` response lengths
from one ``numpy.random.default_rng(seed)``, each prompt repeated for its ``n`` samples.
A distribution is plain data, as the job spec holds it (``autotuner.spec``'s length
kinds): ``{"kind": "fixed", "value": ...}``, ``uniform`` (``low``, ``high``), ``normal``
(``mean``, ``std``, ``min``, ``max``), ``lognormal`` (``median``, ``sigma``, ``min``,
``max``), ``list`` (``values``).

The rollout's requests keep the prompts' order. The train sequences come in the order
verl v0.9's trainer hands them to its actor's ranks (``verl_batch_order``):

- The replay buffer's order. verl's v1 agent loop puts each trajectory into TransferQueue
  as it finishes (``verl/trainer/ppo/v1/agent_loop_tq.py``, ``_agent_loop_postprocess``),
  TransferQueue lists keys in the order they were put, and the replay buffer builds the
  step's batch in that order (``verl/trainer/ppo/v1/replay_buffer.py``,
  ``_materialize_batch``). A rollout finishes its shorter responses first. verl's traced
  updates (four H200, 2026-11-27: four layouts, 4 steps each; ``benchmarks/README.md``)
  hold the first half of every step's sequences in that order, shortest response first,
  and the longer half after them in no order their lengths explain: the trial takes the
  shorter half shortest first (ties in the prompts' order), then the longer half in the
  prompts' order.
- Balanced over the ranks. ``_balance_batch`` (``verl/trainer/ppo/v1/trainer_base.py``)
  splits the batch into as many equal-sized partitions as the actor has data-parallel
  ranks, balanced by verl's workload estimate of each sequence
  (``calculate_workload``: ``24576 * length + length**2``) with the Karmarkar-Karp
  largest-differencing method (``get_seqlen_balanced_partitions``), each partition's
  sequences in the batch's order; rank ``r`` takes partition ``r``. With one rank the
  order is kept.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from trials.batching import balanced_partitions, verl_workload
from trials.errors import InvalidTrialSpec
from trials.types import BatchDraw, TrialSpec


def _raw(dist: dict[str, Any], count: int, rng: np.random.Generator) -> Any:
    kind = dist.get("kind")
    if kind == "fixed":
        return np.full(count, dist["value"])
    if kind == "uniform":
        return rng.integers(dist["low"], dist["high"] + 1, size=count)
    if kind == "normal":
        raw = rng.normal(dist["mean"], dist["std"], size=count)
        return np.clip(raw, dist.get("min", 1), dist.get("max") or np.inf)
    if kind == "lognormal":
        raw = rng.lognormal(math.log(dist["median"]), dist.get("sigma", 0.6), size=count)
        return np.clip(raw, dist.get("min", 1), dist.get("max") or np.inf)
    if kind == "list":
        values, counts = np.asarray(dist["values"]), dist.get("counts")
        if counts is None:
            return rng.choice(values, size=count, replace=True)
        # Each value as often as it counts, in the values' order: the same draw as
        # rng.choice over the list written out (an index drawn over its whole length).
        ends = np.cumsum(np.asarray(counts, dtype=np.int64))
        return values[np.searchsorted(ends, rng.integers(0, ends[-1], size=count), side="right")]
    raise InvalidTrialSpec(
        f"unknown length distribution kind {kind!r}; use fixed, uniform, normal, lognormal or list"
    )


def draw_lengths(dist: dict[str, Any], count: int, rng: np.random.Generator, cap: int) -> list[int]:
    """``count`` lengths of ``dist``, rounded and clipped to [1, cap]."""
    raw = np.asarray(_raw(dist, count, rng), dtype=float)
    return [int(v) for v in np.clip(np.rint(raw), 1, cap)]


def step_lengths(b: BatchDraw) -> tuple[list[int], list[int]]:
    """The whole step's prompt and response lengths, one per request."""
    rng = np.random.default_rng(b.seed)
    prompts = draw_lengths(b.prompt_length, b.prompts, rng, b.max_prompt_length)
    n = b.samples_per_prompt
    responses = draw_lengths(b.response_length, b.prompts * n, rng, b.max_response_length)
    return [p for p in prompts for _ in range(n)], responses


TRAIN_ORDERS = ("verl", "prompts")


def verl_batch_order(prompts: list[int], responses: list[int], ranks: int = 1) -> list[int]:
    """The indices of a step's sequences in the order verl's trainer hands them to its
    ``ranks`` data-parallel ranks, rank 0's share first (see the module's notes). A batch
    that does not split evenly over the ranks leaves its last sequences out, as a trial's
    share (``BatchDraw.train_sequences``) does."""
    half = len(responses) // 2
    shorter = sorted(range(len(responses)), key=lambda i: responses[i])[:half]
    first = set(shorter)
    replay = shorter + [i for i in range(len(responses)) if i not in first]
    if ranks <= 1:
        return replay
    replay = replay[: len(replay) - len(replay) % ranks]
    work = [verl_workload(prompts[i] + responses[i]) for i in replay]
    return [replay[j] for part in balanced_partitions(work, ranks) for j in part]


def drawn(spec: TrialSpec) -> TrialSpec:
    """``spec`` with its lengths drawn from ``spec.batch`` (unchanged when it has none)."""
    if spec.batch is None:
        return spec
    b = spec.batch
    if b.prompts < 1 or b.samples_per_prompt < 1:
        raise InvalidTrialSpec(f"batch.prompts ({b.prompts}) and samples_per_prompt must be >= 1")
    try:
        prompts, responses = step_lengths(b)
    except (KeyError, TypeError, ValueError) as exc:  # a distribution missing or mistyping a field
        raise InvalidTrialSpec(f"batch: cannot draw lengths ({type(exc).__name__}: {exc})") from exc
    if b.train_ranks < 1:
        raise InvalidTrialSpec(f"batch.train_ranks must be >= 1, got {b.train_ranks}")
    if b.train_order not in TRAIN_ORDERS:
        raise InvalidTrialSpec(f"batch.train_order must be one of {TRAIN_ORDERS}, got {b.train_order!r}")
    if b.train_order == "verl":
        order = verl_batch_order(prompts, responses, b.train_ranks)[: b.train_sequences]
    else:
        order = list(range(b.train_sequences))
    return dataclasses.replace(
        spec,
        batch=None,
        prompt_lengths=prompts[: b.rollout_requests],
        response_lengths=responses[: b.rollout_requests],
        train_prompt_lengths=[prompts[i] for i in order],
        train_response_lengths=[responses[i] for i in order],
    )


def steps_lengths(b: BatchDraw, steps: int, repeat: bool = False) -> tuple[list[int], list[list[int]]]:
    """``steps`` batches of the job, one after another from the one generator (the first is
    the batch every trial is measured on): each prompt's length and its ``n`` response
    lengths, for verl's step runner. ``repeat``: every step is that first batch."""
    rng = np.random.default_rng(b.seed)
    n = b.samples_per_prompt
    prompts: list[int] = []
    responses: list[list[int]] = []
    for _ in range(1 if repeat else steps):
        step_prompts = draw_lengths(b.prompt_length, b.prompts, rng, b.max_prompt_length)
        step_responses = draw_lengths(b.response_length, b.prompts * n, rng, b.max_response_length)
        prompts += step_prompts
        responses += [step_responses[i * n : (i + 1) * n] for i in range(b.prompts)]
    if repeat:
        prompts, responses = prompts * steps, [list(r) for _ in range(steps) for r in responses]
    return prompts, responses
