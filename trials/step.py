"""Compose one PPO step's time and throughput from the measured phases.

verl runs a step as: rollout (all replicas in parallel, each serving its share of the
requests), then ``old_log_prob``, ``ref_log_prob`` and ``update_actor`` on every rank
in parallel (each rank its equal share of the sequences). So, with ``M`` the rollout
makespan of one replica and ``T_x`` the estimated seconds of sub-phase ``x`` for one
rank's whole share:

- both phases: ``step_time_s = M + T_old + T_ref + T_update`` and ``step_tokens`` =
  prompt + response tokens of the whole batch = ``sum(train lengths) * n_gpus``;
- rollout only: ``step_time_s = M``, ``step_tokens`` = the replica's prompt + generated
  tokens ``* rollout_replicas``;
- train only: ``step_time_s = T_old + T_ref + T_update``, ``step_tokens`` as for both.

``throughput_tokens_per_s_per_gpu = step_tokens / step_time_s / n_gpus``, which is
verl's ``perf/throughput``. Weight sync between trainer and engine, data loading and
the reward are not measured, so this is an upper bound on what verl reports.
"""

from __future__ import annotations

from trials.types import TrialSpec

TRAIN_SUB_PHASES = ("old_log_prob", "ref_log_prob", "update_actor")


def step_metrics(
    spec: TrialSpec, metrics: dict[str, float], timings: dict[str, float]
) -> dict[str, float]:
    """``step_time_s``, ``step_tokens`` and ``throughput_tokens_per_s_per_gpu`` (empty when
    no phase completed)."""
    ran_rollout = "rollout" in spec.phases and "rollout_makespan_s" in metrics
    ran_train = "train" in spec.phases and "update_actor" in timings
    if ran_train:
        step_time = sum(timings.get(name, 0.0) for name in TRAIN_SUB_PHASES)
        if ran_rollout:
            step_time += metrics["rollout_makespan_s"]
        tokens = (
            float(sum(spec.train_prompt_lengths) + sum(spec.train_response_lengths)) * spec.n_gpus
        )
    elif ran_rollout:
        step_time = metrics["rollout_makespan_s"]
        replica_tokens = metrics["rollout_prompt_tokens"] + metrics["rollout_generated_tokens"]
        tokens = replica_tokens * spec.rollout_replicas
    else:
        return {}
    return {
        "step_time_s": step_time,
        "step_tokens": tokens,
        "throughput_tokens_per_s_per_gpu": tokens / step_time / spec.n_gpus,
    }
