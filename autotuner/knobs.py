"""The one table of tunable knobs: everything the tuner knows about each knob is its row.

Every knob is named by its verl Hydra path from spec to export. ``candidates`` gives the
values worth trying for a workload on a cluster (before user overrides); ``baseline`` is
what verl v0.9.0 uses when the key is left alone (repaired to a valid value where
verl's default would be rejected, e.g. TP 2 on one GPU); ``trial_field`` says where the
value goes in a ``TrialSpec``; ``engine_args`` the argument each rollout engine takes it
as (the trial's backend passes every one it is given, ``engine_arguments``); ``side`` and
``memory`` its roles in phase composition (``autotuner.compose``), feasibility
(``autotuner.feasibility``) and the memory model (``autotuner.memory``); ``rules`` verl's
and the engines' checks of its value (``autotuner.rules`` runs them with the job-wide ones).

verl leaves the micro-batch sizes unset (``null``); their baseline, 2, is the value verl's
own example sets (``examples/grpo_trainer/run_qwen3_4b_fsdp.sh`` at v0.9.0).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from autotuner.domains import KIND_DOMAINS, Domain, refusal
from trials.rollout import BACKENDS  # the engines' names: no engine is imported

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


Side = Literal["engine", "actor", "both"]


@dataclass(frozen=True)
class Rule:
    """One of verl's (or an engine's) checks of a knob's value: ``check(value, config, ctx)``
    says why ``value`` (None: the config does not set the knob) breaks rule ``id`` in
    ``config``, or None when it holds."""

    id: str
    check: Callable[[Any, dict[str, Any], SpaceContext], str | None]


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
    # The argument each rollout engine takes the knob's trial field as ({engine: argument});
    # the service sends the job's engine's to the trial (``engine_arguments``) and its backend
    # passes them as they are. Empty: no engine argument (the trial itself uses the value).
    engine_args: dict[str, str] = field(default_factory=dict, hash=False)
    # Only searched (and exported) when this holds for the workload and the (partial) config
    # proposed so far.
    applies: Callable[[Workload, dict[str, Any]], bool] = lambda workload, cfg: True
    # A key absent from verl's YAML needs Hydra's "+" prefix.
    hydra_plus: bool = False
    # The rollout engines verl passes the knob to (default: every registered engine); for
    # the others it is not searched, not exported and not accepted in a job's search section.
    engines: tuple[str, ...] = tuple(BACKENDS)
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

    # Its side in phase composition (``autotuner.compose``): "engine" (the rollout's
    # phases depend on it), "actor" (the train phases do) or "both" (a train knob that
    # changes what is resident beside the engine); None: its phase's side.
    side: Side | None = None
    # Its role in memory: "grows" (more of it never needs less memory, the rest fixed:
    # a measured OOM rules out its larger neighbours, ``autotuner.feasibility``), "mode"
    # (it switches the engine's own overhead, e.g. CUDA graphs or eager: the memory model
    # fits the engine's phases per value, ``autotuner.memory``); None: neither.
    memory: Literal["grows", "mode"] | None = None
    # verl's and the engine's checks of its value wherever it reaches a config
    # (``autotuner.rules.violations``; ids as in docs/verl-rules.md).
    rules: tuple[Rule, ...] = ()

    @property
    def composition_side(self) -> Side:
        """``side``, or its phase's: the rollout's knobs are the engine's, the train's the actor's."""
        if self.side is not None:
            return self.side
        return "engine" if self.phase == "rollout" else "actor"

    @property
    def value_before_table(self) -> Any:
        return self.baseline if self.recorded_before is None else self.recorded_before

    def relevant(self, ctx: SpaceContext, cfg: dict[str, Any]) -> bool:
        """Whether the knob reaches a config: the job's engine takes it and it applies."""
        return ctx.workload.engine in self.engines and self.applies(ctx.workload, cfg)


def _static(workload: Workload, cfg: dict[str, Any]) -> bool:
    return not cfg.get("actor_rollout_ref.actor.use_dynamic_bsz", False)


def _dynamic(workload: Workload, cfg: dict[str, Any]) -> bool:
    return bool(cfg.get("actor_rollout_ref.actor.use_dynamic_bsz", False))


