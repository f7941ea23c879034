"""The service never builds a list per request: a trial spec carries the job's length
distributions, seed and counts, the trial process draws its batch (the same batch for the
same seed), and the memory model plans from summary statistics in bounded work."""

from __future__ import annotations

import json
import time
import tracemalloc
from collections import Counter
from typing import Any

import numpy as np
import optuna
import pytest

from autotuner.knobs import A, R
from autotuner.lengthstats import StepLengths, VerlOrder
from autotuner.memory import MemoryModel
from autotuner.space import SearchSpace
from autotuner.spec import MAX_REQUESTS_PER_STEP, JobSpec, parse_job_spec
from autotuner.trialspec import build_trial_spec
from trials import run_trial
from trials.lengths import drawn, verl_batch_order
from trials.ranks import rank_spec
from trials.types import TrialSpec

# A dataset's measured response lengths, as a `list` distribution (the largest kind of spec).
MEASURED = [int(v) for v in np.random.default_rng(7).lognormal(np.log(400), 0.7, 300_000).clip(1, 4096)]


def _job(train_batch_size: int, n: int, gpus: int = 1, **workload: Any) -> JobSpec:
    return parse_job_spec(
        {
            "workload": {
                "model": "qwen2.5-1.5b",
                "prompt_length": {"kind": "normal", "mean": 300, "std": 80, "min": 16},
                "response_length": {"kind": "list", "values": MEASURED},
                "max_prompt_length": 512,
                "max_response_length": 4096,
                "train_batch_size": train_batch_size,
                "ppo_mini_batch_size": train_batch_size,
                "n": n,
                **workload,
            },
            "cluster": {"device": "cuda", "n_gpus_per_node": gpus},
            "seed": 5,
        }
    )


def _configs(spec: JobSpec, count: int) -> list[dict[str, Any]]:
    """``count`` configs the space proposes (dynamic batches and fixed micro-batches)."""
    space = SearchSpace.build(spec, spec.validate_model(), "cuda")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    return [space.suggest(study.ask()).config for _ in range(count)]


def _plan(spec: JobSpec, configs: list[dict[str, Any]]) -> list[float]:
    model = MemoryModel(spec, spec.validate_model(), "cuda", 80.0)
    return [model.predict(config).peak_gib for config in configs]


def test_a_trial_spec_carries_the_distributions_not_a_list_per_request() -> None:
    small, largest = _job(8, 2), _job(16_384, 16)
    assert largest.workload.train_batch_size * largest.workload.n == MAX_REQUESTS_PER_STEP
    config = {R + "max_model_len": 4608, A + "ppo_micro_batch_size_per_gpu": 4}
    sent = {
        name: json.loads(build_trial_spec(s, s.validate_model(), config, "t", "cuda", None).to_json())
        for name, s in (("small", small), ("largest", largest))
    }
    for data in sent.values():
        for key in ("prompt_lengths", "response_lengths", "train_prompt_lengths", "train_response_lengths"):
            assert data[key] == []
        # The measured lengths as the spec keeps them: each distinct length and its count.
        sent_lengths = data["batch"]["response_length"]
        assert dict(zip(sent_lengths["values"], sent_lengths["counts"], strict=True)) == Counter(MEASURED)
    assert sent["largest"]["batch"]["train_sequences"] == MAX_REQUESTS_PER_STEP
    # What goes over does not grow with the step: only the counts' digits differ.
    size = {name: len(json.dumps(data)) for name, data in sent.items()}
    assert abs(size["largest"] - size["small"]) < 64, size


def test_a_spec_at_the_caps_validates_and_plans_within_a_second_in_bounded_memory() -> None:
    raw = _job(16_384, 16).model_dump(mode="json")
    started = time.monotonic()
    largest = parse_job_spec(raw)
    configs = _configs(largest, 20)
    peaks = _plan(largest, configs)
    elapsed = time.monotonic() - started
    assert elapsed < 1.0, elapsed
    assert all(p > 0 for p in peaks)
    # The planning's memory does not grow with the step (262,144 requests against 16): one
    # Python list of the step's lengths alone would take 262,144 * 8 bytes of pointers.
    small = _job(8, 2)
    measured = {}
    for name, spec in (("small", small), ("largest", largest)):
        chosen = _configs(spec, 5)
        tracemalloc.start()
        _plan(spec, chosen)
        measured[name] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert measured["largest"] - measured["small"] < MAX_REQUESTS_PER_STEP * 8 / 4, measured


