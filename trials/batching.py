"""How verl cuts one rank's sequences into mini- and micro-batches (pure Python).

Fixed size: consecutive groups of ``micro_batch_size`` sequences. Dynamic batch size
(``use_dynamic_bsz``): verl 0.9.1's ``rearrange_micro_batches``, ``ceil(tokens / budget)``
groups balanced by verl's workload estimate (Karmarkar-Karp, ``balanced_partitions``), one
more until every group fits the budget, in verl's order; a sequence longer than the budget
is rejected as verl rejects it. Where verl's environment is on the host, a one-rank trial runs verl's own
micro-batches instead (``trials.train.verls_plans``). Ranks of one world run as
many micro-batches as the rank that needs most (verl's ``same_micro_num_in_dp``): the
``min_groups`` arguments, from ``trials.train.synced_plans``. For the actor update the
sequences are first cut into mini-batches of ``local_mini_batch_size`` (one optimizer
step each), and each mini-batch into micro-batches.
"""

from __future__ import annotations

import dataclasses
import heapq
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
    """``indices`` in micro-batches of at most ``max_tokens`` tokens (``lengths[i]``), as
    verl 0.9.1's ``rearrange_micro_batches`` cuts them: ``ceil(sum / max_tokens)`` groups (at
    least ``min_groups``, at most one a sequence) balanced by verl's workload with the
    largest-differencing method, one more until every group fits, then ordered by workload,
    the lightest at both ends (``use_dynamic_bsz_balance``)."""
    if not indices:
        return []
    tokens = [lengths[i] for i in indices]
    if max(tokens) > max_tokens:
        raise ConfigRejected(
            f"{knob}={max_tokens} is smaller than the longest sequence ({max(tokens)} tokens); "
            f"verl requires {knob} >= prompt + response length. Raise {knob}."
        )
    work = [verl_workload(n) for n in tokens]
    wanted = max(min(len(indices), math.ceil(sum(tokens) / max_tokens)), min_groups)
    while True:  # as verl: one more group until every group fits the budget
        if wanted > len(indices):
            raise ConfigRejected(
                f"{knob}={max_tokens}: {len(indices)} sequences do not fit {wanted} "
                f"micro-batches; raise {knob}"
            )
        groups = balanced_partitions(work, wanted, equal_size=False)
        if all(sum(tokens[j] for j in g) <= max_tokens for g in groups):
            break
        wanted += 1
    groups.sort(key=lambda g: (sum(work[j] for j in g), g[0]), reverse=True)
    return [[indices[j] for j in g] for g in groups[::2][::-1] + groups[1::2]]


def verl_workload(length: int) -> int:
    """verl's estimate of a sequence's compute, which ``_balance_batch`` balances
    (``verl.utils.seqlen_balancing.calculate_workload``)."""
    return 24576 * length + length * length


@dataclasses.dataclass
class _Part:
    """One partition of a differencing state: its total and its ``(index, value)`` items."""

    total: int = 0
    items: list[tuple[int, int]] = dataclasses.field(default_factory=list)

    def key(self) -> tuple[int, int, list[tuple[int, int]]]:
        return self.total, len(self.items), self.items


class _State:
    """``k`` partitions, heaviest first; the heap pops the state of largest spread first,
    then the one whose heaviest partition is heaviest (as verl's ``karmarkar_karp``)."""

    def __init__(self, parts: list[_Part]) -> None:
        self.parts = sorted(parts, key=_Part.key, reverse=True)

    @property
    def spread(self) -> int:
        return self.parts[0].total - self.parts[-1].total

    def __lt__(self, other: _State) -> bool:
        if self.spread != other.spread:
            return self.spread > other.spread
        return self.parts[0].key() > other.parts[0].key()

    def merge(self, other: _State) -> None:
        k = len(self.parts)
        for i, part in enumerate(self.parts):
            for idx, value in other.parts[k - 1 - i].items:
                part.items.append((idx, value))
                part.total += value
        self.parts = sorted(self.parts, key=_Part.key, reverse=True)


def balanced_partitions(values: list[int], k: int, equal_size: bool = True) -> list[list[int]]:
    """``k`` partitions of ``range(len(values))`` balanced by ``values`` with the
    largest-differencing method (Karmarkar-Karp), each partition's indices ascending, as
    verl's ``get_seqlen_balanced_partitions(values, k, equal_size)`` returns them;
    ``equal_size``: each of ``len(values) / k`` items."""
    if k < 1 or k > len(values) or (equal_size and len(values) % k):
        raise InvalidTrialSpec(f"{len(values)} sequences do not split into {k} partitions")
    ranked = sorted((value, i) for i, value in enumerate(values))
    heap: list[_State] = []
    if equal_size:
        for start in range(0, len(ranked), k):
            chunk = ranked[start : start + k]
            heapq.heappush(heap, _State([_Part(v, [(i, v)]) for v, i in chunk]))
    else:
        for v, i in ranked:
            heapq.heappush(heap, _State([_Part(v, [(i, v)])] + [_Part() for _ in range(k - 1)]))
    while len(heap) > 1:
        first, second = heapq.heappop(heap), heapq.heappop(heap)
        first.merge(second)
        heapq.heappush(heap, first)
    return [sorted(idx for idx, _ in part.items) for part in heap[0].parts]


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
