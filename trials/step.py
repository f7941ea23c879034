"""Compose one PPO step's time and throughput from the measured phases.

verl runs a colocated step as: wake the engine (weights and KV cache back on the GPUs),
rollout (all replicas in parallel, each serving its share of the requests), put the
engine to sleep, then ``old_log_prob``, ``ref_log_prob`` and ``update_actor`` on every
rank in parallel (each rank its equal share of the sequences), with the actor's
parameter/optimizer offload moves around them. The step time is the sum of the parts
measured, ``STEP_COMPONENTS``, each a key of ``phase_timings_s``:

- ``engine_wake`` / ``engine_sleep``: the engine's hand-over (``free_cache_engine``, on an
  engine with a sleep mode); engine start-up happens once and is not part of a step;
- ``weight_sync``: the actor's weights moved into the engine before the rollout, in
  ``update_weights_bucket_megabytes`` buckets (``trials.rollout.weight_sync``);
- ``rollout``: ``M``, the makespan of one replica;
- ``old_log_prob``, ``ref_log_prob``, ``update_actor``: ``T_x``, the estimated seconds of
  sub-phase ``x`` for one rank's whole share;
- ``actor_reload``: the actor's offload moves (``param_offload``, ``optimizer_offload``):
  around its sub-phases and around the engine's wake-up.

``step_tokens`` is prompt + response tokens of the whole batch, ``sum(train lengths) *
n_gpus / trial_gpus``, when the train phase ran; rollout only: the measured replicas'
prompt + generated tokens ``* rollout_replicas / (trial_gpus / TP)`` (a trial measures
``trial_gpus`` ranks and their replicas; see ``trials.ranks``). The rollout-side parts
count only when the rollout ran, the train-side parts only when the train phase did.

``throughput_tokens_per_s_per_gpu = step_tokens / step_time_s / n_gpus``, which is
verl's ``perf/throughput``. Data loading and the reward are not measured, so this is an
upper bound on what verl reports.
"""

from __future__ import annotations

from trials.metrics import THROUGHPUT
from trials.types import TrialSpec

TRAIN_SUB_PHASES = ("old_log_prob", "ref_log_prob", "update_actor")
ROLLOUT_COMPONENTS = ("engine_wake", "weight_sync", "rollout", "engine_sleep")
TRAIN_COMPONENTS = (*TRAIN_SUB_PHASES, "actor_reload")
STEP_COMPONENTS = (*ROLLOUT_COMPONENTS, *TRAIN_COMPONENTS)


def step_components(
    spec: TrialSpec, metrics: dict[str, float], timings: dict[str, float]
) -> dict[str, float]:
    """The measured parts of one step, in ``STEP_COMPONENTS`` order (empty: none ran)."""
    ran_rollout = "rollout" in spec.phases and "rollout_makespan_s" in metrics
    ran_train = "train" in spec.phases and "update_actor" in timings
    parts: dict[str, float] = {}
    if ran_rollout:
        parts.update({k: timings[k] for k in ROLLOUT_COMPONENTS if k in timings})
        parts["rollout"] = metrics["rollout_makespan_s"]
    if ran_train:
        parts.update({k: timings[k] for k in TRAIN_COMPONENTS if k in timings})
    return {k: parts[k] for k in STEP_COMPONENTS if k in parts}


def step_metrics(spec: TrialSpec, metrics: dict[str, float], timings: dict[str, float]) -> dict[str, float]:
    """``step_time_s``, ``step_tokens`` and ``throughput_tokens_per_s_per_gpu`` (empty when
    no phase completed)."""
    parts = step_components(spec, metrics, timings)
    if not parts:
        return {}
    ranks = max(spec.trial_gpus, 1)
    if "update_actor" in parts:
        measured = float(sum(spec.train_prompt_lengths) + sum(spec.train_response_lengths))
        tokens = measured * spec.n_gpus / ranks
    else:
        measured = metrics["rollout_prompt_tokens"] + metrics["rollout_generated_tokens"]
        replicas = max(ranks // max(spec.rollout.tensor_model_parallel_size, 1), 1)
        tokens = measured * spec.rollout_replicas / replicas
    step_time = sum(parts.values())
    return {
        "step_time_s": step_time,
        "step_tokens": tokens,
        THROUGHPUT: tokens / step_time / spec.n_gpus,
    }
