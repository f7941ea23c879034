"""Turn a job and one proposed config into the worker's ``TrialSpec``.

Lengths are drawn once per job from its seed, so every trial is measured on the same
requests: the whole batch is ``train_batch_size`` prompts, each sampled ``n`` times
with its own response length. A trial runs on ``trial_gpus(spec, config)`` GPUs, one
actor rank per GPU (``trials.ranks``): by default one rollout replica's TP group (its
replica's share of the requests, its ranks' shares of the sequences; all replicas run in
parallel in verl), with ``cluster.trial_scope: world`` the whole world.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from autotuner.knobs import KNOBS, R, engine_arguments
from autotuner.spec import JobSpec, ModelArch
from trials.types import RolloutKnobs, TrainKnobs, TrialSpec


@dataclass(frozen=True)
class Batch:
    """The lengths of one PPO step's batch, request by request."""

    prompt_lengths: list[int]  # one per request (prompts repeated n times)
    response_lengths: list[int]  # one per request

    @property
    def tokens(self) -> int:
        return sum(self.prompt_lengths) + sum(self.response_lengths)


def draw_batch(spec: JobSpec) -> Batch:
    w = spec.workload
    rng = np.random.default_rng(spec.seed)
    prompts = w.prompt_length.draw(w.train_batch_size, rng, w.max_prompt_length)
    responses = w.response_length.draw(w.train_batch_size * w.n, rng, w.max_response_length)
    return Batch([p for p in prompts for _ in range(w.n)], responses)


def knobs_for_trial(config: dict[str, Any], engine: str) -> tuple[RolloutKnobs, TrainKnobs]:
    rollout: dict[str, Any] = {
        "engine": engine,
        "max_model_len": config[R + "max_model_len"],
        "engine_args": engine_arguments(engine),
    }
    train: dict[str, Any] = {}
    for path, value in config.items():
        knob = KNOBS.get(path)
        if knob is None:
            continue
        section, name = knob.trial_field
        (rollout if section == "rollout" else train)[name] = value
    return RolloutKnobs(**rollout), TrainKnobs(**train)


def trial_gpus(spec: JobSpec, config: dict[str, Any]) -> int:
    """The GPUs one trial of ``config`` runs on (``cluster.trial_scope``): its rollout
    replica's TP group, or the whole world."""
    if spec.cluster.trial_scope == "world":
        return spec.cluster.world_size
    return int(config.get(R + "tensor_model_parallel_size", 1))


def build_trial_spec(
    spec: JobSpec,
    arch: ModelArch,
    config: dict[str, Any],
    trial_id: str,
    device: Literal["cuda", "cpu"],
    device_memory_cap_gib: float | None,
) -> TrialSpec:
    w, cluster = spec.workload, spec.cluster
    batch = draw_batch(spec)
    rollout, train = knobs_for_trial(config, w.engine)
    train.use_ref = w.use_kl_loss
    train.entropy_coeff = w.entropy_coeff
    replicas = cluster.world_size // rollout.tensor_model_parallel_size
    per_replica = len(batch.prompt_lengths) // replicas
    per_rank = len(batch.prompt_lengths) // cluster.world_size
    ranks = trial_gpus(spec, config)  # the trial's replicas' requests, its ranks' sequences
    served = per_replica * (ranks // rollout.tensor_model_parallel_size)
    phases = [p for p, on in (("rollout", w.measures_rollout), ("train", w.measures_train)) if on]
    return TrialSpec(
        trial_id=trial_id,
        model_name=arch.name,
        model_config=dict(arch.config),
        dtype=w.dtype,
        device=device,
        phases=phases,
        rollout=rollout,
        train=train,
        prompt_lengths=batch.prompt_lengths[:served],
        response_lengths=batch.response_lengths[:served],
        train_prompt_lengths=batch.prompt_lengths[: per_rank * ranks],
        train_response_lengths=batch.response_lengths[: per_rank * ranks],
        local_mini_batch_size=w.ppo_mini_batch_size * w.n // cluster.world_size,
        samples_per_prompt=w.n,
        n_gpus=cluster.world_size,
        rollout_replicas=replicas,
        trial_gpus=ranks,
        device_memory_cap_gib=device_memory_cap_gib,
        seed=spec.seed,
        train_probe=device == "cuda",  # where a failed trial's rollout costs GPU time
    )
