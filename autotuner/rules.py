"""verl's (and the engines') rules that reject a config, checked before anything runs.

Rule ids are those of docs/verl-rules.md section 3, which names the file of verl v0.9.0's
source each comes from (S* at start-up, R* at worker init); ``V*`` are vLLM's own start-up
checks, ``G*`` SGLang's. A knob's own checks are on its row (``Knob.rules``); this module
runs them for every knob that reaches the config (the job's engine takes it and it
applies), and checks the workload's batch sizes and the context length itself. A knob
verl does not pass to the job's engine (``Knob.engines``) is never in its configs.
``violations`` looks at a flat config keyed by verl Hydra paths, as the search space
proposes and the exporter writes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotuner.knobs import KNOBS, A, R, SpaceContext
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

    def bad(rule: str, key: str, message: str) -> None:
        out.append(Violation(rule, key, message))

    batch = workload.train_batch_size * workload.n
    mini = workload.ppo_mini_batch_size * workload.n
    if batch % world:
        bad("S1", "data.train_batch_size", f"train_batch_size*n ({batch}) % GPUs ({world}) != 0")
    if mini % world:
        bad("R7", A + "ppo_mini_batch_size", f"ppo_mini_batch_size*n ({mini}) % dp ({world}) != 0")
    if workload.train_batch_size < workload.ppo_mini_batch_size:
        bad("S4", A + "ppo_mini_batch_size", "train_batch_size < ppo_mini_batch_size")

    ctx = SpaceContext(workload, cluster, arch, "cuda")  # no rule depends on the device
    for path, knob in KNOBS.items():
        if not knob.rules or not knob.relevant(ctx, config):
            continue
        for rule in knob.rules:
            message = rule.check(config.get(path), config, ctx)
            if message is not None:
                bad(rule.id, path, message)

    max_model_len = config.get(R + "max_model_len")
    if max_model_len is not None and int(max_model_len) > arch.max_position_embeddings:
        bad(
            "R4",
            R + "max_model_len",
            f"{max_model_len} exceeds max_position_embeddings ({arch.max_position_embeddings})",
        )
    return out
