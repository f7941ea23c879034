from __future__ import annotations

import pytest
from trial_helpers import make_spec

from trials.step import STEP_COMPONENTS, step_components, step_metrics


def test_both_phases_add_rollout_makespan_and_train_sub_phases(tiny_config):
    spec = make_spec(tiny_config, n_gpus=8, rollout_replicas=4)
    metrics = {
        "rollout_makespan_s": 10.0,
        "rollout_prompt_tokens": 1.0,
        "rollout_generated_tokens": 1.0,
    }
    timings = {"old_log_prob": 1.0, "ref_log_prob": 2.0, "update_actor": 3.0}
    step = step_metrics(spec, metrics, timings)
    rank_tokens = sum(spec.train_prompt_lengths) + sum(spec.train_response_lengths)
    assert step["step_time_s"] == pytest.approx(16.0)
    assert step["step_tokens"] == rank_tokens * 8
    assert step["throughput_tokens_per_s_per_gpu"] == pytest.approx(rank_tokens * 8 / 16.0 / 8)


def test_rollout_only_counts_every_replica(tiny_config):
    spec = make_spec(tiny_config, phases=["rollout"], n_gpus=8, rollout_replicas=4)
    metrics = {
        "rollout_makespan_s": 5.0,
        "rollout_prompt_tokens": 300.0,
        "rollout_generated_tokens": 700.0,
    }
    step = step_metrics(spec, metrics, {})
    assert step == {
        "step_time_s": 5.0,
        "step_tokens": 4000.0,
        "throughput_tokens_per_s_per_gpu": 4000.0 / 5.0 / 8,
    }


def test_train_only_has_no_rollout_term(tiny_config):
    spec = make_spec(tiny_config, phases=["train"], n_gpus=2)
    timings = {"old_log_prob": 1.0, "update_actor": 3.0}  # no reference model
    step = step_metrics(spec, {"rollout_makespan_s": 99.0}, timings)
    assert step["step_time_s"] == pytest.approx(4.0)


def test_nothing_measured_gives_no_step(tiny_config):
    assert step_metrics(make_spec(tiny_config), {}, {}) == {}


def test_the_engine_hand_over_and_the_actor_moves_are_part_of_the_step(tiny_config):
    spec = make_spec(tiny_config, n_gpus=2, rollout_replicas=2)
    metrics = {"rollout_makespan_s": 10.0, "engine_startup_s": 30.0}
    timings = {
        "startup": 30.0,  # once per trial: not a step's cost
        "rollout": 10.0,
        "engine_sleep": 0.5,
        "old_log_prob": 1.0,
        "ref_log_prob": 2.0,
        "update_actor": 3.0,
        "actor_reload": 0.25,
        "engine_wake": 0.75,
        "weight_sync": 0.5,
    }
    parts = step_components(spec, metrics, timings)
    assert list(parts) == list(STEP_COMPONENTS)
    assert parts["rollout"] == 10.0
    step = step_metrics(spec, metrics, timings)
    assert step["step_time_s"] == pytest.approx(18.0)
    assert step["step_time_s"] == pytest.approx(sum(timings.values()) - timings["startup"])


def test_train_only_leaves_out_the_engines_parts(tiny_config):
    spec = make_spec(tiny_config, phases=["train"])
    timings = {"engine_wake": 5.0, "old_log_prob": 1.0, "update_actor": 3.0, "actor_reload": 0.5}
    assert step_components(spec, {}, timings) == {
        "old_log_prob": 1.0,
        "update_actor": 3.0,
        "actor_reload": 0.5,
    }
