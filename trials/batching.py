"""How verl cuts one rank's sequences into mini- and micro-batches (pure Python).

Fixed size: consecutive groups of ``micro_batch_size`` sequences. Dynamic batch size
(``use_dynamic_bsz``): like verl's ``rearrange_micro_batches``, ``ceil(tokens / budget)``
groups balanced by token count (longest sequence first into the lightest group), one more
until every group fits the budget, and a sequence longer than the budget is rejected as
verl rejects it. Where verl's environment is on the host, a one-rank trial runs verl's own
micro-batches instead (``trials.train.verls_plans``). Ranks of one world run as
many micro-batches as the rank that needs most (verl's ``same_micro_num_in_dp``): the
``min_groups`` arguments, from ``trials.train.synced_plans``. For the actor update the
sequences are first cut into mini-batches of ``local_mini_batch_size`` (one optimizer
step each), and each mini-batch into micro-batches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trials.errors import ConfigRejected, InvalidTrialSpec


@dataclass(frozen=True)
class MicroBatch:
    """Indices of the sequences in one micro-batch and whether an optimizer step follows."""

    indices: tuple[int, ...]
    ends_mini_batch: bool = False


def fixed_size(indices: list[int], micro_batch_size: int) -> list[list[int]]:
    """Consecutive groups of ``micro_batch_size`` (the last one may be smaller)."""
    if micro_batch_size < 1:
        raise InvalidTrialSpec(f"micro-batch size must be >= 1, got {micro_batch_size}")
    return [indices[i : i + micro_batch_size] for i in range(0, len(indices), micro_batch_size)]


def token_budget(
    indices: list[int], lengths: list[int], max_tokens: int, knob: str, min_groups: int = 0
) -> list[list[int]]:
    """``ceil(sum / max_tokens)`` groups (at least ``min_groups``) of ``indices`` balanced
    by ``lengths[i]``, more where one would exceed ``max_tokens``."""
    if not indices:
        return []
    longest = max(lengths[i] for i in indices)
    if longest > max_tokens:
        raise ConfigRejected(
            f"{knob}={max_tokens} is smaller than the longest sequence ({longest} tokens); "
            f"verl requires {knob} >= prompt + response length. Raise {knob}."
        )
    total = sum(lengths[i] for i in indices)
    wanted = min(len(indices), max(math.ceil(total / max_tokens), min_groups))
    while True:  # as verl: one more group until every group fits the budget
        groups: list[list[int]] = [[] for _ in range(wanted)]
        loads = [0] * wanted
        for i in sorted(indices, key=lambda i: -lengths[i]):
            lightest = loads.index(min(loads))
            groups[lightest].append(i)
            loads[lightest] += lengths[i]
        if max(loads) <= max_tokens or wanted >= len(indices):
            return [sorted(g) for g in groups]
        wanted += 1


def log_prob_plan(
    lengths: list[int],
    micro_batch_size: int,
    dynamic: bool,
    max_tokens: int,
    knob: str,
    min_groups: int = 0,
) -> list[MicroBatch]:
    """Micro-batches for a forward-only pass over all sequences (``old/ref_log_prob``)."""
    indices = list(range(len(lengths)))
    groups = (
        token_budget(indices, lengths, max_tokens, knob, min_groups)
        if dynamic
        else fixed_size(indices, micro_batch_size)
    )
    return [MicroBatch(tuple(g)) for g in groups]


def update_plan(
    lengths: list[int],
    mini_batch_size: int,
    micro_batch_size: int,
    dynamic: bool,
    max_tokens: int,
    knob: str = "ppo_max_token_len_per_gpu",
    min_groups: list[int] | None = None,
) -> list[MicroBatch]:
    """Micro-batches for the actor update; the last of each mini-batch has ``ends_mini_batch``.
    ``min_groups``: at least this many micro-batches in each mini-batch (dynamic)."""
    if mini_batch_size < 1:
        raise InvalidTrialSpec(f"local_mini_batch_size must be >= 1, got {mini_batch_size}")
    plan: list[MicroBatch] = []
    minis = fixed_size(list(range(len(lengths))), mini_batch_size)
    for j, mini in enumerate(minis):
        at_least = min_groups[j] if min_groups and j < len(min_groups) else 0
        groups = (
            token_budget(mini, lengths, max_tokens, knob, at_least)
            if dynamic
            else fixed_size(mini, micro_batch_size)
        )
        plan.extend(MicroBatch(tuple(g), k == len(groups) - 1) for k, g in enumerate(groups))
    return plan


def evenly_spaced(n: int, k: int) -> list[int]:
    """``min(n, k)`` indices spread evenly over ``range(n)`` (first and last included)."""
    if k >= n:
        return list(range(n))
    if k <= 1:
        return [0] if k == 1 else []
    return sorted({round(j * (n - 1) / (k - 1)) for j in range(k)})
