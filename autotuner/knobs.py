"""The one table of tunable knobs: verl path, engine arguments, candidate values, defaults.

Every knob is named by its verl Hydra path from spec to export. ``candidates`` gives the
values worth trying for a workload on a cluster (before user overrides); ``baseline`` is
what verl v0.9.0 uses when the key is left alone (repaired to a valid value where
verl's default would be rejected, e.g. TP 2 on one GPU); ``trial_field`` says where the
value goes in a ``TrialSpec``. Cross-knob rules live in ``autotuner.rules``.

verl leaves the micro-batch sizes unset (``null``); their baseline, 2, is the value verl's
own example sets (``examples/grpo_trainer/run_qwen3_4b_fsdp.sh`` at v0.9.0).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from autotuner.domains import KIND_DOMAINS, Domain, refusal

if TYPE_CHECKING:
    from autotuner.spec import Cluster, ModelArch, Workload


@dataclass(frozen=True)
class SpaceContext:
    """What candidate values depend on: the workload, the cluster, the model, the device."""

    workload: Workload
    cluster: Cluster
    arch: ModelArch
    device: Literal["cuda", "cpu"]

    @property
    def local_mini_batch(self) -> int:
        """Sequences per optimizer step on one data-parallel rank: ppo_mini_batch_size*n/dp."""
        return self.workload.ppo_mini_batch_size * self.workload.n // self.cluster.world_size

    @property
    def requests_per_gpu(self) -> int:
        return self.workload.train_batch_size * self.workload.n // self.cluster.world_size


def _divisors(value: int) -> list[int]:
    """The divisors of ``value`` in ascending order, in O(sqrt(value))."""
    small = [d for d in range(1, math.isqrt(value) + 1) if value % d == 0]
    return small + [value // d for d in reversed(small) if d * d != value]


def _powers_of_two(low: int, high: int) -> list[int]:
    out, v = [], 1
    while v <= high:
        if v >= low:
            out.append(v)
        v *= 2
    return out


def _gmu(ctx: SpaceContext) -> list[float]:
    return [round(0.30 + 0.05 * i, 2) for i in range(14)]  # 0.30 .. 0.95


def _mnbt(ctx: SpaceContext) -> list[int]:
    high = 65536 if ctx.device == "cuda" else 8192
    return _powers_of_two(256 if ctx.device == "cpu" else 1024, high)


def _mns(ctx: SpaceContext) -> list[int]:
    # More concurrent sequences than requests a replica ever sees changes nothing.
    requests = max(ctx.requests_per_gpu, 1) * ctx.cluster.n_gpus_per_node
    high = min(1024, 1 << max(requests - 1, 1).bit_length())
    return _powers_of_two(min(8 if ctx.device == "cpu" else 32, high), high)


def _tp(ctx: SpaceContext) -> list[int]:
    if ctx.device == "cpu":
        return [1]
    return [tp for tp in _divisors(ctx.cluster.n_gpus_per_node) if ctx.arch.num_attention_heads % tp == 0]


def _bucket_megabytes(ctx: SpaceContext) -> list[int]:
    # The tiny CPU model's fp32 weights are ~2 MB: only a bucket of 1 MB splits them.
    return _powers_of_two(256, 4096) if ctx.device == "cuda" else [1, 2048]


def _bools(ctx: SpaceContext) -> list[bool]:
    return [False, True]


def _offload(ctx: SpaceContext) -> list[bool]:
    return [False] if ctx.device == "cpu" else [False, True]


def _micro(ctx: SpaceContext) -> list[int]:
    return _divisors(ctx.local_mini_batch)


def _token_len(ctx: SpaceContext) -> list[int]:
    longest = ctx.workload.max_sequence_length
    return [longest * f for f in (1, 2, 3, 4, 6, 8)]


@dataclass(frozen=True)
class Knob:
    """One tunable knob and everything the tuner knows about it."""

    path: str
    kind: Literal["float", "int", "bool"]
    phase: Literal["rollout", "train"]
    doc: str
    trial_field: tuple[Literal["rollout", "train"], str]
    candidates: Callable[[SpaceContext], list[Any]]
    baseline: Any
    vllm_arg: str | None = None
    sglang_arg: str | None = None
    # Only searched when this holds for the (partial) config proposed so far.
    applies: Callable[[SpaceContext, dict[str, Any]], bool] = lambda ctx, cfg: True
    # A key absent from verl's YAML needs Hydra's "+" prefix.
    hydra_plus: bool = False
    # The rollout engines verl passes the knob to; for the others it is not searched,
    # not exported and not accepted in a job's search section.
    engines: tuple[str, ...] = ("vllm", "sglang")
    # The values verl (and its engines) accept at all; None: the kind's own
    # (``domains.KIND_DOMAINS``: ints >= 1 within int32, any finite float, true/false).
    domain: Domain | None = None

    def refuses(self, value: Any, *, bound: bool = False) -> str | None:
        """Why ``value`` is not a value of this knob (its type, its domain); None if it is.
        ``bound``: the end of a search range (any number within the domain)."""
        return refusal(
            self.path, self.kind, self.domain or KIND_DOMAINS.get(self.kind, Domain()), value, bound=bound
        )

    # Searched unless the job says otherwise; False: held at its baseline unless the job's
    # search section names it (a knob whose other values rarely pay, e.g. padded rows).
    searched_by_default: bool = True
    # What trials measured before the knob was in this table (a recorded landscape's points
    # name no value for it); None: its baseline.
    recorded_before: Any = None

    @property
    def value_before_table(self) -> Any:
        return self.baseline if self.recorded_before is None else self.recorded_before

    def relevant(self, ctx: SpaceContext, cfg: dict[str, Any]) -> bool:
        """Whether the knob reaches a config: the job's engine takes it and it applies."""
        return ctx.workload.engine in self.engines and self.applies(ctx, cfg)


