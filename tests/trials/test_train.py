"""The train phase in this process on the tiny model (no engine)."""

from __future__ import annotations

import pytest
from trial_helpers import make_spec

from trials.errors import ConfigRejected
from trials.phases import phase_of
from trials.train import run_train


def test_train_measures_every_sub_phase(tiny_config):
    spec = make_spec(tiny_config, phases=["train"])
    metrics, timings = {}, {}
    run_train(spec, "float32", metrics, timings)
    sub_phases = ("old_log_prob", "ref_log_prob", "update_actor")
    assert set(timings) == {*sub_phases, "actor_reload"}
    tokens = sum(spec.train_prompt_lengths) + sum(spec.train_response_lengths)
    assert metrics["train_tokens"] == tokens
    for name in sub_phases:
        assert timings[name] > 0
        assert metrics[f"{name}_tokens_per_s"] == pytest.approx(tokens / timings[name])
        # Python's collector inside the phase, as verl's traced worker records it per pass.
        assert 0 <= metrics[f"{name}_gc_s"] < timings[name] and metrics[f"{name}_full_gcs"] >= 0
    assert metrics["train_heap_objects"] > 10_000
    assert metrics["optimizer_step_s"] > 0
    sequences, t = len(spec.train_prompt_lengths), spec.train
    assert metrics["old_log_prob_micro_batches"] == -(-sequences // t.log_prob_micro_batch_size_per_gpu)
    assert metrics["ref_log_prob_micro_batches"] == -(-sequences // t.ref_log_prob_micro_batch_size_per_gpu)
    assert timings["actor_reload"] == metrics["actor_reload_s"] == 0.0  # no offload on CPU


def test_dynamic_batch_size_and_no_reference_model(tiny_config):
    spec = make_spec(tiny_config, phases=["train"])
    spec.train.use_dynamic_bsz = True
    spec.train.use_ref = False
    spec.train.ppo_max_token_len_per_gpu = 256
    metrics, timings = {}, {}
    run_train(spec, "float32", metrics, timings)
    assert set(timings) == {"old_log_prob", "update_actor", "actor_reload"}


def test_token_budget_below_the_longest_sequence_is_rejected_in_its_phase(tiny_config):
    spec = make_spec(tiny_config, phases=["train"])
    spec.train.use_dynamic_bsz = True
    spec.train.ppo_max_token_len_per_gpu = 64
    with pytest.raises(ConfigRejected) as info:
        run_train(spec, "float32", {}, {})
    assert phase_of(info.value) == "update_actor"
