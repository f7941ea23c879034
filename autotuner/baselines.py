"""verl's own example commands as a job's baselines, cited by path and tag.

Every job runs two baselines of verl's before the search: its YAML defaults
(``SearchSpace.baseline_config``, named ``verl-v0.9-defaults``) and the knobs of the
example command verl v0.9.0 ships for a model of the job's size:

- ``examples/grpo_trainer/run_qwen3_4b_fsdp.sh`` for models up to ``SMALL_MODEL_PARAMS``;
- ``examples/grpo_trainer/run_qwen3_8b_fsdp.sh`` above (its ``gpu`` branch).

Only the knobs the tuner searches are taken; an example value the job's space does not
hold (a token budget below the workload's longest sequence, which verl would reject; a TP
that does not divide the GPUs) is moved to the nearest value the space holds, the larger
on a tie, and the move is named in the baseline's ``repairs``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autotuner.knobs import KNOBS, A, R

TAG = "v0.9.0"
# The two baselines every job runs, by the names a job reports them under; a job's own
# baselines take other names.
DEFAULTS_BASELINE = "verl-v0.9-defaults"
EXAMPLE_BASELINE = "verl-v0.9-example"
RESERVED_BASELINES = (DEFAULTS_BASELINE, EXAMPLE_BASELINE)
SMALL_MODEL_PARAMS = 5_000_000_000
REF = "actor_rollout_ref.ref."
MODEL = "actor_rollout_ref.model."

# The knobs each script sets (its defaults for the user-adjustable variables), verbatim.
EXAMPLES: dict[str, dict[str, Any]] = {
    "examples/grpo_trainer/run_qwen3_4b_fsdp.sh": {
        MODEL + "use_remove_padding": True,
        MODEL + "enable_gradient_checkpointing": True,
        A + "ppo_micro_batch_size_per_gpu": 2,
        A + "fsdp_config.param_offload": False,
        A + "fsdp_config.optimizer_offload": False,
        A + "ppo_max_token_len_per_gpu": 3000,
        A + "use_dynamic_bsz": True,
        R + "log_prob_micro_batch_size_per_gpu": 2,
        R + "tensor_model_parallel_size": 2,
        R + "gpu_memory_utilization": 0.6,
        R + "enforce_eager": False,
        R + "log_prob_max_token_len_per_gpu": 4096,
        R + "checkpoint_engine.update_weights_bucket_megabytes": 4096,
        REF + "log_prob_micro_batch_size_per_gpu": 2,
        REF + "fsdp_config.param_offload": True,
    },
    "examples/grpo_trainer/run_qwen3_8b_fsdp.sh": {
        MODEL + "use_remove_padding": True,
        MODEL + "enable_gradient_checkpointing": True,
        A + "use_dynamic_bsz": True,
        A + "ppo_max_token_len_per_gpu": 24576,
        A + "fsdp_config.param_offload": False,
        A + "fsdp_config.optimizer_offload": False,
        R + "tensor_model_parallel_size": 2,
        R + "gpu_memory_utilization": 0.6,
        R + "log_prob_max_token_len_per_gpu": 24576,
        REF + "fsdp_config.param_offload": True,
    },
}


@dataclass(frozen=True)
class ExampleBaseline:
    """One example command's knobs as a baseline of a job."""

    name: str  # e.g. "verl-v0.9-example" (the baseline's name in the job)
    script: str  # the example's path in verl's repository, at ``TAG``
    config: dict[str, Any]  # knob path -> value, within the job's space
    repairs: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # path -> (example's, used)


def example_script(num_parameters: int) -> str:
    """The example command verl ships for a model of this size."""
    size = "4b" if num_parameters <= SMALL_MODEL_PARAMS else "8b"
    return f"examples/grpo_trainer/run_qwen3_{size}_fsdp.sh"


def example_baseline(num_parameters: int, allowed: dict[str, list[Any]]) -> ExampleBaseline:
    """The example's knobs for a model of ``num_parameters``, each within ``allowed``
    (knob path -> the values the job's space holds for it; a knob absent from it is not
    searched and keeps the job's own value)."""
    script = example_script(num_parameters)
    config: dict[str, Any] = {}
    repairs: dict[str, tuple[Any, Any]] = {}
    for path, value in EXAMPLES[script].items():
        values = allowed.get(path)
        if path not in KNOBS or not values:
            continue
        used = value if value in values else _nearest(value, values)
        config[path] = used
        if used != value:
            repairs[path] = (value, used)
    return ExampleBaseline(EXAMPLE_BASELINE, script, config, repairs)


def _nearest(value: Any, values: list[Any]) -> Any:
    if isinstance(value, bool) or not all(isinstance(v, (int, float)) for v in values):
        return values[0]
    return min(values, key=lambda v: (abs(float(v) - float(value)), -float(v)))


def citation(baseline: ExampleBaseline) -> str:
    """Where the baseline comes from, and what was moved to fit the job."""
    moved = "; ".join(f"{p.rsplit('.', 1)[-1]} {a} -> {b}" for p, (a, b) in sorted(baseline.repairs.items()))
    return f"verl {TAG} {baseline.script}" + (f" (moved to fit the job: {moved})" if moved else "")
