"""The search space: every config it lets run passes verl's rules; overrides are honoured."""

from __future__ import annotations

import json

import optuna
import pytest

from autotuner.errors import SpecError
from autotuner.knobs import KNOBS, A, R
from autotuner.rules import violations
from autotuner.space import SearchSpace
from autotuner.spec import parse_job_spec

optuna.logging.set_verbosity(optuna.logging.WARNING)

WORKLOADS = [
    (
        {
            "model": "qwen2.5-7b",
            "train_batch_size": 256,
            "n": 8,
            "ppo_mini_batch_size": 64,
            "max_response_length": 3072,
        },
        {"n_gpus_per_node": 8},
    ),
    (
        {"model": "qwen2.5-1.5b", "train_batch_size": 96, "n": 5, "ppo_mini_batch_size": 24},
        {"n_gpus_per_node": 4, "nnodes": 2},
    ),
    (
        {
            "model": "llama-3.1-8b",
            "train_batch_size": 64,
            "n": 1,
            "ppo_mini_batch_size": 16,
            "use_kl_loss": False,
        },
        {"n_gpus_per_node": 2},
    ),
    (
        {
            "model": "qwen2.5-0.5b",
            "train_batch_size": 32,
            "n": 4,
            "ppo_mini_batch_size": 8,
            "engine": "sglang",
        },
        {"n_gpus_per_node": 1},
    ),
]


def _space(workload, cluster, search=None, device="cuda"):
    spec = parse_job_spec({"workload": workload, "cluster": cluster, "search": search or {}})
    return spec, SearchSpace.build(spec, spec.validate_model(), device)


@pytest.mark.parametrize(("workload", "cluster"), WORKLOADS)
def test_200_draws_that_may_run_all_pass_verls_rules(workload, cluster) -> None:
    spec, space = _space(workload, cluster)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=7))
    runnable = 0
    for _ in range(200):
        trial = study.ask()
        proposal = space.suggest(trial)
        config = proposal.config
        # The verdict is the rules' own; a runnable config must break none of them.
        assert proposal.valid == (violations(config, spec.workload, spec.cluster, space.arch) == [])
        if proposal.valid:
            runnable += 1
            tp = config[R + "tensor_model_parallel_size"]
            assert spec.cluster.world_size % tp == 0 and space.arch.num_attention_heads % tp == 0
            local = spec.workload.ppo_mini_batch_size * spec.workload.n // spec.cluster.world_size
            if config[A + "use_dynamic_bsz"]:
                assert A + "ppo_micro_batch_size_per_gpu" not in config
                assert config[A + "ppo_max_token_len_per_gpu"] >= spec.workload.max_sequence_length
            else:
                assert local % config[A + "ppo_micro_batch_size_per_gpu"] == 0
                assert local % config[R + "log_prob_micro_batch_size_per_gpu"] == 0
            for path, value in config.items():
                if path in space.searched:
                    assert value in space.searched[path]
            assert config[R + "max_model_len"] == spec.workload.max_sequence_length
        study.tell(trial, 0.0)
    assert runnable >= 150


def test_rules_reject_what_verl_rejects() -> None:
    spec, space = _space(*WORKLOADS[0])
    good = space.baseline_config()
    assert violations(good, spec.workload, spec.cluster, space.arch) == []
    cases = {
        R + "tensor_model_parallel_size": (8, "R1"),  # 28 heads are not divisible by 8
        A + "ppo_micro_batch_size_per_gpu": (3, "R8"),  # 256*8/8 = 256 per GPU... 64*8/8=64
        R + "max_num_seqs": (16384, "V2"),
        R + "gpu_memory_utilization": (1.5, "V1"),
    }
    for key, (value, rule) in cases.items():
        found = violations(good | {key: value}, spec.workload, spec.cluster, space.arch)
        assert [v.rule for v in found] == [rule], (key, found)
    dyn = good | {
        A + "use_dynamic_bsz": True,
        A + "ppo_max_token_len_per_gpu": 1024,
        R + "log_prob_max_token_len_per_gpu": 8192,
    }
    assert [v.rule for v in violations(dyn, spec.workload, spec.cluster, space.arch)] == ["R9"]


def test_baseline_is_verls_defaults_repaired_for_one_gpu() -> None:
    spec, space = _space(
        {"model": "qwen2.5-1.5b", "train_batch_size": 16, "n": 2, "ppo_mini_batch_size": 6},
        {"n_gpus_per_node": 1},
    )
    base = space.baseline_config()
    assert base[R + "gpu_memory_utilization"] == 0.5
    assert base[R + "max_num_seqs"] == 256 and base[R + "max_num_batched_tokens"] == 8192
    assert base[R + "tensor_model_parallel_size"] == 1  # verl's 2 fails on one GPU (#1191)
    # verl leaves it unset; 2 is its example command's value (and divides 6*2=12).
    assert base[A + "ppo_micro_batch_size_per_gpu"] == 2
    assert base["actor_rollout_ref.model.use_remove_padding"] is True
    assert violations(base, spec.workload, spec.cluster, space.arch) == []


