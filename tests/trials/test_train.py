"""The train phase in this process on the tiny model (no engine)."""

from __future__ import annotations

import json

import pytest
from trial_helpers import make_spec

from trials import actor, profiling
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
        # Each micro-batch timed alone, as verl's trace times its own: together within the
        # sub-phase (the update's optimizer steps fall outside them).
        count = metrics[f"{name}_micro_batches"]
        mean, median, longest = (metrics[f"{name}_micro_batch_s_{s}"] for s in ("mean", "median", "max"))
        assert 0 < median <= longest and mean <= longest and mean * count < timings[name]
        assert 0 < metrics[f"{name}_micro_batch_tokens_median"] <= tokens
        # The thread's own CPU seconds in a micro-batch (the model's work on this CPU), and the
        # process's over the pass: at least its thread's.
        assert metrics[f"{name}_micro_batch_thread_s_mean"] > 0
        assert metrics[f"{name}_process_cpu_s"] >= 0.9 * count * metrics[f"{name}_micro_batch_thread_s_mean"]
    assert metrics["train_heap_objects"] > 10_000
    assert metrics["optimizer_step_s"] > 0
    # Packed (verl's default): every micro-batch is verl's TensorDict, moved whole.
    assert spec.train.use_remove_padding and metrics["train_micro_batch_tensordict"] == 1.0
    sequences, t = len(spec.train_prompt_lengths), spec.train
    assert metrics["old_log_prob_micro_batches"] == -(-sequences // t.log_prob_micro_batch_size_per_gpu)
    assert metrics["ref_log_prob_micro_batches"] == -(-sequences // t.ref_log_prob_micro_batch_size_per_gpu)
    assert timings["actor_reload"] == metrics["actor_reload_s"] == 0.0  # no offload on CPU
    # Each update micro-batch's loss and verl's loss metrics, read to the host before its
    # backward as verl reads them: at the old policy nothing drifts or clips, the KL to the
    # reference (use_kl_loss) is positive and the loss is the PPO term plus its share.
    assert metrics["update_actor_ppo_kl"] == 0.0
    assert metrics["update_actor_pg_clipfrac"] == metrics["update_actor_pg_clipfrac_lower"] == 0.0
    assert metrics["update_actor_kl_loss"] > 0
    assert metrics["update_actor_loss"] == pytest.approx(
        metrics["update_actor_pg_loss"] + actor.KL_LOSS_COEF * metrics["update_actor_kl_loss"], rel=1e-4
    )


def test_dynamic_batch_size_and_no_reference_model(tiny_config):
    spec = make_spec(tiny_config, phases=["train"])
    spec.train.use_dynamic_bsz = True
    spec.train.use_ref = False
    spec.train.ppo_max_token_len_per_gpu = 256
    metrics, timings = {}, {}
    run_train(spec, "float32", metrics, timings)
    assert set(timings) == {"old_log_prob", "update_actor", "actor_reload"}
    assert (
        "update_actor_kl_loss" not in metrics
        and metrics["update_actor_loss"] == metrics["update_actor_pg_loss"]
    )


def test_padded_rows_run_verls_micro_batch_and_loss(tiny_config):
    """use_remove_padding false: the same TensorDict micro-batches, padded on the device, and
    verl's loss (its reads included) on the log-probs gathered back to the real tokens."""
    spec = make_spec(tiny_config, phases=["train"])
    spec.train.use_remove_padding = False
    metrics, timings = {}, {}
    run_train(spec, "float32", metrics, timings)
    assert metrics["train_micro_batch_tensordict"] == 1.0
    assert metrics["update_actor_micro_batches"] == len(spec.train_prompt_lengths) // 4
    # verl's loss reads its three metrics, the policy loss and the KL loss at the old policy.
    assert metrics["update_actor_ppo_kl"] == 0.0 and metrics["update_actor_kl_loss"] > 0
    assert metrics["update_actor_loss"] == pytest.approx(
        metrics["update_actor_pg_loss"] + actor.KL_LOSS_COEF * metrics["update_actor_kl_loss"], rel=1e-4
    )


def test_token_budget_below_the_longest_sequence_is_rejected_in_its_phase(tiny_config):
    spec = make_spec(tiny_config, phases=["train"])
    spec.train.use_dynamic_bsz = True
    spec.train.ppo_max_token_len_per_gpu = 64
    with pytest.raises(ConfigRejected) as info:
        run_train(spec, "float32", {}, {})
    assert phase_of(info.value) == "update_actor"


def test_a_profiled_update_writes_its_micro_batches_profile_and_says_so(tiny_config, tmp_path, monkeypatch):
    spec = make_spec(tiny_config, phases=["train"])
    spec.train.ppo_micro_batch_size_per_gpu = 1  # enough micro-batches to profile four of them
    monkeypatch.setenv(profiling.PROFILE_ENV, str(tmp_path))
    metrics, timings = {}, {}
    run_train(spec, "float32", metrics, timings)
    assert metrics["update_actor_profiled"] == 1.0
    (path,) = tmp_path.glob("profile-trial-update_actor-*.json")
    doc = json.loads(path.read_text())
    first = profiling.FIRST
    assert doc["micro_batches"] == list(range(first, first + profiling.COUNT))
    assert 0 < doc["wall_s"] < timings["update_actor"]
    names = {op["name"] for op in doc["ops"]}
    assert {"aten::mm", "aten::item"} <= names  # the model's matmuls; the host's read of the loss
    assert all(op["calls"] > 0 and op["self_host_s"] >= 0 for op in doc["ops"])
    assert path.with_suffix(".trace.json.gz").stat().st_size > 0

    monkeypatch.delenv(profiling.PROFILE_ENV)
    plain: dict[str, float] = {}
    run_train(spec, "float32", plain, {})
    assert "update_actor_profiled" not in plain
