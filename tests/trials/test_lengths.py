"""The trial draws its own batch from the spec's distributions and seed (``trials.lengths``)."""

from __future__ import annotations

import dataclasses

import pytest

from trials import run_trial
from trials.errors import InvalidTrialSpec
from trials.lengths import drawn
from trials.types import BatchDraw, TrialSpec

from .trial_helpers import make_spec


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
    assert spec.prompt_lengths == spec.train_prompt_lengths[:16]
    assert min(spec.train_response_lengths) >= 1 and max(spec.train_response_lengths) <= 40
    assert max(spec.train_prompt_lengths) <= 32  # the cap cuts the uniform's tail
    groups = [spec.train_prompt_lengths[i : i + 4] for i in range(0, 32, 4)]
    assert all(len(set(g)) == 1 for g in groups)  # the n samples of a prompt share it
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
