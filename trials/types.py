"""The contract between the control plane and a trial worker: plain, JSON-serialisable data.

A `TrialSpec` says everything a worker needs to benchmark one configuration; a
`TrialResult` is everything it measured. Neither imports torch or an engine, so the
control plane can build and read them without the worker's dependencies.

Knob dictionaries use verl's own names (the last component of the Hydra path, e.g.
``gpu_memory_utilization``); ``RolloutKnobs.engine_args`` says which engine argument each
rollout field is passed as (the control plane's knob table decides, ``autotuner.knobs``).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, cast

WorkerStatus = Literal["ok", "oom", "error", "timeout"]
# Where a failure can happen, in the order a co-located step runs them (see trials.runner):
# ``startup`` builds the actor and starts the engine, ``engine_sleep`` frees the engine's
# memory after generation, ``engine_wake`` takes it back for the next step, ``weight_sync``
# moves the actor's weights into the engine before the rollout.
PHASES: tuple[str, ...] = (
    "startup",
    "weight_sync",
    "rollout",
    "engine_sleep",
    "old_log_prob",
    "ref_log_prob",
    "update_actor",
    "engine_wake",
)


# verl v0.9.0's ``entropy_from_logits_chunk_size`` default (rows per chunk), which the trial's
# chunked entropy (``trials.actor``) and the memory model (``autotuner.memory``) both take.
ENTROPY_CHUNK_ROWS = 2048

_J = TypeVar("_J", bound="JsonData")


class JsonData:
    """JSON for a plain dataclass: ``to_dict``/``to_json`` and back (``from_dict`` takes the
    fields as they are; a class with nested dataclasses overrides it)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(cast(Any, self))

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls: type[_J], data: dict[str, Any]) -> _J:
        return cls(**data)

    @classmethod
    def from_json(cls: type[_J], text: str) -> _J:
        return cls.from_dict(json.loads(text))


@dataclass
class RolloutKnobs:
    """Rollout-engine knobs, named as in ``actor_rollout_ref.rollout.*``."""

    engine: str = "vllm"
    gpu_memory_utilization: float = 0.5
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    tensor_model_parallel_size: int = 1
    enforce_eager: bool = False
    max_model_len: int = 1024
    cudagraph_capture_sizes: list[int] | None = None
    free_cache_engine: bool = True
    # checkpoint_engine.update_weights_bucket_megabytes: the weight sync's bucket (verl: 2048).
    update_weights_bucket_megabytes: int = 2048
    # The engine's arguments for the knobs, each with the field above that holds its value
    # ({argument: field}, e.g. {"tp_size": "tensor_model_parallel_size"}), from the knob
    # table's rows for ``engine``; the backend passes every one (``rollout.base.knob_arguments``).
    engine_args: dict[str, str] = field(default_factory=dict)
    # Raw engine arguments merged last (verl's rollout.engine_kwargs.<engine>).
    engine_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrainKnobs:
    """Actor/ref knobs, named as in ``actor_rollout_ref.{actor,ref,model}.*``."""

    ppo_micro_batch_size_per_gpu: int = 4
    log_prob_micro_batch_size_per_gpu: int = 4
    ref_log_prob_micro_batch_size_per_gpu: int = 4
    enable_gradient_checkpointing: bool = True
    param_offload: bool = False
    optimizer_offload: bool = False
    use_dynamic_bsz: bool = False
    ppo_max_token_len_per_gpu: int = 16384
    log_prob_max_token_len_per_gpu: int = 16384
    use_ref: bool = True
    # verl's default layout: each micro-batch's sequences packed into one row (varlen
    # attention); False: one right-padded row per sequence (``trials.actor``).
    use_remove_padding: bool = True
    # actor_rollout_ref.ref.fsdp_config.param_offload, as the config sets it: verl v0.9's
    # FSDP engine offloads the ref to the CPU whatever it says, and so does the trial.
    ref_param_offload: bool = False
    # The old-log-prob forward's entropy computed in chunks of rows (less memory).
    entropy_from_logits_with_chunking: bool = False
    # actor.fsdp_config.use_torch_compile: the entropy through torch.compile on packed rows
    # (verl's default; ``trials.actor.EntropyKernel``).
    use_torch_compile: bool = True
    # The update's entropy term (workload's actor.entropy_coeff; 0: verl computes none) and
    # whether its computation is recomputed in the backward (entropy_checkpointing).
    entropy_coeff: float = 0.0
    entropy_checkpointing: bool = False
    # actor_rollout_ref.actor.strategy (the ref follows it): "fsdp2" builds FSDP2's
    # ``fully_shard``; "fsdp", verl v0.9's default, FSDP1's ``FullyShardedDataParallel``
    # as verl's engine builds it (CUDA only, without the actor's param_offload so far;
    # ``trials.actor_state``). A job's trials get ``autotuner.trialspec.actor_strategy``'s
    # choice; this default serves specs built by hand.
    strategy: str = "fsdp2"
    # The CUDA allocator's expandable segments through the train sub-phases, as verl v0.9's
    # training worker has them (``trials.actor_state.train_allocator``); False: the
    # allocator's default, a control for benchmarks.
    expandable_segments: bool = True


