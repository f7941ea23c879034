"""The CPU memory cap is a real allocation limit: too much for it is ``oom`` in its phase."""

from __future__ import annotations

import pytest
from trial_helpers import make_spec

from trials.launcher import launch_trial
from trials.types import TrainKnobs

CAP_GIB = 0.25


def capped_spec(config, trial_id, ppo_micro, log_prob_micro):
    # 64 sequences of 1000 tokens: one micro-batch of all 64 needs well over 0.25 GiB.
    return make_spec(
        config,
        trial_id=trial_id,
        requests=64,
        phases=["train"],
        device_memory_cap_gib=CAP_GIB,
        train_prompt_lengths=[500] * 64,
        train_response_lengths=[500] * 64,
        local_mini_batch_size=64,
        train=TrainKnobs(
            ppo_micro_batch_size_per_gpu=ppo_micro,
            log_prob_micro_batch_size_per_gpu=log_prob_micro,
            ref_log_prob_micro_batch_size_per_gpu=1,
        ),
    )


@pytest.mark.parametrize(
    ("ppo_micro", "log_prob_micro", "phase"),
    [(64, 1, "update_actor"), (1, 64, "old_log_prob")],
)
def test_micro_batch_too_large_for_the_cap_is_oom(tiny_config, ppo_micro, log_prob_micro, phase):
    spec = capped_spec(tiny_config, f"oom-{phase}", ppo_micro, log_prob_micro)
    result = launch_trial(spec, timeout_s=300)  # a deadline a loaded machine meets too
    assert (result.status, result.phase) == ("oom", phase), result.error_message
    assert "DefaultCPUAllocator: can't allocate memory" in result.error_message
    assert "step_time_s" not in result.metrics


def test_small_micro_batches_fit_under_the_same_cap(tiny_config):
    result = launch_trial(capped_spec(tiny_config, "fits", 1, 1), timeout_s=300)  # ~15 s alone
    assert result.status == "ok", result.error_message
    assert 0 < result.metrics["train_peak_memory_gib"] < 2 * CAP_GIB


@pytest.mark.parametrize(
    ("ppo_micro", "log_prob_micro", "phase"), [(64, 1, "update_actor"), (1, 64, "old_log_prob")]
)
def test_the_train_probe_finds_the_oom_before_the_engine_starts(
    tiny_config, ppo_micro, log_prob_micro, phase
):
    spec = capped_spec(tiny_config, f"probe-{phase}", ppo_micro, log_prob_micro)
    spec.phases = ["rollout", "train"]
    spec.rollout.engine = "no-such-engine"  # it must never be reached
    spec.train_probe = True
    result = launch_trial(spec, timeout_s=120)
    assert (result.status, result.phase) == ("oom", phase), result.error_message
    assert "DefaultCPUAllocator: can't allocate memory" in result.error_message
    assert "actor_ready_at_s" in result.metrics
    assert "engine_start_at_s" not in result.metrics and "rollout_makespan_s" not in result.metrics


def test_without_the_probe_the_same_trial_goes_on_to_the_engine(tiny_config):
    spec = capped_spec(tiny_config, "no-probe", 64, 1)
    spec.phases = ["rollout", "train"]
    spec.rollout.engine = "no-such-engine"
    result = launch_trial(spec, timeout_s=120)
    assert (result.status, result.phase) == ("error", "startup"), result.error_message
    assert "no-such-engine" in result.error_message