def _ref_static(workload: Workload, cfg: dict[str, Any]) -> bool:
    return workload.use_kl_loss and _static(workload, cfg)


def _has_ref(workload: Workload, cfg: dict[str, Any]) -> bool:
    return workload.use_kl_loss


def _entropy_in_update(workload: Workload, cfg: dict[str, Any]) -> bool:
    return workload.entropy_coeff != 0


R = "actor_rollout_ref.rollout."
A = "actor_rollout_ref.actor."
SGLANG_KWARGS = R + "engine_kwargs.sglang."


# --------------------------------------------------------------------------- rules of one knob


def _tp_divides_world(tp: Any, cfg: dict[str, Any], ctx: SpaceContext) -> str | None:
    world = ctx.cluster.world_size
    if tp is None or (int(tp) >= 1 and world % int(tp) == 0):
        return None
    return f"rollout world size {world} is not divisible by TP {tp}"


def _tp_fills_nodes(tp: Any, cfg: dict[str, Any], ctx: SpaceContext) -> str | None:
    per_node = ctx.cluster.n_gpus_per_node
    if tp is None or _tp_divides_world(tp, cfg, ctx) or int(tp) <= per_node or int(tp) % per_node == 0:
        return None  # a TP that does not divide the world breaks R1 already
    return f"a TP {tp} replica neither fits in one node ({per_node} GPUs) nor fills whole nodes"


def _tp_divides_heads(tp: Any, cfg: dict[str, Any], ctx: SpaceContext) -> str | None:
    heads = ctx.arch.num_attention_heads
    if tp is None or int(tp) < 1 or heads % int(tp) == 0:
        return None
    return f"attention heads ({heads}) are not divisible by TP {tp}"


def _fraction(value: Any, cfg: dict[str, Any], ctx: SpaceContext) -> str | None:
    return None if value is None or 0 < float(value) <= 1 else f"{value} is outside (0, 1]"


def _tokens_cover_seqs(value: Any, cfg: dict[str, Any], ctx: SpaceContext) -> str | None:
    seqs = int(cfg.get(R + "max_num_seqs", 256))
    if value is None or int(value) >= seqs:
        return None
    return f"max_num_batched_tokens ({value}) must be >= max_num_seqs ({seqs})"


def _chunk_size(value: Any, cfg: dict[str, Any], ctx: SpaceContext) -> str | None:
    if value is None or int(value) >= 1 or int(value) == -1:
        return None
    return f"{value} is neither a positive chunk size nor -1 (chunked prefill off)"


def _set(value: Any, cfg: dict[str, Any], ctx: SpaceContext) -> str | None:
    return "must be set when use_dynamic_bsz is False" if value is None else None


def _divides_local_mini(value: Any, cfg: dict[str, Any], ctx: SpaceContext) -> str | None:
    local_mini = ctx.local_mini_batch
    if value is None or (int(value) >= 1 and not (local_mini and local_mini % int(value))):
        return None
    return (
        f"micro-batch {value} does not divide the per-GPU mini-batch ppo_mini_batch_size*n/dp = {local_mini}"
    )


def _covers_longest(value: Any, cfg: dict[str, Any], ctx: SpaceContext) -> str | None:
    longest = ctx.workload.max_sequence_length
    if value is not None and int(value) >= longest:
        return None
    return (
        f"token budget {value} is below the longest sequence "
        f"(max_prompt_length+max_response_length = {longest})"
    )


TP_RULES = (Rule("R1", _tp_divides_world), Rule("R2", _tp_fills_nodes), Rule("R1", _tp_divides_heads))
MICRO_BATCH_RULES = (Rule("S3/S7/S8", _set), Rule("R8", _divides_local_mini))
TOKEN_BUDGET_RULES = (Rule("R9", _covers_longest),)