@dataclass
class BatchDraw(JsonData):
    """How a trial draws its batch (``trials.lengths``): the job's length distributions
    (as the job spec holds them), caps, counts and seed, and the requests this trial takes
    from the step, each a prefix of the step's requests (prompts repeated
    ``samples_per_prompt`` times): ``rollout_requests`` for its replicas' rollout,
    ``train_sequences`` for its ranks' train share. The train sequences come in the order
    verl's trainer hands them to its ranks (``trials.lengths.verl_batch_order``), over the
    actor's ``train_ranks`` data-parallel ranks."""

    prompt_length: dict[str, Any]
    response_length: dict[str, Any]
    max_prompt_length: int
    max_response_length: int
    prompts: int  # data.train_batch_size
    samples_per_prompt: int  # rollout.n
    seed: int
    rollout_requests: int
    train_sequences: int
    train_ranks: int = 1  # the actor's data-parallel ranks in the job's world
    # "verl": the train sequences in verl's order (``trials.lengths.verl_batch_order``);
    # "prompts": in the prompts' order, as every trial recorded up to 2026-11-27's
    # layouts in verl (results/verl-qwen2.5-1.5b-h200x4-layouts.json) took them.
    train_order: str = "verl"


@dataclass
class TrialSpec(JsonData):
    """One configuration to benchmark, with the workload it is measured on.

    Lengths are drawn from the job's seed, so every trial of a job sees the same
    requests. The control plane sends ``batch`` (the distributions, counts and seed) and
    the trial process draws the lists from it (``trials.lengths.drawn``); a spec may give
    the lists instead (``batch`` None). ``prompt_lengths`` has one entry per request the
    rollout replica serves; ``response_lengths`` has the same length and gives each request's
    ``max_tokens`` (generated with ``ignore_eos``). ``train_prompt_lengths`` and
    ``train_response_lengths`` are the sequences one data-parallel rank processes in
    one PPO step (its share of ``train_batch_size * n``).
    """

    trial_id: str
    model_name: str
    model_config: dict[str, Any]
    dtype: str = "bfloat16"
    device: Literal["cuda", "cpu"] = "cuda"
    phases: list[str] = field(default_factory=lambda: ["rollout", "train"])
    rollout: RolloutKnobs = field(default_factory=RolloutKnobs)
    train: TrainKnobs = field(default_factory=TrainKnobs)
    batch: BatchDraw | None = None
    prompt_lengths: list[int] = field(default_factory=list)
    response_lengths: list[int] = field(default_factory=list)
    train_prompt_lengths: list[int] = field(default_factory=list)
    train_response_lengths: list[int] = field(default_factory=list)
    # Consecutive groups of this many requests share one prompt (verl's rollout.n), so
    # the engine's prefix cache sees what it sees in verl. 1: every prompt is distinct.
    samples_per_prompt: int = 1
    # Sequences per optimizer step on this rank (ppo_mini_batch_size * n / dp).
    local_mini_batch_size: int = 4
    # GPUs in the trainer world the step throughput is divided by (verl's n_gpus).
    n_gpus: int = 1
    # Rollout replicas in that world (n_gpus // TP); each serves its share of requests.
    rollout_replicas: int = 1
    # GPUs this trial runs on, one rank process per GPU (``trials.ranks``). With more than
    # one, ``prompt_lengths``/``response_lengths`` hold the requests of the trial's
    # ``trial_gpus // TP`` replicas one replica after another, and the train lengths the
    # shares of its ``trial_gpus`` ranks one rank after another. ``trial_gpus == n_gpus``:
    # the whole world, the actor sharded over a real process group; fewer: each rank fakes
    # its world (``trials.distributed``).
    trial_gpus: int = 1
    # After one rank failed, how long the others get to stop by themselves before they are
    # killed (a rank blocked in a collective with a dead peer never stops).
    rank_grace_s: float = 30.0
    # The rollout side measured by an earlier trial whose engine saw exactly what this one's
    # would (same rollout knobs, same actor resident beside it): {"trial": its number,
    # "metrics": ..., "timings": ...}. The engine is not started; its measurements are
    # taken over, and the memory its sleeping engine kept (``engine_asleep_gib``) is held
    # on the device while this trial trains (``trials.runner``). One GPU only.
    reused_rollout: dict[str, Any] | None = None
    # Cap on the memory one device may use (GiB). On CPU it is enforced as a real
    # allocation limit on the trial process; None means the device's own capacity.
    device_memory_cap_gib: float | None = None
    warmup_requests: int = 4
    seed: int = 0
    # The actor as verl's FSDP2 worker holds it (sharded over n_gpus ranks, fp32 master
    # weights, bf16 compute); False: a plain module on one device (no process group).
    actor_fsdp: bool = True
    # A CUDA trial starts only on GPUs that hold at most this much memory (GiB) already,
    # waiting up to gpu_clean_wait_s for a previous trial's processes to let go.
    gpu_clean_threshold_gib: float = 2.0
    gpu_clean_wait_s: float = 60.0
    # With both phases: run each train sub-phase's largest micro-batch once right after
    # the actor is built, before the engine starts (``trials.train.probe_train``). The
    # engine, asleep in training, only adds memory, so a micro-batch that does not fit
    # then will not fit after the rollout either: the trial fails in seconds instead of
    # after the engine's start-up and the whole rollout.
    train_probe: bool = False
    # With both phases: the engine's side of the step alone. The actor is built (and probed,
    # with ``train_probe``) and stays resident as in a full trial, the engine starts beside
    # it, syncs, rolls out, sleeps and wakes, but the actor's sub-phases do not run: the
    # step holds the engine's parts only (``engine_side_only`` in the metrics says so). A
    # landscape composed from measured sides (``benchmarks.search.compose``) records its
    # engine settings so, and takes their actor side from a full trial of the train setting.
    engine_side_only: bool = False
    # verl's environment on this host ({"python": ..., "PYTHONPATH": ..., "cache_dir": ...}):
    # where given, the trial has it time verl's own cut of the trial's batch into
    # micro-batches and counts those seconds in the phases verl spends them in
    # (``trials.verl.cut``; a cut timed before on this host is read from ``cache_dir``).
    # Empty: not timed.
    verl_cut_env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialSpec:
        data = dict(data)
        data["rollout"] = RolloutKnobs(**data.get("rollout", {}))
        data["train"] = TrainKnobs(**data.get("train", {}))
        if data.get("batch") is not None:
            data["batch"] = BatchDraw(**data["batch"])
        return cls(**data)


