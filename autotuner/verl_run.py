"""Turn a job and one trial's config into the verl step runner's ``VerlRunSpec``.

The overrides are exactly what ``autotuner export --format overrides`` prints for the
trial (so verl measures the config a user would adopt); the lengths are drawn from the
job's seed, step after step, each step's batch as ``trialspec.draw_batch`` draws one (the
first step's batch is the one every trial of the job was measured on).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from autotuner.export import to_overrides
from autotuner.spec import JobSpec, ModelArch
from trials.verl.types import VerlRunSpec

DEFAULT_STEPS = 4  # the first is a warm-up: three measured steps


def draw_steps(spec: JobSpec, steps: int) -> tuple[list[int], list[list[int]]]:
    """Prompt lengths (``train_batch_size`` per step) and each prompt's ``n`` response lengths."""
    w = spec.workload
    rng = np.random.default_rng(spec.seed)
    prompts: list[int] = []
    responses: list[list[int]] = []
    for _ in range(steps):
        step_prompts = w.prompt_length.draw(w.train_batch_size, rng, w.max_prompt_length)
        step_responses = w.response_length.draw(w.train_batch_size * w.n, rng, w.max_response_length)
        prompts += [int(p) for p in step_prompts]
        responses += [
            [int(r) for r in step_responses[i * w.n : (i + 1) * w.n]] for i in range(w.train_batch_size)
        ]
    return prompts, responses


def override_lines(config: dict[str, Any], spec: JobSpec) -> list[str]:
    """The trial's Hydra override lines, as the export writes them (header dropped)."""
    text = to_overrides(config, spec, {})
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def verl_run_spec(
    spec: JobSpec,
    arch: ModelArch,
    config: dict[str, Any],
    run_id: str,
    device: Literal["cuda", "cpu"] = "cuda",
    steps: int = DEFAULT_STEPS,
) -> VerlRunSpec:
    """The runner's spec for ``config`` (a trial's flat config) of the job ``spec``."""
    prompts, responses = draw_steps(spec, steps)
    return VerlRunSpec(
        run_id=run_id,
        model_name=arch.name,
        model_config=dict(arch.config),
        overrides=override_lines(config, spec),
        prompt_lengths=prompts,
        response_lengths=responses,
        train_batch_size=spec.workload.train_batch_size,
        n=spec.workload.n,
        dtype=spec.workload.dtype,
        device=device,
        steps=steps,
        seed=spec.seed,
    )
