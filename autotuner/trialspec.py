"""Turn a job and one proposed config into the worker's ``TrialSpec``.

Lengths are drawn from the job's seed, so every trial is measured on the same requests:
the whole batch is ``train_batch_size`` prompts, each sampled ``n`` times with its own
response length. The spec carries the distributions, the seed and the counts
(``trials.types.BatchDraw``); the trial process draws the lengths (``trials.lengths``),
so the service never holds a list per request. A trial runs on ``trial_gpus(spec, config)`` GPUs, one
actor rank per GPU (``trials.ranks``): by default one rollout replica's TP group (its
replica's share of the requests, its ranks' shares of the sequences; all replicas run in
parallel in verl), with ``cluster.trial_scope: world`` the whole world.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from autotuner.knobs import KNOBS, R, engine_arguments
from autotuner.spec import JobSpec, ModelArch
from trials.types import BatchDraw, RolloutKnobs, TrainKnobs, TrialSpec


def batch_draw(spec: JobSpec) -> BatchDraw:
    """How every trial of the job draws its step's batch (the whole step; ``build_trial_spec``
    sets the trial's share). No per-request data: the trial process draws it."""
    w = spec.workload
    requests = w.train_batch_size * w.n
    return BatchDraw(
        prompt_length=w.prompt_length.model_dump(),
        response_length=w.response_length.model_dump(),
        max_prompt_length=w.max_prompt_length,
        max_response_length=w.max_response_length,
        prompts=w.train_batch_size,
        samples_per_prompt=w.n,
        seed=spec.seed,
        rollout_requests=requests,
        train_sequences=requests,
        train_ranks=spec.cluster.world_size,
    )


def knobs_for_trial(config: dict[str, Any], engine: str) -> tuple[RolloutKnobs, TrainKnobs]:
    rollout: dict[str, Any] = {
        "engine": engine,
        "max_model_len": config[R + "max_model_len"],
        "engine_args": engine_arguments(engine),
    }
    train: dict[str, Any] = {}
    for path, value in config.items():
        knob = KNOBS.get(path)
        # Knobs of two engines can share a trial field (vLLM's max_num_batched_tokens and
        # SGLang's chunked_prefill_size): only the trial's engine's own one writes it.
        if knob is None or engine not in knob.engines:
            continue
        section, name = knob.trial_field
        (rollout if section == "rollout" else train)[name] = value
    return RolloutKnobs(**rollout), TrainKnobs(**train)


def actor_strategy(device: str, world_size: int, param_offload: bool) -> str:
    """The FSDP a trial builds its actor and ref with. Without the actor's ``param_offload``
    the export sets no ``actor_rollout_ref.actor.strategy``, so verl v0.9 runs its default,
    ``fsdp`` (FSDP1). The trial builds FSDP1 where it was measured against verl (a world of
    one GPU) and FSDP2 elsewhere: on a CPU, where FSDP1 does not run; as one rank of a larger
    world, whose FSDP1 collectives no trial has been measured with; with the actor's
    ``param_offload``, which the trial moves as FSDP2's only, and for which the export names
    ``fsdp2`` so that verl runs what was measured (``autotuner.export.verl_config``). The
    result records which it built (``actor_fsdp_version``)."""
    if device == "cuda" and world_size == 1 and not param_offload:
        return "fsdp"
    return "fsdp2"


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
    batch: BatchDraw | None = None,
) -> TrialSpec:
    """The worker's spec for ``config``; ``batch``: the job's ``batch_draw`` (computed here
    when not given; a caller building many specs passes it once)."""
    w, cluster = spec.workload, spec.cluster
    rollout, train = knobs_for_trial(config, w.engine)
    train.strategy = actor_strategy(device, cluster.world_size, train.param_offload)
    train.use_ref = w.use_kl_loss
    train.entropy_coeff = w.entropy_coeff
    requests = w.train_batch_size * w.n
    replicas = cluster.world_size // rollout.tensor_model_parallel_size
    per_replica = requests // replicas
    per_rank = requests // cluster.world_size
    ranks = trial_gpus(spec, config)  # the trial's replicas' requests, its ranks' sequences
    served = per_replica * (ranks // rollout.tensor_model_parallel_size)
    whole = batch or batch_draw(spec)
    share = dataclasses.replace(whole, rollout_requests=served, train_sequences=per_rank * ranks)
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
        batch=share,
        local_mini_batch_size=w.ppo_mini_batch_size * w.n // cluster.world_size,
        samples_per_prompt=w.n,
        n_gpus=cluster.world_size,
        rollout_replicas=replicas,
        trial_gpus=ranks,
        device_memory_cap_gib=device_memory_cap_gib,
        seed=spec.seed,
        train_probe=device == "cuda",  # where a failed trial's rollout costs GPU time
    )
