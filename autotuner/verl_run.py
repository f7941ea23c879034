"""Turn a job and one trial's config into the verl step runner's ``VerlRunSpec``.

The overrides are exactly what ``autotuner export --format overrides`` prints for the
trial (so verl measures the config a user would adopt); the lengths are drawn by the runner
from the job's distributions and seed (``trialspec.batch_draw``): the service holds no list
per request. By default every step runs the batch every trial of the job was measured on
(``VerlRunSpec.repeat_batch``), so a trial's error against verl is the trial's, not the
difference between two draws of a small batch, and the spread of verl's steps is the run's
noise; ``repeat_batch=False`` draws a new batch for each step, as training meets new data.
"""

from __future__ import annotations

from typing import Any, Literal

from autotuner.export import to_overrides
from autotuner.spec import JobSpec, ModelArch
from autotuner.trialspec import batch_draw
from trials.verl.types import VerlRunSpec

DEFAULT_STEPS = 4  # the first is a warm-up: three measured steps


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
    repeat_batch: bool = True,
) -> VerlRunSpec:
    """The runner's spec for ``config`` (a trial's flat config) of the job ``spec``."""
    return VerlRunSpec(
        run_id=run_id,
        model_name=arch.name,
        model_config=dict(arch.config),
        overrides=override_lines(config, spec),
        prompt_lengths=[],
        response_lengths=[],
        batch=batch_draw(spec),
        repeat_batch=repeat_batch,
        train_batch_size=spec.workload.train_batch_size,
        n=spec.workload.n,
        dtype=spec.workload.dtype,
        device=device,
        steps=steps,
        seed=spec.seed,
    )
