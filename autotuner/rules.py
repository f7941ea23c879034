"""verl's (and the engines') rules that reject a config, checked before anything runs.

Rule ids are those of docs/verl-rules.md section 3, which names the file of verl v0.9.0's
source each comes from (S* at start-up, R* at worker init); ``V*`` are vLLM's own start-up
checks, ``G*`` SGLang's. A knob verl does not pass to the job's engine (``Knob.engines``) is
never in its configs. ``violations`` looks at a flat config keyed by verl Hydra paths, as the
search space proposes and the exporter writes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotuner.knobs import SGLANG_KWARGS, A, R
from autotuner.spec import Cluster, ModelArch, Workload


@dataclass(frozen=True)
class Violation:
    rule: str
    key: str
    message: str

    def __str__(self) -> str:
        return f"[{self.rule}] {self.key}: {self.message}"


def violations(
    config: dict[str, Any], workload: Workload, cluster: Cluster, arch: ModelArch
) -> list[Violation]:
    """Every rule the config breaks; empty when verl and the engine would accept it."""
    out: list[Violation] = []
    world = cluster.world_size
    tp = int(config.get(R + "tensor_model_parallel_size", 1))

    def bad(rule: str, key: str, message: str) -> None:
        out.append(Violation(rule, key, message))

    if tp < 1 or world % tp:
        bad("R1", R + "tensor_model_parallel_size", f"rollout world size {world} is not divisible by TP {tp}")
    elif tp > cluster.n_gpus_per_node and tp % cluster.n_gpus_per_node:
        bad(
            "R2",
            R + "tensor_model_parallel_size",
            f"a TP {tp} replica neither fits in one node ({cluster.n_gpus_per_node} GPUs) "
            "nor fills whole nodes",
        )
    if tp >= 1 and arch.num_attention_heads % tp:
        bad(
            "R1",
            R + "tensor_model_parallel_size",
            f"attention heads ({arch.num_attention_heads}) are not divisible by TP {tp}",
        )

    batch = workload.train_batch_size * workload.n
    mini = workload.ppo_mini_batch_size * workload.n
    if batch % world:
        bad("S1", "data.train_batch_size", f"train_batch_size*n ({batch}) % GPUs ({world}) != 0")
    if mini % world:
        bad("R7", A + "ppo_mini_batch_size", f"ppo_mini_batch_size*n ({mini}) % dp ({world}) != 0")
    if workload.train_batch_size < workload.ppo_mini_batch_size:
        bad("S4", A + "ppo_mini_batch_size", "train_batch_size < ppo_mini_batch_size")

    dynamic = bool(config.get(A + "use_dynamic_bsz", False))
    local_mini = mini // world if world else 0
    longest = workload.max_sequence_length
    if dynamic:
        token_keys = [A + "ppo_max_token_len_per_gpu", R + "log_prob_max_token_len_per_gpu"]
        for key in token_keys:
            value = config.get(key)
            if value is None or int(value) < longest:
                bad(
                    "R9",
                    key,
                    f"token budget {value} is below the longest sequence "
                    f"(max_prompt_length+max_response_length = {longest})",
                )
    else:
        micro_keys = [A + "ppo_micro_batch_size_per_gpu", R + "log_prob_micro_batch_size_per_gpu"]
        if workload.use_kl_loss:
            micro_keys.append("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu")
        for key in micro_keys:
            value = config.get(key)
            if value is None:
                bad("S3/S7/S8", key, "must be set when use_dynamic_bsz is False")
            elif int(value) < 1 or (local_mini and local_mini % int(value)):
                bad(
                    "R8",
                    key,
                    f"micro-batch {value} does not divide the per-GPU mini-batch "
                    f"ppo_mini_batch_size*n/dp = {local_mini}",
                )

    gmu = config.get(R + "gpu_memory_utilization", 0.5)
    if not 0 < float(gmu) <= 1:
        bad("V1", R + "gpu_memory_utilization", f"{gmu} is outside (0, 1]")
    mnbt = int(config.get(R + "max_num_batched_tokens", 8192))
    mns = int(config.get(R + "max_num_seqs", 256))
    if workload.engine == "vllm" and mnbt < mns:
        bad(
            "V2",
            R + "max_num_batched_tokens",
            f"max_num_batched_tokens ({mnbt}) must be >= max_num_seqs ({mns})",
        )
    chunk = config.get(SGLANG_KWARGS + "chunked_prefill_size")
    if workload.engine == "sglang" and chunk is not None and int(chunk) < 1 and int(chunk) != -1:
        bad(
            "G1",
            SGLANG_KWARGS + "chunked_prefill_size",
            f"{chunk} is neither a positive chunk size nor -1 (chunked prefill off)",
        )
    max_model_len = config.get(R + "max_model_len")
    if max_model_len is not None and int(max_model_len) > arch.max_position_embeddings:
        bad(
            "R4",
            R + "max_model_len",
            f"{max_model_len} exceeds max_position_embeddings ({arch.max_position_embeddings})",
        )
    return out