def test_overrides_fix_narrow_restrict_and_drop() -> None:
    spec, space = _space(
        *WORKLOADS[0],
        search={
            R + "enforce_eager": True,
            R + "gpu_memory_utilization": {"low": 0.6, "high": 0.8},
            R + "max_num_seqs": [128, 512],
            A + "fsdp_config.param_offload": {"drop": True},
        },
    )
    assert space.fixed[R + "enforce_eager"] is True
    assert space.searched[R + "gpu_memory_utilization"] == [0.6, 0.65, 0.7, 0.75, 0.8]
    assert space.searched[R + "max_num_seqs"] == [128, 512]
    assert space.fixed[A + "fsdp_config.param_offload"] is False
    assert A + "fsdp_config.param_offload" not in space.searched


def test_train_only_jobs_do_not_search_rollout_knobs() -> None:
    workload = dict(WORKLOADS[0][0], phases="train")
    _, space = _space(workload, WORKLOADS[0][1])
    assert not [k for k in space.searched if KNOBS[k].phase == "rollout"]


@pytest.mark.parametrize(
    ("search", "field", "hint"),
    [
        (
            {R + "tensor_model_parallel_size": 3},
            "search." + R + "tensor_model_parallel_size.fixed",
            "not divisible by TP 3",
        ),
        (
            {A + "ppo_micro_batch_size_per_gpu": [3, 4]},
            "search." + A + "ppo_micro_batch_size_per_gpu.choices",
            "does not divide",
        ),
        ({R + "max_num_seqs": {"low": 3000, "high": 4000}}, "search." + R + "max_num_seqs", "no valid value"),
        ({R + "enforce_eager": "sometimes"}, "search." + R + "enforce_eager.fixed", "not a bool"),
        ({R + "enforce_eager": {"low": 0, "high": 1}}, "search." + R + "enforce_eager", "no range"),
    ],
)
def test_impossible_overrides_fail_before_anything_runs(search, field, hint) -> None:
    with pytest.raises(SpecError) as info:
        _space(*WORKLOADS[0], search=search)
    assert info.value.field == field
    assert hint in str(info.value)


def test_the_grid_is_every_distinct_runnable_config_the_search_can_propose() -> None:
    spec, space = _space(
        {"model": "qwen2.5-0.5b", "train_batch_size": 32, "n": 4, "ppo_mini_batch_size": 8},
        {"n_gpus_per_node": 1},
        {
            A + "use_dynamic_bsz": [False, True],
            A + "ppo_micro_batch_size_per_gpu": [1, 4],
            R + "max_num_seqs": [256, 512],
            R + "max_num_batched_tokens": [256, 4096],
            R + "gpu_memory_utilization": 0.5,
            R + "log_prob_micro_batch_size_per_gpu": 4,
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 4,
            A + "ppo_max_token_len_per_gpu": 16384,
            R + "log_prob_max_token_len_per_gpu": 16384,
            R + "enforce_eager": True,
            R + "checkpoint_engine.update_weights_bucket_megabytes": 2048,
            "actor_rollout_ref.model.enable_gradient_checkpointing": True,
            A + "fsdp_config.param_offload": False,
            A + "fsdp_config.optimizer_offload": False,
            "actor_rollout_ref.ref.fsdp_config.param_offload": False,
        },
    )
    grid = space.grid()
    keys = [json.dumps(c, sort_keys=True) for c in grid]
    assert len(keys) == len(set(keys))
    assert all(not violations(c, spec.workload, spec.cluster, space.arch) for c in grid)
    # mnbt 256 < mns 512 breaks V2 (the other 3 pairs run); micro-batches apply only without
    # dynamic batch size: (2 static micro x 3 runnable mns/mnbt) + (1 x 3 dynamic).
    assert len(grid) == 2 * 3 + 3
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(60):
        proposal = space.suggest(study.ask())
        if proposal.valid:
            assert json.dumps(proposal.config, sort_keys=True) in keys


def test_sglang_searches_its_chunk_size_and_refuses_vllms_token_budget() -> None:
    sglang, vllm = dict(WORKLOADS[3][0]), dict(WORKLOADS[3][0], engine="vllm")
    chunk = R + "engine_kwargs.sglang.chunked_prefill_size"
    _, space = _space(sglang, WORKLOADS[3][1])
    assert chunk in space.searched and R + "max_num_batched_tokens" not in space.searched
    base = space.baseline_config()
    assert base[chunk] == 8192 and R + "max_num_batched_tokens" not in base
    assert chunk in {row["knob"] for row in space.describe()}
    assert R + "max_num_batched_tokens" not in {row["knob"] for row in space.describe()}
    _, space = _space(vllm, WORKLOADS[3][1])
    assert chunk not in space.searched and chunk not in space.baseline_config()
    with pytest.raises(SpecError, match="counterpart for sglang is " + chunk.replace(".", r"\.")):
        _space(sglang, WORKLOADS[3][1], {R + "max_num_batched_tokens": [4096, 8192]})
    with pytest.raises(SpecError, match="does not pass this knob to vllm"):
        _space(vllm, WORKLOADS[3][1], {chunk: 4096})
    _, space = _space(sglang, WORKLOADS[3][1], {chunk: [2048, 4096]})
    assert space.searched[chunk] == [2048, 4096]
