"""A trial whose engine would see what an earlier trial's saw takes that rollout over: it
starts no engine and only trains, and its step is composed from both. What decides that, here;
a real job's second trial taking the first's rollout over: tests/autotuner/test_cli.py."""

from __future__ import annotations

from autotuner.knobs import A, R
from autotuner.replay import engine_seconds
from autotuner.study import rollout_key
from trials.types import TrialResult


def test_the_rollout_key_is_the_rollout_knobs_and_the_actor_offload():
    base = {
        R + "gpu_memory_utilization": 0.5,
        R + "max_num_seqs": 256,
        A + "ppo_micro_batch_size_per_gpu": 4,
        A + "fsdp_config.param_offload": False,
        "actor_rollout_ref.model.enable_gradient_checkpointing": True,
    }
    same = base | {
        A + "ppo_micro_batch_size_per_gpu": 2,
        "actor_rollout_ref.model.enable_gradient_checkpointing": False,
    }
    assert rollout_key(same) == rollout_key(base)
    assert rollout_key(base | {R + "max_num_seqs": 128}) != rollout_key(base)
    # Offloading the actor changes what is resident beside the engine when it starts.
    assert rollout_key(base | {A + "fsdp_config.param_offload": True}) != rollout_key(base)


def test_engine_seconds_are_the_span_from_engine_start_to_training():
    run = TrialResult("t", "ok", metrics={"engine_start_at_s": 5.0, "train_start_at_s": 47.5})
    assert engine_seconds(run) == 42.5
    assert engine_seconds(TrialResult("t", "ok")) == 0.0