@dataclass
class TrialResult(JsonData):
    """What a trial measured, or how it failed.

    ``status`` is ``ok`` only when every requested phase ran to completion. On a
    failure ``phase`` names the phase it happened in (see ``PHASES``) and
    ``error_type``/``error_message`` say what happened; metrics measured before the
    failure are kept. Metric names carry their units (``_s``, ``_gib``, ``_per_s``);
    ``<event>_at_s`` metrics are seconds since the trial started.

    ``phase_timings_s`` holds ``startup`` (engine start-up: a cost of the trial, not of
    a step) and the parts one PPO step is composed of, ``trials.step.STEP_COMPONENTS``;
    ``step_time_s`` is their sum.
    """

    trial_id: str
    status: WorkerStatus
    phase: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    device: str = ""
    hostname: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    phase_timings_s: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    log_tail: str = ""
    # The engines' lines from the trial's log that time a step of start-up, sleep or wake
    # (``trials.launcher.TIMING_LINE``), set by the launcher for every outcome.
    timing_lines: list[str] = field(default_factory=list)
    # Set by the launcher: when the trial's process started (Unix time; it lived
    # [started_at, started_at + wall_s]) and the GPUs it was given (CUDA_VISIBLE_DEVICES,
    # as Ray or the caller set it; None: not set).
    started_at: float = 0.0
    visible_gpus: str | None = None
    # What measured it: package versions (torch, transformers, the engine, flash-attn),
    # the actor's attention kernel, CUDA, the driver and the GPU's name; set by the runner.
    software: dict[str, str] = field(default_factory=dict)
    # Set by the control plane's Ray executor: the Ray node that ran the trial ("": not on
    # Ray). Several nodes of one cluster may share a host name.
    node: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"
