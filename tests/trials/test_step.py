from __future__ import annotations

import pytest
from trial_helpers import make_spec

from trials.step import (
    STEP_COMPONENTS,
    as_verl_timers,
    complete_step,
    replay_poll_wait_s,
    step_components,
    step_metrics,
)


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
    # verl's trainer sees the 5 s rollout at its replay buffer's poll at 6 s.
    assert step == {
        "step_time_s": 6.0,
        "step_tokens": 4000.0,
        "throughput_tokens_per_s_per_gpu": 4000.0 / 6.0 / 8,
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


@pytest.mark.parametrize(
    ("rollout_s", "wait_s"), [(0.0, 0.0), (4.0, 0.0), (4.001, 1.999), (5.0, 1.0), (13.04, 0.96), (23.9, 0.1)]
)
def test_verl_sees_a_rollout_at_its_replay_buffers_next_two_second_poll(rollout_s, wait_s):
    assert replay_poll_wait_s(rollout_s) == pytest.approx(wait_s)


def test_a_completed_step_holds_the_poll_and_its_time_is_the_parts_sum(tiny_config):
    spec = make_spec(tiny_config, n_gpus=2, rollout_replicas=2)
    metrics = {"rollout_makespan_s": 9.5}
    timings = {"startup": 30.0, "weight_sync": 0.5, "rollout": 9.5, "old_log_prob": 1.0, "update_actor": 3.0}
    complete_step(spec, metrics, timings)
    assert timings["rollout_poll"] == pytest.approx(0.5)
    assert metrics["step_time_s"] == pytest.approx(sum(timings.values()) - timings["startup"])
    assert metrics["step_time_s"] == pytest.approx(0.5 + 10.0 + 1.0 + 3.0)


def test_a_trials_parts_as_verls_timers_time_them():
    timers = as_verl_timers({"weight_sync": 0.4, "rollout": 13.04, "old_log_prob": 9.0, "actor_reload": 1.0})
    # gen is the rollout and its poll (derived where a trial recorded none); no ref measured.
    assert timers == pytest.approx(
        {"timing_s/update_weights": 0.4, "timing_s/gen": 14.0, "timing_s/old_log_prob": 9.0}
    )
    recorded = as_verl_timers({"rollout": 13.04, "rollout_poll": 0.96, "update_actor": 2.0})
    assert recorded == pytest.approx({"timing_s/gen": 14.0, "timing_s/update_actor": 2.0})
    # verl's update_weights wakes the engine too: the sync and the hand-over together.
    woken = as_verl_timers({"weight_sync": 0.4, "engine_wake": 0.5, "rollout": 1.0})
    assert woken["timing_s/update_weights"] == pytest.approx(0.9)
    # verl's gen ends once the engine is asleep (its on_sample_end): the trial's sleep is in it.
    slept = as_verl_timers({"rollout": 13.04, "rollout_poll": 0.96, "engine_sleep": 0.25})
    assert slept["timing_s/gen"] == pytest.approx(14.25)
    assert "timing_s/update_weights" not in as_verl_timers({"engine_wake": 0.5, "rollout": 1.0})
