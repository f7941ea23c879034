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
- ``rollout_poll``: what verl's trainer waits past the rollout's end before it sees it.
  verl v0.9's trainer (``trainer.use_v1``, its default) times ``gen`` as its wait on the
  replay buffer (``verl/trainer/ppo/v1/replay_buffer.py``, ``ReplayBuffer.sample``), which
  looks for finished trajectories every ``ReplayBuffer.poll_interval`` = 2 s, a constructor
  default no config key reaches: ``M`` is seen at the first poll after it, ``gen`` is ``M``
  rounded up to a whole number of polls (``replay_poll_wait_s``). Every ``timing_s/gen`` in
  ``benchmarks/results/verl-*.json`` (2026-11-24 and -25) is an even number of seconds
  plus 0.08-0.23 s;
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

import math

from trials.metrics import THROUGHPUT
from trials.types import TrialSpec

TRAIN_SUB_PHASES = ("old_log_prob", "ref_log_prob", "update_actor")
ROLLOUT_COMPONENTS = ("engine_wake", "weight_sync", "rollout", "rollout_poll", "engine_sleep")
TRAIN_COMPONENTS = (*TRAIN_SUB_PHASES, "actor_reload")
STEP_COMPONENTS = (*ROLLOUT_COMPONENTS, *TRAIN_COMPONENTS)
# verl v0.9's replay buffer looks for finished trajectories this often (see the module's notes).
VERL_REPLAY_POLL_S = 2.0
# Each of verl v0.9's step timers (``timing_s/<name>``) and the trial's parts it covers, the
# first of them the one a trial must have measured for the timer to be predicted. verl's
# ``update_weights`` (``trainer/ppo/v1/trainer_sync.py`` ``on_step_end``, the colocated
# ``workers/engine_workers.py`` ``update_weights``) wakes the engine's weights, syncs them,
# empties the cache and wakes the KV cache: the trial's ``weight_sync`` and the hand-over it
# times apart, ``engine_wake``. verl's ``gen`` (``trainer/ppo/v1/trainer_base.py``
# ``_step_once``) waits for the replay buffer's sample, then puts the engine to sleep
# (``on_sample_end``): the trial's rollout, its poll and ``engine_sleep``.
VERL_TIMERS: dict[str, tuple[str, ...]] = {
    "timing_s/update_weights": ("weight_sync", "engine_wake"),
    "timing_s/gen": ("rollout", "rollout_poll", "engine_sleep"),
    "timing_s/old_log_prob": ("old_log_prob",),
    "timing_s/ref": ("ref_log_prob",),
    "timing_s/update_actor": ("update_actor",),
}


def replay_poll_wait_s(rollout_s: float, poll_s: float = VERL_REPLAY_POLL_S) -> float:
    """Seconds from a rollout's end to the replay buffer's next poll, which sees it: verl's
    ``gen`` is ``rollout_s`` rounded up to a whole number of polls."""
    return max(0.0, math.ceil(rollout_s / poll_s - 1e-9) * poll_s - rollout_s)


def as_verl_timers(timings: dict[str, float]) -> dict[str, float]:
    """A trial's step parts summed as verl's timers cover them (``VERL_TIMERS``); a timer whose
    first part the trial did not measure is left out. A rollout recorded without its poll
    (trials before ``rollout_poll``) gets it here."""
    parts = dict(timings)
    if "rollout" in parts and "rollout_poll" not in parts:
        parts["rollout_poll"] = replay_poll_wait_s(parts["rollout"])
    return {
        timer: sum(parts.get(p, 0.0) for p in covered)
        for timer, covered in VERL_TIMERS.items()
        if covered[0] in parts
    }


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
        parts["rollout_poll"] = replay_poll_wait_s(parts["rollout"])
    if ran_train:
        parts.update({k: timings[k] for k in TRAIN_COMPONENTS if k in timings})
    return {k: parts[k] for k in STEP_COMPONENTS if k in parts}


def complete_step(spec: TrialSpec, metrics: dict[str, float], timings: dict[str, float]) -> None:
    """Add the step's derived part (``rollout_poll``) to ``timings`` and its step metrics to
    ``metrics``, so that ``step_time_s`` is the sum of ``timings``' step parts."""
    parts = step_components(spec, metrics, timings)
    if "rollout_poll" in parts:
        timings["rollout_poll"] = parts["rollout_poll"]
    metrics.update(step_metrics(spec, metrics, timings))


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