def test_the_trial_draws_the_batch_its_seed_gives_each_share_a_prefix_of_the_step() -> None:
    spec = _job(64, 4, gpus=4)
    w = spec.workload
    # The contract every recorded job was measured on: one generator seeded with the job's
    # seed draws the prompts, then every request's response; each prompt serves n requests.
    rng = np.random.default_rng(spec.seed)
    prompts = w.prompt_length.draw(w.train_batch_size, rng, w.max_prompt_length)
    responses = w.response_length.draw(w.train_batch_size * w.n, rng, w.max_response_length)
    step_prompts = [p for p in prompts for _ in range(w.n)]
    arch = spec.validate_model()
    config = {R + "max_model_len": 4608, R + "tensor_model_parallel_size": 2}
    trial = drawn(build_trial_spec(spec, arch, config, "t", "cuda", None))
    assert trial.batch is None
    # One replica of TP 2 in a world of 4: half the requests; its 2 ranks' train shares, the
    # step's sequences in the order verl hands them to the world's 4 ranks.
    assert trial.prompt_lengths == step_prompts[:128] and trial.response_lengths == responses[:128]
    order = verl_batch_order(step_prompts, responses, 4)
    assert trial.train_prompt_lengths == [step_prompts[i] for i in order[:128]]
    assert trial.train_response_lengths == [responses[i] for i in order[:128]]
    assert rank_spec(trial, 1).train_response_lengths == [responses[i] for i in order[64:128]]
    again = drawn(build_trial_spec(spec, arch, config, "u", "cuda", None))
    assert again.response_lengths == trial.response_lengths
    other = drawn(build_trial_spec(spec.model_copy(update={"seed": 6}), arch, config, "v", "cuda", None))
    assert other.response_lengths != trial.response_lengths


@pytest.mark.parametrize("k", [1, 4, 16, 64])
def test_the_statistics_expect_the_largest_micro_batch_trials_draw(k) -> None:
    # Micro-batches of k consecutive sequences of a rank's 2,048 (256 prompts x 8 samples,
    # the responses a long-tailed measured list) in verl's order: the statistics' expected
    # largest against the mean of the largest the trials of eight seeds drew.
    spec = _job(256, 8)
    stats = StepLengths.of(spec.workload)
    order = VerlOrder.of(spec.workload)
    arch = spec.validate_model()
    largest, means = [], []
    for seed in range(8):
        trial = build_trial_spec(
            spec.model_copy(update={"seed": seed}), arch, {R + "max_model_len": 4608}, "t", "cuda", None
        )
        drawn_trial = drawn(trial)
        lengths = np.add(drawn_trial.train_prompt_lengths, drawn_trial.train_response_lengths)
        largest.append(lengths.reshape(-1, k).sum(axis=1).max())
        means.append(lengths.mean())
    assert stats.mean == pytest.approx(np.mean(means), rel=0.02)
    assert order.largest_run(k, 2048 // k) == pytest.approx(np.mean(largest), rel=0.08)


def test_a_trial_the_service_built_draws_its_batch_and_trains_on_it() -> None:
    spec = parse_job_spec(
        {
            "workload": {
                "model": "tiny",
                "prompt_length": {"kind": "uniform", "low": 16, "high": 48},
                "response_length": {"kind": "lognormal", "median": 24, "sigma": 0.5, "max": 64},
                "max_prompt_length": 48,
                "max_response_length": 64,
                "train_batch_size": 8,
                "ppo_mini_batch_size": 4,
                "n": 2,
                "phases": "train",
            },
            "cluster": {"device": "cpu"},
            "seed": 3,
        }
    )
    config = {R + "max_model_len": 112, A + "ppo_micro_batch_size_per_gpu": 4}
    sent = build_trial_spec(spec, spec.validate_model(), config, "drawn", "cpu", 4.0)
    received = TrialSpec.from_json(sent.to_json())
    assert received.train_prompt_lengths == []
    result = run_trial(received)
    assert result.ok, result.error_message
    expected = drawn(received)
    tokens = sum(expected.train_prompt_lengths) + sum(expected.train_response_lengths)
    assert result.metrics["step_tokens"] == tokens and len(expected.train_prompt_lengths) == 16
