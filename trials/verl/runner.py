"""Run verl's own trainer on one config, in verl's environment, and read back its metrics.

``prepare`` writes what the runner owns (the cached random checkpoint and tokenizer, the
dataset, the agent-loop list) and the full override list; ``preflight`` also composes the
config and runs verl's own checks on it (``trials.verl.overrides``), and reads the
dataset back through verl's ``RLHFDataset`` with the tokenizer, as verl's trainer does;
``run`` does that, then ``python -m verl.trainer.main_ppo`` with the overrides in a child
process of this one (so in the session the launcher kills at the deadline, and verl's own
Ray, started by ``main_ppo``, inside its private temp folder), and returns a
``VerlRunResult`` from verl's logged metrics.

verl's Ray is private: the child's environment has no ``RAY_*`` variable (no
``RAY_ADDRESS``: ``ray.init()`` then starts a new local cluster instead of joining the
tuner's), and ``ray_kwargs.ray_init`` gives it its own temp folder and no dashboard.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from trials.failures import OOM, match_text
from trials.launcher import log_tail
from trials.lengths import steps_lengths
from trials.verl.checkpoint import checkpoint_dir, ensure_checkpoint, tokenizer_dir
from trials.verl.dataset import write_dataset
from trials.verl.metrics import StepClock, read_arrivals, read_steps, summarize
from trials.verl.overrides import (
    MAIN_MODULE,
    RunPaths,
    compose,
    runner_overrides,
    validate,
    write_agent_loops,
)
from trials.verl.trace import read_trace
from trials.verl.types import VerlRunResult, VerlRunSpec

PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
STEP_POLL_S = 1.0  # how often the runner looks for a step verl logged
VERSIONED = ("verl", "torch", "transformers", "vllm", "sglang", "ray", "tensordict", "flash-attn")


def drawn(spec: VerlRunSpec) -> VerlRunSpec:
    """``spec`` with every step's lengths drawn from ``spec.batch`` (unchanged without one)."""
    if spec.batch is None:
        return spec
    prompts, responses = steps_lengths(spec.batch, spec.steps, repeat=spec.repeat_batch)
    return dataclasses.replace(spec, batch=None, prompt_lengths=prompts, response_lengths=responses)


def prepare(spec: VerlRunSpec, paths: RunPaths, weights: bool = True) -> list[str]:
    """Write the run's files; the full override list (``weights=False``: a checkpoint of
    config and tokenizer only, enough for verl's checks of the config)."""
    spec = drawn(spec)
    if spec.steps < spec.warmup_steps + 1:
        raise ValueError(f"steps ({spec.steps}) must exceed warmup_steps ({spec.warmup_steps})")
    need = spec.train_batch_size * spec.steps
    if len(spec.prompt_lengths) < need:
        raise ValueError(
            f"{len(spec.prompt_lengths)} prompt lengths for {spec.steps} steps of {spec.train_batch_size} "
            f"prompts; give at least {need}"
        )
    ensure_checkpoint(spec.model_config, spec.model_name, spec.dtype, paths.checkpoint.parent, weights)
    write_dataset(paths.dataset, spec.model_config, spec.prompt_lengths, spec.response_lengths, spec.seed)
    write_agent_loops(paths)
    return runner_overrides(spec, paths)


def run_paths(
    spec: VerlRunSpec, workdir: Path, cache_dir: Path, ray_temp_dir: Path, weights: bool = True
) -> RunPaths:
    """The run's paths: its files in ``workdir``, the checkpoint cached under ``cache_dir``."""
    checkpoint = checkpoint_dir(spec.model_config, spec.model_name, spec.dtype, cache_dir, weights)
    return RunPaths(workdir=Path(workdir), checkpoint=checkpoint, ray_temp_dir=Path(ray_temp_dir))


def preflight(spec: VerlRunSpec, paths: RunPaths, weights: bool = True) -> dict[str, Any]:
    """``prepare``, then compose and validate as verl does; what was checked, with each
    dataset row's prompt length in tokens and response lengths as verl's dataset reads them."""
    overrides = prepare(spec, paths, weights)
    config = compose(overrides)
    typed = validate(config)
    prompt_tokens, response_lengths = _dataset_lengths(config, paths)
    rollout = config.actor_rollout_ref.rollout
    return {
        "overrides": overrides,
        "typed_configs": typed,
        "continuous_token_builder": _continuous_token_builder(spec, paths),
        "dataset_prompt_tokens": prompt_tokens,
        "dataset_response_lengths": response_lengths,
        "config": {
            "rollout.name": rollout.name,
            # the FSDP verl's engines build (its typed configs copy these to the engines)
            "actor.strategy": config.actor_rollout_ref.actor.strategy,
            "ref.strategy": config.actor_rollout_ref.ref.strategy,
            "rollout.load_format": rollout.load_format,
            "rollout.agent.default_agent_loop": rollout.agent.default_agent_loop,
            "trainer.total_training_steps": config.trainer.total_training_steps,
            "trainer.logger": list(config.trainer.logger),
            "algorithm.adv_estimator": config.algorithm.adv_estimator,
            "ray_init.runtime_env": _container(config.ray_kwargs.ray_init.get("runtime_env")),
        },
    }


