"""``run_trial`` in this process: it never raises."""

from __future__ import annotations

import pytest
from trial_helpers import make_spec

from trials import run_trial


def test_train_only_trial_composes_its_step(tiny_config):
    spec = make_spec(tiny_config, phases=["train"], n_gpus=4)
    progress = []
    result = run_trial(spec, on_progress=lambda r: progress.append(r.phase))
    assert result.status == "ok", result.error_message
    assert progress == ["startup", "old_log_prob", "ref_log_prob", "update_actor"]
    t = result.phase_timings_s
    assert set(t) == {"old_log_prob", "ref_log_prob", "update_actor", "actor_reload"}
    assert result.metrics["step_time_s"] == pytest.approx(sum(t.values()))
    assert result.metrics["train_peak_memory_gib"] > 0
    assert result.device.startswith("cpu: ") and result.hostname
    # One rank of verl's 4-GPU FSDP world, sharded as there (fake collectives).
    assert result.metrics["actor_fsdp_world_size"] == 4
    assert result.metrics["actor_master_dtype_bits"] == 32


def test_unknown_engine_becomes_an_error_result(tiny_config):
    spec = make_spec(tiny_config, phases=["rollout"])
    spec.rollout.engine = "tgi"
    result = run_trial(spec)
    assert (result.status, result.phase, result.error_type) == (
        "error",
        "startup",
        "UnknownBackend",
    )
    assert "valid engines: sglang, vllm" in result.error_message
    assert "UnknownBackend" in result.log_tail  # the traceback was captured


def test_inconsistent_spec_is_refused_before_any_phase(tiny_config):
    spec = make_spec(tiny_config, response_lengths=[8])
    result = run_trial(spec)
    assert (result.status, result.phase, result.error_type) == ("error", None, "InvalidTrialSpec")


def test_an_engine_side_alone_needs_the_actor_beside_it(tiny_config):
    spec = make_spec(tiny_config, phases=["rollout"], engine_side_only=True)
    result = run_trial(spec)
    assert (result.status, result.phase, result.error_type) == ("error", None, "InvalidTrialSpec")
    assert "engine_side_only" in result.error_message and "['rollout', 'train']" in result.error_message
    # Nor with another trial's rollout taken over: it would measure nothing at all.
    spec = make_spec(
        tiny_config, engine_side_only=True, reused_rollout={"trial": 0, "metrics": {}, "timings": {}}
    )
    result = run_trial(spec)
    assert (result.status, result.error_type) == ("error", "InvalidTrialSpec")
    assert "would measure nothing" in result.error_message


def test_a_request_longer_than_max_model_len_is_refused(tiny_config):
    spec = make_spec(tiny_config)
    spec.rollout.max_model_len = 64
    result = run_trial(spec)
    assert result.status == "error" and "Raise max_model_len" in result.error_message


def test_verls_fsdp1_strategy_needs_a_gpu_and_says_so(tiny_config):
    spec = make_spec(tiny_config, phases=["train"], n_gpus=2)
    spec.train.strategy = "fsdp"
    result = run_trial(spec)
    assert (result.status, result.error_type) == ("error", "TrialEnvironmentError")
    assert "strategy=fsdp" in result.error_message and "fsdp2" in result.error_message


@pytest.mark.parametrize(
    ("strategy", "param_offload", "says"),
    [
        ("fsdp3", False, "actor strategy must be one of"),
        ("fsdp", True, "param_offload=True with strategy fsdp"),
    ],
)
def test_an_actor_strategy_the_trial_does_not_measure_is_refused(tiny_config, strategy, param_offload, says):
    spec = make_spec(tiny_config, phases=["train"])
    spec.train.strategy, spec.train.param_offload = strategy, param_offload
    result = run_trial(spec)
    assert (result.status, result.error_type) == ("error", "InvalidTrialSpec")
    assert says in result.error_message
