"""The full config the runner launches verl with, composed and checked as verl does.

A run's Hydra overrides are the trial's (``VerlRunSpec.overrides``, what
``autotuner.export`` writes for it) plus the runner's own (``runner_overrides``): the
random checkpoint and its tokenizer, the synthetic dataset, the agent loop that draws
each request's length, a constant reward, GRPO, no validation, no checkpoint, console and
file logging, ``steps`` steps, and a private Ray (its own temp folder, no dashboard). A
trial override of a key the runner owns is refused (``RunnerKeyConflict``).

``compose`` builds the config as ``verl.trainer.main_ppo`` does (Hydra's compose of
``verl/trainer/config/ppo_trainer.yaml`` with the overrides); ``validate`` runs the checks
``main_ppo`` runs before it starts Ray (``validate_config``) and those its trainer and
workers run when they build their typed configs (``omega_conf_to_dataclass`` of the actor,
reference, rollout, model, data and checkpoint-engine sections: the model section loads
the tokenizer and ``config.json`` from the checkpoint). Both import verl: call them in
verl's environment only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trials.errors import InvalidTrialSpec
from trials.profiling import PROFILE_ENV
from trials.verl.checkpoint import tokenizer_dir
from trials.verl.trace import SETUP_HOOK, TRACE_ENV
from trials.verl.types import AGENT_NAME, VerlRunSpec

REWARD_FILE = Path(__file__).resolve().parent / "reward.py"
AGENT_LOOP_TARGET = "trials.verl.agent_loop.WorkloadAgentLoop"
MAIN_MODULE = "verl.trainer.main_ppo"


class RunnerKeyConflict(InvalidTrialSpec):
    """Raised when a trial's overrides set a key the verl runner owns (model, data, reward,
    trainer, agent loop, Ray); the message names the keys."""


@dataclass(frozen=True)
class RunPaths:
    """Where one run's files go: everything under ``workdir`` but the cached checkpoint."""

    workdir: Path
    checkpoint: Path
    ray_temp_dir: Path  # short: Ray's socket paths must fit in 107 bytes

    @property
    def dataset(self) -> Path:
        return self.workdir / "train.parquet"

    @property
    def agent_loops(self) -> Path:
        return self.workdir / "agent_loops.yaml"

    @property
    def metrics(self) -> Path:
        return self.workdir / "metrics.jsonl"

    @property
    def arrivals(self) -> Path:
        return self.workdir / "arrivals.json"

    @property
    def log(self) -> Path:
        return self.workdir / "verl.log"

    @property
    def trace(self) -> Path:
        return self.workdir / "trace"


