"""A trial whose engine would see what an earlier trial's saw takes that rollout over: it
starts no engine and only trains, and its step is composed from both."""

from __future__ import annotations

import optuna
import pytest

from autotuner.executor import RayExecutor
from autotuner.knobs import A, R
from autotuner.records import records
from autotuner.replay import engine_seconds
from autotuner.space import SearchSpace
from autotuner.spec import load_job_spec, parse_job_spec
from autotuner.study import StudyRunner, open_study, rollout_key
from trials.types import TrialResult

from .conftest import REPO

optuna.logging.set_verbosity(optuna.logging.WARNING)


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


@pytest.mark.engine
def test_a_config_differing_only_in_train_knobs_reuses_the_measured_rollout(tmp_path, ray_local):
    doc = load_job_spec(REPO / "autotuner/examples/demo.yaml").model_dump()
    doc["search"] = {
        path: {"fixed": value}
        for path, value in {
            R + "gpu_memory_utilization": 0.5,
            R + "max_num_batched_tokens": 1024,
            R + "max_num_seqs": 64,
            R + "enforce_eager": True,
            R + "checkpoint_engine.update_weights_bucket_megabytes": 2048,
            A + "use_dynamic_bsz": False,
            R + "log_prob_micro_batch_size_per_gpu": 8,
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 8,
            "actor_rollout_ref.model.enable_gradient_checkpointing": True,
            A + "fsdp_config.param_offload": False,
            A + "fsdp_config.optimizer_offload": False,
        }.items()
    } | {A + "ppo_micro_batch_size_per_gpu": {"choices": [2, 8]}}
    doc["budget"].update(max_trials=2, max_minutes=10)
    doc["sampler"] = "random"
    spec = parse_job_spec(doc)
    space = SearchSpace.build(spec, spec.validate_model(), "cpu")
    study = open_study(spec, "reuse", f"sqlite:///{tmp_path / 'db.sqlite'}")
    runner = StudyRunner(spec, study, space, RayExecutor(), "cpu", memory_cap_gib=8)
    runner.run()
    first, second = [r for r in records(study) if r.measured]
    assert (first.status, second.status) == ("ok", "ok"), (first.error_message, second.error_message)
    assert "rollout_reused_from_trial" not in first.metrics and "engine_startup_s" in first.metrics
    m = second.metrics
    assert m["rollout_reused_from_trial"] == first.number
    assert "engine_startup_s" not in m and "engine_start_at_s" not in m  # no engine of its own
    for key in ("rollout_makespan_s", "rollout_generated_tokens", "kv_cache_tokens"):
        assert m[key] == first.metrics[key], key
    assert second.phase_timings_s["rollout"] == first.phase_timings_s["rollout"]
    # The weight sync into the engine is a rollout-side part: adopted with the rollout.
    assert second.phase_timings_s["weight_sync"] == first.phase_timings_s["weight_sync"] > 0
    assert m["weight_sync_bytes"] == first.metrics["weight_sync_bytes"] > 0
    assert m["step_time_s"] == pytest.approx(
        sum(v for k, v in second.phase_timings_s.items() if k != "startup")
    )
    micro = A + "ppo_micro_batch_size_per_gpu"
    assert second.config[micro] != first.config[micro]
    assert second.wall_s < first.wall_s - first.metrics["engine_startup_s"] / 2