def _container(node: Any) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(node, resolve=True) if node is not None else None


def _continuous_token_builder(spec: VerlRunSpec, paths: RunPaths) -> str:
    """The class of the tokenization helper verl's agent loop builds at start-up for the
    model's family and the runner's tokenizer (``create_continuous_token_builder``, which
    raises where the tokenizer lacks what that family needs)."""
    from verl.utils import hf_tokenizer
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    tokenizer = hf_tokenizer(str(tokenizer_dir(paths.checkpoint)))
    builder = create_continuous_token_builder(tokenizer, hf_model_type=spec.model_config.get("model_type"))
    return type(builder).__name__


def _dataset_lengths(config: Any, paths: RunPaths) -> tuple[list[int], list[list[int]]]:
    """Each row's prompt length in tokens and its response lengths, as verl's dataset and
    tokenizer see them."""
    from verl.trainer.ppo.utils import create_rl_dataset
    from verl.utils import hf_tokenizer

    tokenizer = hf_tokenizer(str(tokenizer_dir(paths.checkpoint)))
    dataset = create_rl_dataset([str(paths.dataset)], config.data, tokenizer, None, is_train=True)
    prompts, responses = [], []
    for i in range(len(dataset)):
        row = dataset[i]
        ids = tokenizer.apply_chat_template(
            list(row["raw_prompt"]), tokenize=True, add_generation_prompt=True, return_dict=False
        )
        prompts.append(len(ids))
        responses.append([int(x) for x in row["extra_info"]["response_lengths"]])
    return prompts, responses


def versions() -> dict[str, str]:
    """The versions of verl and what it runs on, as this environment has them."""
    found = {}
    for name in VERSIONED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def verl_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """``main_ppo``'s environment: this one without ``RAY_*`` (verl's Ray stays private),
    this repository on ``PYTHONPATH`` (verl's workers import the agent loop from it)."""
    env = {k: v for k, v in (base if base is not None else os.environ).items() if not k.startswith("RAY_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run(spec: VerlRunSpec, paths: RunPaths, python: str = sys.executable) -> VerlRunResult:
    """Run verl for ``spec.steps`` steps; never raises for verl's failure."""
    start = time.monotonic()
    result = VerlRunResult(spec.run_id, "error", warmup_steps=spec.warmup_steps, versions=versions())
    result.device, result.hostname = spec.device, socket.gethostname()
    try:
        overrides = preflight(spec, paths)["overrides"]
    except Exception as exc:  # noqa: BLE001  (verl's checks raise many types; all are a verdict)
        result.error_type, result.error_message = type(exc).__name__, f"verl refused the config: {exc}"
        result.wall_s = time.monotonic() - start
        return result
    env = verl_env() | {"VERL_FILE_LOGGER_PATH": str(paths.metrics)}
    clock = StepClock(paths.metrics, paths.arrivals, start)
    with open(paths.log, "wb") as log:
        proc = subprocess.Popen(
            [python, "-m", MAIN_MODULE, *overrides],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(paths.workdir),
        )
        try:
            while proc.poll() is None:
                clock.poll(time.monotonic())
                time.sleep(STEP_POLL_S)
        finally:
            if proc.poll() is None:  # this runner is being stopped: verl goes with it
                proc.kill()
            code = proc.wait()
    clock.poll(time.monotonic())
    collect(result, paths, code)
    result.wall_s = time.monotonic() - start
    return result


def collect(result: VerlRunResult, paths: RunPaths, code: int | None) -> VerlRunResult:
    """Fill ``result`` from the run's logs; ``code`` is ``main_ppo``'s exit status (None:
    killed before it ended, the caller sets the status)."""
    result.steps, result.measured = summarize(read_steps(paths.metrics, paths.log), result.warmup_steps)
    result.log_tail = log_tail(paths.log)
    result.trace = read_trace(paths.trace)
    result.step_logged_at_s = read_arrivals(paths.arrivals)
    if code is None:
        return result
    if code == 0 and len(result.steps) > result.warmup_steps and result.measured:
        result.status = "ok"
        return result
    note = match_text(result.log_tail[-4000:])
    result.status = "oom" if note is not None and note.status == OOM else "error"
    result.error_type = note.error_type if note is not None else "VerlRunFailed"
    result.error_message = f"verl's main_ppo exited with {code} after {len(result.steps)} logged step(s)"
    return result
