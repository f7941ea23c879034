"""The trial draws its own batch from the spec's distributions and seed (``trials.lengths``)."""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
from pathlib import Path

import pytest

from autotuner.spec import load_job_spec
from trials import run_trial
from trials.batching import update_plan
from trials.errors import InvalidTrialSpec
from trials.lengths import balanced_partitions, drawn, steps_lengths, verl_batch_order, verl_workload
from trials.types import BatchDraw, TrialSpec

from .trial_helpers import make_spec
from .verl_helpers import verl_python

REPO = Path(__file__).resolve().parents[2]


def _batch(**changes) -> BatchDraw:
    batch = BatchDraw(
        prompt_length={"kind": "uniform", "low": 16, "high": 48},
        response_length={"kind": "lognormal", "median": 20, "sigma": 0.5, "min": 1, "max": 40},
        max_prompt_length=32,
        max_response_length=40,
        prompts=8,
        samples_per_prompt=4,
        seed=11,
        rollout_requests=16,
        train_sequences=32,
    )
    return dataclasses.replace(batch, **changes)


def test_a_drawn_spec_holds_its_shares_of_one_step_capped_and_grouped_by_prompt() -> None:
    spec = drawn(TrialSpec.from_json(TrialSpec("t", "tiny", {}, batch=_batch()).to_json()))
    assert spec.batch is None
    assert len(spec.prompt_lengths) == len(spec.response_lengths) == 16
    assert len(spec.train_prompt_lengths) == 32
    assert min(spec.train_response_lengths) >= 1 and max(spec.train_response_lengths) <= 40
    assert max(spec.train_prompt_lengths) <= 32  # the cap cuts the uniform's tail
    # The rollout's requests in the prompts' order: the n samples of a prompt share it.
    groups = [spec.prompt_lengths[i : i + 4] for i in range(0, 16, 4)]
    assert all(len(set(g)) == 1 for g in groups)
    whole = drawn(TrialSpec("w", "tiny", {}, batch=_batch(rollout_requests=32)))
    # The train share is the same step's sequences, each its prompt's and response's.
    pairs = sorted(zip(whole.prompt_lengths, whole.response_lengths, strict=True))
    assert sorted(zip(spec.train_prompt_lengths, spec.train_response_lengths, strict=True)) == pairs
    assert drawn(spec) is spec  # drawn once
    again = drawn(TrialSpec("u", "tiny", {}, batch=_batch()))
    assert again.train_response_lengths == spec.train_response_lengths
    other = drawn(TrialSpec("v", "tiny", {}, batch=_batch(seed=12)))
    assert other.train_response_lengths != spec.train_response_lengths


@pytest.mark.parametrize(
    ("change", "phrase"),
    [
        ({"prompt_length": {"kind": "zipf"}}, "unknown length distribution kind 'zipf'"),
        ({"response_length": {"kind": "normal", "mean": 20}}, "KeyError"),
        ({"prompts": 0}, "batch.prompts (0)"),
    ],
)
def test_a_batch_that_cannot_be_drawn_fails_the_trial_naming_why(tiny_config, change, phrase) -> None:
    with pytest.raises(InvalidTrialSpec, match=phrase.replace("(", r"\(").replace(")", r"\)")):
        drawn(TrialSpec("t", "tiny", {}, batch=_batch(**change)))
    result = run_trial(make_spec(tiny_config, phases=["train"], batch=_batch(**change)))
    assert result.status == "error" and result.error_type == "InvalidTrialSpec", result
    assert phrase in (result.error_message or "")


def test_one_ranks_train_sequences_come_shorter_half_first_then_the_longer_half_in_prompt_order() -> None:
    whole = drawn(TrialSpec("w", "tiny", {}, batch=_batch(rollout_requests=32)))
    spec = drawn(TrialSpec("t", "tiny", {}, batch=_batch()))
    responses = whole.response_lengths
    first, second = spec.train_response_lengths[:16], spec.train_response_lengths[16:]
    assert first == sorted(first)  # as the rollout finished them, shortest first
    assert max(first) <= min(second)  # the shorter half, then the longer half
    order = verl_batch_order(whole.prompt_lengths, responses)
    assert sorted(order) == list(range(32))
    assert order[16:] == sorted(order[16:])  # the longer half in the prompts' order
    assert spec.train_response_lengths == [responses[i] for i in order]
    assert second != sorted(second)  # which is not the order of its lengths