def _static(ctx: SpaceContext, cfg: dict[str, Any]) -> bool:
    return not cfg.get("actor_rollout_ref.actor.use_dynamic_bsz", False)


def _dynamic(ctx: SpaceContext, cfg: dict[str, Any]) -> bool:
    return bool(cfg.get("actor_rollout_ref.actor.use_dynamic_bsz", False))


def _ref_static(ctx: SpaceContext, cfg: dict[str, Any]) -> bool:
    return ctx.workload.use_kl_loss and _static(ctx, cfg)


def _has_ref(ctx: SpaceContext, cfg: dict[str, Any]) -> bool:
    return ctx.workload.use_kl_loss


def _entropy_in_update(ctx: SpaceContext, cfg: dict[str, Any]) -> bool:
    return ctx.workload.entropy_coeff != 0


R = "actor_rollout_ref.rollout."
A = "actor_rollout_ref.actor."
SGLANG_KWARGS = R + "engine_kwargs.sglang."

_TABLE: list[Knob] = [
    Knob(
        R + "gpu_memory_utilization",
        "float",
        "rollout",
        "Fraction of device memory the rollout engine may take (weights + KV cache).",
        ("rollout", "gpu_memory_utilization"),
        _gmu,
        0.5,
        vllm_arg="gpu_memory_utilization",
        sglang_arg="mem_fraction_static",
        domain=Domain(low=0, high=1, low_open=True),
    ),
    Knob(
        R + "max_num_batched_tokens",
        "int",
        "rollout",
        "Token budget of one engine step (prefill chunk size).",
        ("rollout", "max_num_batched_tokens"),
        _mnbt,
        8192,
        vllm_arg="max_num_batched_tokens",
        engines=("vllm",),
    ),
    # verl passes no max_num_batched_tokens to SGLang; its counterpart is this raw engine
    # argument. It travels in the trial's max_num_batched_tokens field (the engine's tokens
    # per step), which the SGLang backend passes as chunked_prefill_size. Baseline: what
    # SGLang picks itself on a GPU of 60-160 GiB (H100, H200), verl setting nothing.
    Knob(
        SGLANG_KWARGS + "chunked_prefill_size",
        "int",
        "rollout",
        "Token budget of one SGLang prefill chunk (engine_kwargs.sglang.chunked_prefill_size).",
        ("rollout", "max_num_batched_tokens"),
        _mnbt,
        8192,
        sglang_arg="chunked_prefill_size",
        hydra_plus=True,
        engines=("sglang",),
        domain=Domain(low=1, high=2**31 - 1, special=(-1,)),  # -1: chunked prefill off
    ),
    Knob(
        R + "max_num_seqs",
        "int",
        "rollout",
        "Most sequences the engine runs concurrently.",
        ("rollout", "max_num_seqs"),
        _mns,
        256,
        vllm_arg="max_num_seqs",
        sglang_arg="max_running_requests",
    ),
    Knob(
        R + "tensor_model_parallel_size",
        "int",
        "rollout",
        "Rollout tensor parallelism; replicas = GPUs / TP.",
        ("rollout", "tensor_model_parallel_size"),
        _tp,
        2,
        vllm_arg="tensor_parallel_size",
        sglang_arg="tp_size",
    ),
    Knob(
        R + "enforce_eager",
        "bool",
        "rollout",
        "Run the engine eagerly (no CUDA graphs / torch.compile).",
        ("rollout", "enforce_eager"),
        _bools,
        False,
        vllm_arg="enforce_eager",
        sglang_arg="disable_cuda_graph",
    ),
    Knob(
        R + "checkpoint_engine.update_weights_bucket_megabytes",
        "int",
        "rollout",
        "Bucket size (MB) of the actor -> engine weight sync before every rollout.",
        ("rollout", "update_weights_bucket_megabytes"),
        _bucket_megabytes,
        2048,  # verl v0.9.0 trainer/config/rollout/rollout.yaml
    ),
    Knob(
        A + "use_dynamic_bsz",
        "bool",
        "train",
        "Pack micro-batches by a token budget instead of a fixed count.",
        ("train", "use_dynamic_bsz"),
        _bools,
        False,
    ),
    Knob(
        A + "ppo_micro_batch_size_per_gpu",
        "int",
        "train",
        "Sequences per fwd/bwd micro-batch of the actor update.",
        ("train", "ppo_micro_batch_size_per_gpu"),
        _micro,
        2,
        applies=_static,
    ),
    Knob(
        R + "log_prob_micro_batch_size_per_gpu",
        "int",
        "train",
        "Sequences per micro-batch of the actor's old-log-prob forward.",
        ("train", "log_prob_micro_batch_size_per_gpu"),
        _micro,
        2,
        applies=_static,
    ),
    Knob(
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
        "int",
        "train",
        "Sequences per micro-batch of the reference model's forward.",
        ("train", "ref_log_prob_micro_batch_size_per_gpu"),
        _micro,
        2,
        applies=_ref_static,
    ),
    Knob(
        A + "ppo_max_token_len_per_gpu",
        "int",
        "train",
        "Token budget per micro-batch of the actor update (dynamic batch size).",
        ("train", "ppo_max_token_len_per_gpu"),
        _token_len,
        16384,
        applies=_dynamic,
    ),
    Knob(
        R + "log_prob_max_token_len_per_gpu",
        "int",
        "train",
        "Token budget per micro-batch of the log-prob forwards (dynamic batch size).",
        ("train", "log_prob_max_token_len_per_gpu"),
        _token_len,
        16384,
        applies=_dynamic,
    ),
    Knob(
        "actor_rollout_ref.model.enable_gradient_checkpointing",
        "bool",
        "train",
        "Recompute activations in the backward pass (less memory, more compute).",
        ("train", "enable_gradient_checkpointing"),
        _bools,
        True,
    ),
    Knob(
        A + "fsdp_config.param_offload",
        "bool",
        "train",
        "Keep the actor's parameters on the CPU outside its own phases.",
        ("train", "param_offload"),
        _offload,
        False,
    ),
    Knob(
        "actor_rollout_ref.model.use_remove_padding",
        "bool",
        "train",
        "Pack each micro-batch's sequences into one row (flash-attention varlen) instead of "
        "padding them to the longest.",
        ("train", "use_remove_padding"),
        _bools,
        True,
        searched_by_default=False,
        recorded_before=False,  # trials padded every micro-batch before 2026-11-24
    ),
    Knob(
        "actor_rollout_ref.ref.fsdp_config.param_offload",
        "bool",
        "train",
        "The reference model's offload. verl v0.9's FSDP engine offloads a forward-only "
        "module to the CPU whatever this says (verl/workers/engine/fsdp/transformer_impl.py), "
        "so trials stream the ref from the CPU either way; exported as set.",
        ("train", "ref_param_offload"),
        _offload,
        False,
        applies=_has_ref,
        searched_by_default=False,
        recorded_before=True,  # trials streamed the ref from the CPU before 2026-11-24
    ),
    Knob(
        A + "entropy_from_logits_with_chunking",
        "bool",
        "train",
        "Compute the logits' entropy 2048 rows at a time (less memory in the log-prob forward).",
        ("train", "entropy_from_logits_with_chunking"),
        _bools,
        False,
        searched_by_default=False,
    ),
    Knob(
        A + "entropy_checkpointing",
        "bool",
        "train",
        "Recompute the update's entropy in the backward instead of keeping it (entropy_coeff > 0).",
        ("train", "entropy_checkpointing"),
        _bools,
        False,
        applies=_entropy_in_update,
    ),
    Knob(
        A + "fsdp_config.optimizer_offload",
        "bool",
        "train",
        "Keep the optimizer state on the CPU outside the optimizer step.",
        ("train", "optimizer_offload"),
        _offload,
        False,
    ),
]

KNOBS: dict[str, Knob] = {k.path: k for k in _TABLE}
