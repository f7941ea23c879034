from __future__ import annotations

import json
import random
import subprocess

import pytest

from trials.batching import (
    balanced_partitions,
    evenly_spaced,
    fixed_size,
    log_prob_plan,
    token_budget,
    update_plan,
)
from trials.errors import ConfigRejected

from .verl_helpers import verl_python


def test_fixed_size_groups_consecutive_sequences():
    assert fixed_size(list(range(10)), 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_token_budget_uses_ceil_total_over_budget_balanced_groups():
    lengths = [100, 90, 80, 70, 60, 50, 40, 30]  # 520 tokens
    groups = token_budget(list(range(8)), lengths, 200, "knob")
    assert len(groups) == 3  # ceil(520 / 200)
    assert sorted(i for g in groups for i in g) == list(range(8))
    loads = [sum(lengths[i] for i in g) for g in groups]
    assert max(loads) <= 200 and max(loads) - min(loads) <= max(lengths)  # balanced


def test_token_budget_adds_groups_until_each_fits():
    """Three groups for 300 tokens at 100 cannot hold 60 + 60 + 60 + 60 + 60 (two of them
    would hold 120): verl adds a group until every one fits, and so does the trial."""
    lengths = [60] * 5
    groups = token_budget(list(range(5)), lengths, 100, "knob")
    assert len(groups) == 5
    assert max(sum(lengths[i] for i in g) for g in groups) <= 100


def test_token_budget_rejects_a_sequence_longer_than_the_budget():
    with pytest.raises(ConfigRejected, match="ppo_max_token_len_per_gpu=100"):
        token_budget([0, 1], [50, 150], 100, "ppo_max_token_len_per_gpu")


def test_update_plan_steps_once_per_mini_batch():
    plan = update_plan([10] * 10, mini_batch_size=4, micro_batch_size=3, dynamic=False, max_tokens=0)
    assert [mb.indices for mb in plan] == [(0, 1, 2), (3,), (4, 5, 6), (7,), (8, 9)]
    assert [mb.ends_mini_batch for mb in plan] == [False, True, False, True, True]


def test_dynamic_update_plan_stays_within_mini_batches():
    lengths = [30, 10, 20, 40, 50, 60]
    plan = update_plan(lengths, mini_batch_size=3, micro_batch_size=1, dynamic=True, max_tokens=60)
    assert plan[0].indices == (0, 1, 2) and plan[0].ends_mini_batch  # 60 tokens: one group
    assert sorted(mb.indices for mb in plan[1:]) == [(3,), (4,), (5,)]  # 150 tokens: three
    assert [mb.ends_mini_batch for mb in plan] == [True, False, False, True]


def test_log_prob_plan_covers_every_sequence_once():
    plan = log_prob_plan([5, 6, 7, 8, 9], micro_batch_size=2, dynamic=False, max_tokens=0, knob="k")
    assert [i for mb in plan for i in mb.indices] == [0, 1, 2, 3, 4]


def test_evenly_spaced_includes_both_ends():
    assert evenly_spaced(10, 4) == [0, 3, 6, 9]
    assert evenly_spaced(3, 8) == [0, 1, 2]
    assert evenly_spaced(5, 1) == [0]


_VERL_CUT = """
import json, sys
import torch
from tensordict import TensorDict
from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions, rearrange_micro_batches
cases = json.loads(sys.stdin.read())
out = []
for lengths, budget, k in cases:
    rows = [torch.zeros(n, dtype=torch.long) for n in lengths]
    ids = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
    _, cut = rearrange_micro_batches(TensorDict({"input_ids": ids}, batch_size=[len(lengths)]), budget)
    loose = get_seqlen_balanced_partitions(lengths, k, equal_size=False)
    out.append([[list(map(int, g)) for g in cut], loose])
print(json.dumps(out))
"""


def test_dynamic_micro_batches_and_loose_partitions_are_verls_own() -> None:
    # verl 0.9.1's rearrange_micro_batches (one rank) and its partitions of unequal sizes, in
    # verl's environment, against the trial's on the same lengths: long-tailed, with ties.
    rng = random.Random(7)
    cases = []
    for _ in range(40):
        lengths = [
            rng.choice([rng.randint(1, 3000), rng.randint(1, 40), 500]) for _ in range(rng.randint(2, 90))
        ]
        budget = max(lengths) + rng.choice([0, 10, 2000, 9000])
        cases.append((lengths, budget, rng.randint(1, len(lengths))))
    out = subprocess.run(
        [verl_python(), "-c", _VERL_CUT], input=json.dumps(cases), capture_output=True, text=True, check=True
    )
    for (lengths, budget, k), (cut, loose) in zip(cases, json.loads(out.stdout), strict=True):
        assert token_budget(list(range(len(lengths))), lengths, budget, "knob") == cut
        assert balanced_partitions(lengths, k, equal_size=False) == loose
    # A mini-batch's sequences are cut as the same lengths alone, and named by their indices.
    lengths, budget = cases[0][0], cases[0][1]
    mini = list(range(100, 100 + len(lengths)))
    padded = [1] * 100 + lengths
    cut = json.loads(out.stdout)[0][0]
    assert token_budget(mini, padded, budget, "knob") == [[100 + j for j in g] for g in cut]