def test_a_world_of_ranks_takes_balanced_shares_each_in_the_batchs_order() -> None:
    whole = drawn(TrialSpec("w", "tiny", {}, batch=_batch(rollout_requests=32)))
    prompts, responses = whole.prompt_lengths, whole.response_lengths
    replay = verl_batch_order(prompts, responses)
    order = verl_batch_order(prompts, responses, 4)
    assert sorted(order) == list(range(32))
    position = {seq: k for k, seq in enumerate(replay)}
    work = []
    for r in range(4):
        share = order[8 * r : 8 * r + 8]
        assert [position[i] for i in share] == sorted(position[i] for i in share)
        work.append(sum(verl_workload(prompts[i] + responses[i]) for i in share))
    one_sequence = max(verl_workload(p + q) for p, q in zip(prompts, responses, strict=True))
    assert max(work) - min(work) < one_sequence
    # A trial's share of two of the four ranks: their partitions, rank 0's first.
    spec = drawn(TrialSpec("t", "tiny", {}, batch=_batch(train_sequences=16, train_ranks=4)))
    assert spec.train_response_lengths == [responses[i] for i in order[:16]]
    with pytest.raises(InvalidTrialSpec, match="train_ranks must be >= 1"):
        drawn(TrialSpec("t", "tiny", {}, batch=_batch(train_ranks=0)))


_VERL_PARTITIONS = """
import json, sys
from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions
cases = json.loads(sys.stdin.read())
print(json.dumps([get_seqlen_balanced_partitions(v, k, equal_size=True) for v, k in cases]))
"""


def test_the_ranks_partitions_are_verls_own() -> None:
    # verl's get_seqlen_balanced_partitions in verl's environment, on workloads with ties
    # (short sequences repeat) and without, against the trial's.
    rng = random.Random(3)
    cases = []
    for _ in range(60):
        k = rng.choice([2, 3, 4, 8])
        lengths = [
            rng.choice([rng.randint(1, 4000), rng.randint(1, 20)]) for _ in range(k * rng.randint(1, 24))
        ]
        cases.append(([verl_workload(n) for n in lengths], k))
    out = subprocess.run(
        [verl_python(), "-c", _VERL_PARTITIONS],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        check=True,
    )
    assert [balanced_partitions(v, k) for v, k in cases] == json.loads(out.stdout)
    with pytest.raises(InvalidTrialSpec, match="10 sequences do not split into 4"):
        balanced_partitions(list(range(10)), 4)


def test_verls_order_cuts_dynamic_mini_batches_as_verls_traced_steps_did() -> None:
    # verl's traced update of the Qwen2.5-1.5B job at 32 prompts x 8 (dynamic batches of
    # 16,384 tokens, mini-batches of 64): each step's micro-batches per mini-batch, against
    # the trial's cut of the same step's lengths in verl's order, and in the prompts' order,
    # whose first mini-batches are not the short ones.
    data = json.loads((REPO / "benchmarks/results/verl-qwen2.5-1.5b-h200x4-layouts.json").read_text())
    (verl,) = [r for r in data["run"]["runs"] if r["config"] == "dyn16384" and r["kind"] == "verl"]
    updates = [
        t["micro_batches"]
        for t in verl["trace"]
        if t["call"] == "forward_backward_batch" and not t["forward_only"]
    ]
    w = data["run"]["workload"]
    seed = load_job_spec(REPO / data["run"]["job"]).seed
    caps = w["max_prompt_length"], w["max_response_length"]
    draw = BatchDraw(w["prompt_length"], w["response_length"], *caps, 32, 8, seed, 256, 256)
    prompts, responses = steps_lengths(draw, 4)
    for step in range(4):
        p = [prompts[step * 32 + i // 8] for i in range(256)]
        r = [x for group in responses[step * 32 : (step + 1) * 32] for x in group]
        cuts = {}
        for name, order in (("verl", verl_batch_order(p, r)), ("prompts", list(range(256)))):
            plan = update_plan([p[i] + r[i] for i in order], 64, 1, True, 16384)
            ends = [k for k, mb in enumerate(plan) if mb.ends_mini_batch]
            cuts[name] = [b - a for a, b in zip([-1, *ends[:-1]], ends, strict=True)]
        assert cuts["verl"] == updates[4 * step : 4 * step + 4] == [3, 3, 5, 5]
        assert cuts["prompts"][:2] != [3, 3]  # no short mini-batches first