_TABLE: list[Knob] = [
    Knob(
        R + "gpu_memory_utilization",
        "float",
        "rollout",
        "Fraction of device memory the rollout engine may take (weights + KV cache).",
        ("rollout", "gpu_memory_utilization"),
        _gmu,
        0.5,
        engine_args={"vllm": "gpu_memory_utilization", "sglang": "mem_fraction_static"},
        domain=Domain(low=0, high=1, low_open=True),
        memory="grows",
        rules=(Rule("V1", _fraction),),
    ),
    Knob(
        R + "max_num_batched_tokens",
        "int",
        "rollout",
        "Token budget of one engine step (prefill chunk size).",
        ("rollout", "max_num_batched_tokens"),
        _mnbt,
        8192,
        engine_args={"vllm": "max_num_batched_tokens"},
        engines=("vllm",),
        memory="grows",
        rules=(Rule("V2", _tokens_cover_seqs),),
    ),
    # verl passes no max_num_batched_tokens to SGLang; its counterpart is this raw engine
    # argument. It travels in the trial's max_num_batched_tokens field (the engine's tokens
    # per step), which SGLang takes as chunked_prefill_size. Baseline: what
    # SGLang picks itself on a GPU of 60-160 GiB (H100, H200), verl setting nothing.
    Knob(
        SGLANG_KWARGS + "chunked_prefill_size",
        "int",
        "rollout",
        "Token budget of one SGLang prefill chunk (engine_kwargs.sglang.chunked_prefill_size).",
        ("rollout", "max_num_batched_tokens"),
        _mnbt,
        8192,
        engine_args={"sglang": "chunked_prefill_size"},
        hydra_plus=True,
        engines=("sglang",),
        domain=Domain(low=1, high=2**31 - 1, special=(-1,)),  # -1: chunked prefill off
        memory="grows",
        rules=(Rule("G1", _chunk_size),),
    ),
    Knob(
        R + "max_num_seqs",
        "int",
        "rollout",
        "Most sequences the engine runs concurrently.",
        ("rollout", "max_num_seqs"),
        _mns,
        256,
        engine_args={"vllm": "max_num_seqs", "sglang": "max_running_requests"},
        memory="grows",
    ),
    Knob(
        R + "tensor_model_parallel_size",
        "int",
        "rollout",
        "Rollout tensor parallelism; replicas = GPUs / TP.",
        ("rollout", "tensor_model_parallel_size"),
        _tp,
        2,
        engine_args={"vllm": "tensor_parallel_size", "sglang": "tp_size"},
        rules=TP_RULES,
    ),
    Knob(
        R + "enforce_eager",
        "bool",
        "rollout",
        "Run the engine eagerly (no CUDA graphs / torch.compile).",
        ("rollout", "enforce_eager"),
        _bools,
        False,
        engine_args={"vllm": "enforce_eager", "sglang": "disable_cuda_graph"},
        memory="mode",
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
        memory="grows",
        rules=MICRO_BATCH_RULES,
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
        memory="grows",
        rules=MICRO_BATCH_RULES,
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
        memory="grows",
        rules=MICRO_BATCH_RULES,
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
        memory="grows",
        rules=TOKEN_BUDGET_RULES,
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
        memory="grows",
        rules=TOKEN_BUDGET_RULES,
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
        side="both",  # the memory resident beside the engine
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
        side="both",  # the memory resident beside the engine
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
        A + "fsdp_config.use_torch_compile",
        "bool",
        "train",
        "Compute the logits' entropy through torch.compile on packed rows (verl's default: "
        "no vocabulary-wide temporary beside the logits in the log-prob forward).",
        ("train", "use_torch_compile"),
        _bools,
        True,
        searched_by_default=False,
        recorded_before=False,  # every trial computed the entropy eagerly until 2026-11-27
    ),
    Knob(
        A + "fsdp_config.optimizer_offload",
        "bool",
        "train",
        "Keep the optimizer state on the CPU outside the optimizer step.",
        ("train", "optimizer_offload"),
        _offload,
        False,
        side="both",  # the memory resident beside the engine
    ),
]

KNOBS: dict[str, Knob] = {k.path: k for k in _TABLE}


def engine_arguments(engine: str) -> dict[str, str]:
    """The arguments ``engine`` takes the knobs as, each with the trial field that holds its
    value ({argument: ``RolloutKnobs`` field}): what a trial's backend passes its engine."""
    return {
        k.engine_args[engine]: k.trial_field[1]
        for k in KNOBS.values()
        if engine in k.engine_args and engine in k.engines
    }


def memory_knobs(role: Literal["grows", "mode"]) -> tuple[str, ...]:
    """The paths of the knobs with this memory role (``Knob.memory``)."""
    return tuple(path for path, k in KNOBS.items() if k.memory == role)
