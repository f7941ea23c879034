from __future__ import annotations

from trial_helpers import make_spec

from trials.types import TrialResult, TrialSpec


def test_spec_round_trips_through_json(tiny_config):
    spec = make_spec(tiny_config, samples_per_prompt=4, phases=["train"])
    spec.rollout.engine_kwargs = {"enable_prefix_caching": False}
    spec.rollout.cudagraph_capture_sizes = [1, 2, 4]
    back = TrialSpec.from_json(spec.to_json())
    assert back == spec
    assert back.rollout.engine_kwargs == {"enable_prefix_caching": False}
    assert back.train.ppo_micro_batch_size_per_gpu == 4


def test_result_round_trips_through_json():
    result = TrialResult(
        "t1",
        "oom",
        phase="update_actor",
        error_type="OutOfMemoryError",
        error_message="CUDA out of memory",
        metrics={"rollout_makespan_s": 1.5, "peak_memory_gib": 70.2},
        phase_timings_s={"rollout": 1.5},
        wall_s=12.0,
        log_tail="...",
    )
    back = TrialResult.from_json(result.to_json())
    assert back == result
    assert not back.ok