def hydra_value(value: Any) -> str:
    """``value`` in Hydra's override grammar (strings quoted)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def runner_settings(spec: VerlRunSpec, paths: RunPaths) -> dict[str, Any]:
    """The keys the runner owns, by Hydra path (a leading ``+``: absent from verl's YAML)."""
    return {
        "actor_rollout_ref.model.path": str(paths.checkpoint),
        "actor_rollout_ref.model.tokenizer_path": str(tokenizer_dir(paths.checkpoint)),
        "actor_rollout_ref.rollout.load_format": "dummy",
        "actor_rollout_ref.rollout.agent.default_agent_loop": AGENT_NAME,
        "actor_rollout_ref.rollout.agent.agent_loop_config_path": str(paths.agent_loops),
        "actor_rollout_ref.rollout.dtype": spec.dtype,
        "data.train_files": str(paths.dataset),
        "data.val_files": str(paths.dataset),
        "data.shuffle": False,
        "data.dataloader_num_workers": 0,
        "data.prompt_key": "prompt",
        "data.return_raw_chat": True,
        "algorithm.adv_estimator": spec.adv_estimator,
        "reward.custom_reward_function.path": str(REWARD_FILE),
        "reward.custom_reward_function.name": "constant_reward",
        "trainer.logger": ["console", "file"],
        "trainer.project_name": "autotuner",
        "trainer.experiment_name": spec.run_id,
        "trainer.total_epochs": 1,
        "trainer.total_training_steps": spec.steps,
        "trainer.val_before_train": False,
        "trainer.test_freq": -1,
        "trainer.save_freq": -1,
        "trainer.resume_mode": "disable",
        "trainer.default_local_dir": str(paths.workdir / "checkpoints"),
        "trainer.device": spec.device,
        "+ray_kwargs.ray_init.include_dashboard": False,
        "+ray_kwargs.ray_init._temp_dir": str(paths.ray_temp_dir),
    } | (trace_settings(paths, spec.profile) if spec.trace else {})


def trace_settings(paths: RunPaths, profile: str | None = None) -> dict[str, Any]:
    """verl's Ray runs the tracer's setup in each worker it starts, told where to write (and,
    with ``profile``, where its profiles go: ``trials.profiling``)."""
    settings = {
        "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook": SETUP_HOOK,
        f"+ray_kwargs.ray_init.runtime_env.env_vars.{TRACE_ENV}": str(paths.trace),
    }
    if profile:
        settings[f"+ray_kwargs.ray_init.runtime_env.env_vars.{PROFILE_ENV}"] = profile
    return settings


def _key(line: str) -> str:
    return line.split("=", 1)[0].lstrip("+~")


def runner_overrides(spec: VerlRunSpec, paths: RunPaths) -> list[str]:
    """The trial's override lines, then the runner's; refused when they share a key."""
    trial = [line.strip() for line in spec.overrides if line.strip() and not line.lstrip().startswith("#")]
    owned = runner_settings(spec, paths)
    clash = sorted({_key(line) for line in trial} & {k.lstrip("+") for k in owned})
    if clash:
        raise RunnerKeyConflict(
            f"the trial's overrides set {', '.join(clash)}, which the verl runner sets itself "
            "(model, data, reward, trainer, agent loop, Ray); leave them out of the trial's config"
        )
    return trial + [f"{key}={hydra_value(value)}" for key, value in owned.items()]


def write_agent_loops(paths: RunPaths) -> Path:
    """The YAML list verl reads custom agent loops from."""
    paths.agent_loops.parent.mkdir(parents=True, exist_ok=True)
    paths.agent_loops.write_text(f"- name: {AGENT_NAME}\n  _target_: {AGENT_LOOP_TARGET}\n")
    return paths.agent_loops


def verl_config_dir() -> Path:
    """verl's own Hydra config folder (``verl/trainer/config``)."""
    import verl.trainer.main_ppo as main_ppo

    return Path(main_ppo.__file__).resolve().parent / "config"


def compose(overrides: list[str]) -> Any:
    """verl's ``ppo_trainer`` config with ``overrides``, composed as ``main_ppo`` composes it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=overrides)


def validate(config: Any) -> dict[str, str]:
    """Run verl's own checks on ``config``; returns the typed configs' class names.

    ``main_ppo``'s ``validate_config``, then what verl's actor-rollout-ref worker
    (``verl/workers/engine_workers.py``, ``init_model``) does with the resolved config: its
    typed model, reference (after the same key renames), actor, rollout and
    checkpoint-engine configs, and its assertions on them. Raises what verl raises."""
    from omegaconf import OmegaConf, open_dict
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config
    from verl.utils.device import auto_set_device

    auto_set_device(config)
    use_ref = need_reference_policy(config)
    validate_config(config=config, use_reference_policy=use_ref, use_critic=need_critic(config))
    config = OmegaConf.create(OmegaConf.to_container(config, resolve=True))  # as the trainer resolves it
    arr = config.actor_rollout_ref
    typed = {
        "model": omega_conf_to_dataclass(arr.model),
        "actor": omega_conf_to_dataclass(arr.actor),
        "rollout": omega_conf_to_dataclass(arr.rollout),
        "checkpoint_engine": omega_conf_to_dataclass(arr.rollout.checkpoint_engine),
        "algorithm": omega_conf_to_dataclass(config.algorithm),
    }
    if use_ref:
        with open_dict(arr.ref):  # the worker's renames, verbatim
            arr.ref.ppo_mini_batch_size = arr.actor.ppo_mini_batch_size
            arr.ref.ppo_micro_batch_size = arr.ref.pop("log_prob_micro_batch_size", None)
            arr.ref.ppo_micro_batch_size_per_gpu = arr.ref.pop("log_prob_micro_batch_size_per_gpu", None)
            arr.ref.use_dynamic_bsz = arr.ref.pop("log_prob_use_dynamic_bsz", False)
            arr.ref.ppo_max_token_len_per_gpu = arr.ref.pop("log_prob_max_token_len_per_gpu", None)
        typed["ref"] = omega_conf_to_dataclass(arr.ref)
    _worker_checks(config)
    return {name: type(value).__name__ for name, value in typed.items()}


def _worker_checks(config: Any) -> None:
    """The assertions verl's worker makes before it builds the actor and the rollout."""
    arr, trainer = config.actor_rollout_ref, config.trainer
    if arr.actor.use_dynamic_bsz != arr.rollout.log_prob_use_dynamic_bsz:
        raise ValueError(
            f"actor.use_dynamic_bsz ({arr.actor.use_dynamic_bsz}) differs from "
            f"rollout.log_prob_use_dynamic_bsz ({arr.rollout.log_prob_use_dynamic_bsz}); "
            "verl's worker asserts they are equal"
        )
    pairs = (
        [
            ("rollout.log_prob_max_token_len_per_gpu", arr.rollout.log_prob_max_token_len_per_gpu),
            ("actor.ppo_max_token_len_per_gpu", arr.actor.ppo_max_token_len_per_gpu),
        ]
        if arr.actor.use_dynamic_bsz
        else [
            ("rollout.log_prob_micro_batch_size_per_gpu", arr.rollout.log_prob_micro_batch_size_per_gpu),
            ("actor.ppo_micro_batch_size_per_gpu", arr.actor.ppo_micro_batch_size_per_gpu),
        ]
    )
    for name, value in pairs:
        if value is None:
            raise ValueError(f"actor_rollout_ref.{name} is unset; verl's worker asserts it is set")
    world = trainer.n_gpus_per_node * trainer.nnodes
    rollout_world = (
        arr.rollout.tensor_model_parallel_size
        * arr.rollout.data_parallel_size
        * arr.rollout.pipeline_model_parallel_size
    )
    if world % rollout_world:
        raise ValueError(
            f"rollout world_size {world} is not divisible by the rollout's TP x DP x PP ({rollout_world}); "
            "verl's worker asserts it is"
        )
