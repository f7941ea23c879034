"""Export: every sampled config becomes verl keys that round-trip and that verl accepts."""

from __future__ import annotations

import re
from typing import Any

import optuna
import pytest
import yaml

from autotuner import knobs
from autotuner.export import (
    VERL_KEYS,
    ExportError,
    load_exported_yaml,
    to_overrides,
    to_yaml,
    verl_config,
)
from autotuner.knobs import KNOBS, A, Knob, R
from autotuner.rules import violations
from autotuner.space import SearchSpace
from autotuner.spec import Cluster, JobSpec, Workload

REF = "actor_rollout_ref.ref."
SGLANG_CHUNK = R + "engine_kwargs.sglang.chunked_prefill_size"

# Keys of verl v0.9.0's ppo_trainer YAML (verl/trainer/config/*.yaml at v0.9.0; docs/verl-rules.md).
VERL_V090_YAML_KEYS = {
    "data.train_batch_size",
    "data.max_prompt_length",
    "data.max_response_length",
    "trainer.n_gpus_per_node",
    "trainer.nnodes",
    "actor_rollout_ref.model.path",
    "actor_rollout_ref.model.enable_gradient_checkpointing",
    "actor_rollout_ref.model.enable_activation_offload",
    "actor_rollout_ref.model.use_remove_padding",
    "actor_rollout_ref.model.use_fused_kernels",
    "actor_rollout_ref.model.use_liger",
    A + "strategy",
    A + "ppo_mini_batch_size",
    A + "ppo_micro_batch_size_per_gpu",
    A + "use_dynamic_bsz",
    A + "ppo_max_token_len_per_gpu",
    A + "use_kl_loss",
    A + "ulysses_sequence_parallel_size",
    A + "entropy_from_logits_with_chunking",
    A + "entropy_coeff",
    A + "entropy_checkpointing",
    A + "use_torch_compile",
    A + "pad_to_length",
    A + "fsdp_config.param_offload",
    A + "fsdp_config.optimizer_offload",
    A + "fsdp_config.offload_policy",
    A + "fsdp_config.forward_prefetch",
    A + "fsdp_config.fsdp_size",
    A + "fsdp_config.reshard_after_forward",
    A + "fsdp_config.model_dtype",
    A + "fsdp_config.use_torch_compile",
    REF + "log_prob_micro_batch_size_per_gpu",
    REF + "log_prob_use_dynamic_bsz",
    REF + "log_prob_max_token_len_per_gpu",
    REF + "fsdp_config.param_offload",
    R + "name",
    R + "mode",
    R + "gpu_memory_utilization",
    R + "max_num_batched_tokens",
    R + "max_num_seqs",
    R + "max_model_len",
    R + "tensor_model_parallel_size",
    R + "data_parallel_size",
    R + "expert_parallel_size",
    R + "pipeline_model_parallel_size",
    R + "enforce_eager",
    R + "cudagraph_capture_sizes",
    R + "free_cache_engine",
    R + "enable_chunked_prefill",
    R + "enable_prefix_caching",
    R + "log_prob_micro_batch_size_per_gpu",
    R + "log_prob_use_dynamic_bsz",
    R + "log_prob_max_token_len_per_gpu",
    R + "n",
    R + "prompt_length",
    R + "response_length",
    R + "load_format",
    R + "calculate_log_probs",
    R + "multi_stage_wake_up",
    R + "agent.num_workers",
    R + "checkpoint_engine.update_weights_bucket_megabytes",
}
# Dataclass-only keys: real, but Hydra needs "+key=value" (verl-knobs.md section 0).
VERL_V090_PLUS_KEYS = {
    R + "enable_sleep_mode",
    R + "repetition_penalty",
    R + "limit_images",
    R + "standalone_gpu_memory_utilization",
    R + "moe_tensor_parallel_size",
    A + "ppo_infer_micro_batch_size_per_gpu",
    A + "ppo_infer_max_token_len_per_gpu",
    A + "fsdp_config.use_dynamic_bsz",
    A + "fsdp_config.micro_batch_size_per_gpu",
    A + "fsdp_config.max_token_len_per_gpu",
    A + "fsdp_config.grad_offload",
    A + "fsdp_config.mixed_precision",
    # Raw engine arguments, merged last by verl (section 1, engine_kwargs; section 0: "+").
    R + "engine_kwargs.sglang.chunked_prefill_size",
}
MICRO_KEYS = [A + "ppo_micro_batch_size_per_gpu", R + "log_prob_micro_batch_size_per_gpu"]
TOKEN_KEYS = [A + "ppo_max_token_len_per_gpu", R + "log_prob_max_token_len_per_gpu"]
DEPRECATED_GLOBAL_KEYS = {
    A + "ppo_micro_batch_size",
    R + "log_prob_micro_batch_size",
    REF + "log_prob_micro_batch_size",
}
HEADER = {
    "trial": 17,
    "device": "NVIDIA H100 80GB HBM3",
    "date": "2026-09-01",
    "metrics": {
        "throughput_tokens_per_s_per_gpu": 1234.5678,
        "step_time_s": 41.25,
        "peak_memory_gib": 61.5,
        "rollout_generated_tokens_per_s": 20480.0,
    },
}


def _spec(model: str, gpus: int, nnodes: int = 1, **workload: Any) -> JobSpec:
    return JobSpec(
        name="export-test",
        workload=Workload(model=model, **workload),
        cluster=Cluster(n_gpus_per_node=gpus, nnodes=nnodes),
    )


WORKLOADS = {
    "1gpu-n1-kl-vllm": _spec("tiny", 1, n=1, use_kl_loss=True, train_batch_size=32, ppo_mini_batch_size=16),
    "4gpu-n8-nokl-vllm": _spec(
        "qwen2.5-0.5b",
        4,
        n=8,
        use_kl_loss=False,
        train_batch_size=64,
        ppo_mini_batch_size=32,
        max_prompt_length=1024,
        max_response_length=2048,
    ),
    "8gpu-n8-kl-sglang": _spec(
        "llama-3.1-8b",
        8,
        n=8,
        use_kl_loss=True,
        engine="sglang",
        train_batch_size=128,
        ppo_mini_batch_size=32,
    ),
    "2x4gpu-n1-nokl-sglang": _spec(
        "qwen2.5-7b",
        4,
        nnodes=2,
        n=1,
        use_kl_loss=False,
        engine="sglang",
        train_batch_size=64,
        ppo_mini_batch_size=16,
    ),
    "8gpu-n8-kl-vllm-rollout-only": _spec(
        "qwen3-8b", 8, n=8, use_kl_loss=True, phases="rollout", train_batch_size=64, ppo_mini_batch_size=64
    ),
}


def _sampled_configs(spec: JobSpec, count: int = 120, seed: int = 0) -> list[dict[str, Any]]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    arch = spec.validate_model()
    space = SearchSpace.build(spec, arch, "cuda")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    configs = []
    for _ in range(count):
        trial = study.ask()
        proposal = space.suggest(trial)
        study.tell(trial, 0.0)
        if proposal.valid:
            configs.append(proposal.config)
    return configs


def _parse_hydra_value(text: str) -> Any:
    """The bits of Hydra's override grammar the exporter writes."""
    if text in ("True", "False"):
        return text == "True"
    if text == "null":
        return None
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1]
        return [_parse_hydra_value(part) for part in inner.split(",")] if inner else []
    if text.startswith("'") and text.endswith("'"):
        return re.sub(r"\\(.)", r"\1", text[1:-1])
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if re.fullmatch(r"-?\d+\.\d*(e[-+]?\d+)?|-?\d+e[-+]?\d+", text):
        return float(text)
    assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_./-]*", text), f"unquoted odd string {text!r}"
    return text


def _parse_overrides(text: str) -> tuple[dict[str, Any], set[str]]:
    """Flat values, and the keys written with "+"."""
    values, plus = {}, set()
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep and " " not in line, f"not a single override: {line!r}"
        if key.startswith("+"):
            key = key[1:]
            plus.add(key)
        assert key not in values, f"{key} written twice"
        values[key] = _parse_hydra_value(value)
    return values, plus


def _typed(config: dict[str, Any]) -> dict[str, tuple[type, Any]]:
    return {k: (type(v), v) for k, v in config.items()}


def _header(text: str) -> str:
    lines = text.splitlines()
    return "\n".join(line for line in lines if line.startswith("#"))


# --------------------------------------------------------------------------- invariants


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_every_sampled_config_exports_cleanly(name: str) -> None:
    spec = WORKLOADS[name]
    w = spec.workload
    arch = spec.validate_model()
    configs = _sampled_configs(spec)
    assert len(configs) >= 20, "too few valid proposals to say anything"
    modes = set()
    for config in configs:
        flat = verl_config(config, spec)
        dynamic = flat[A + "use_dynamic_bsz"]
        modes.add(dynamic)

        assert set(flat) <= VERL_KEYS
        assert not set(flat) & DEPRECATED_GLOBAL_KEYS
        for key, value in config.items():  # the tuned values are what is emitted
            if key in flat:
                assert flat[key] == value
        # Batching keys of the chosen mode only; the ref's only when the ref runs.
        for key in MICRO_KEYS:
            assert (key in flat) == (not dynamic), key
        for key in TOKEN_KEYS:
            assert (key in flat) == dynamic, key
        assert (REF + "log_prob_micro_batch_size_per_gpu" in flat) == (not dynamic and w.use_kl_loss)
        assert (REF + "log_prob_max_token_len_per_gpu" in flat) == (dynamic and w.use_kl_loss)
        if dynamic and w.use_kl_loss:
            assert flat[REF + "log_prob_max_token_len_per_gpu"] >= w.max_sequence_length
        # What the workload fixes.
        assert flat[R + "max_model_len"] == w.max_prompt_length + w.max_response_length
        assert flat[R + "max_num_seqs"] >= 1
        assert flat[R + "name"] == w.engine
        assert flat[R + "n"] == w.n
        assert flat["data.train_batch_size"] == w.train_batch_size
        assert flat[A + "ppo_mini_batch_size"] == w.ppo_mini_batch_size
        assert flat[A + "use_kl_loss"] is w.use_kl_loss
        assert flat["trainer.n_gpus_per_node"] * flat["trainer.nnodes"] == spec.cluster.world_size
        assert (R + "max_num_batched_tokens" in flat) == (w.engine == "vllm")
        assert (SGLANG_CHUNK in flat) == (w.engine == "sglang")
        # Left to verl: interpolated or default keys.
        for key in (R + "log_prob_use_dynamic_bsz", REF + "log_prob_use_dynamic_bsz", R + "load_format"):
            assert key not in flat
        assert flat.get(R + "enable_chunked_prefill") is not False
        # The actor's offload runs under the FSDP2 the trial measured it with; else verl's default.
        offloaded = flat.get(A + "fsdp_config.param_offload") is True
        assert flat.get(A + "strategy") == ("fsdp2" if offloaded else None)
        assert violations(flat, w, spec.cluster, arch) == []

        yaml_text = to_yaml(config, spec, HEADER)
        assert _typed(load_exported_yaml(yaml_text)) == _typed(flat)

        values, plus = _parse_overrides(to_overrides(config, spec, HEADER))
        assert _typed(values) == _typed(flat)
        assert plus == {k for k in flat if k in KNOBS and KNOBS[k].hydra_plus}
    if w.measures_train:
        assert modes == {False, True}, "both batching modes should have been drawn"


def test_baseline_config_exports_cleanly() -> None:
    for spec in WORKLOADS.values():
        space = SearchSpace.build(spec, spec.validate_model(), "cuda")
        flat = verl_config(space.baseline_config(), spec)
        assert flat[R + "max_num_seqs"] == 256
        assert violations(flat, spec.workload, spec.cluster, space.arch) == []


def test_emitted_keys_are_real_verl_keys() -> None:
    real = VERL_V090_YAML_KEYS | VERL_V090_PLUS_KEYS
    assert not VERL_KEYS - real, sorted(VERL_KEYS - real)
    assert not VERL_KEYS & DEPRECATED_GLOBAL_KEYS
    for path, knob in KNOBS.items():
        assert knob.hydra_plus == (path in VERL_V090_PLUS_KEYS), path


# --------------------------------------------------------------------------- formats


def test_header_names_job_trial_device_date_metrics_and_usage() -> None:
    spec = WORKLOADS["1gpu-n1-kl-vllm"]
    config = _sampled_configs(spec, count=5)[0]
    for text in (to_yaml(config, spec, HEADER), to_overrides(config, spec, HEADER)):
        header = _header(text)
        assert "export-test" in header
        assert "trial 17" in header
        assert "NVIDIA H100 80GB HBM3" in header
        assert "2026-09-01" in header
        assert "throughput_tokens_per_s_per_gpu: 1234.57" in header
        assert "step_time_s: 41.25" in header
        assert "peak_memory_gib: 61.5" in header
        assert "rollout_generated_tokens_per_s: 20480" in header
        assert "merge" in header.lower() and "overrides" in header
        assert "--config-name" not in header


def test_an_offloading_config_says_why_it_names_fsdp2() -> None:
    spec = WORKLOADS["1gpu-n1-kl-vllm"]
    config = _sampled_configs(spec, count=5)[0] | {A + "fsdp_config.param_offload": True}
    for text in (to_yaml(config, spec, HEADER), to_overrides(config, spec, HEADER)):
        assert "strategy: fsdp2, the FSDP this config's param_offload was measured under" in _header(text)
    assert yaml.safe_load(to_yaml(config, spec, HEADER))["actor_rollout_ref"]["actor"]["strategy"] == "fsdp2"
    assert f"{A}strategy=fsdp2" in to_overrides(config, spec, HEADER).splitlines()
    kept = config | {A + "fsdp_config.param_offload": False}
    assert "strategy" not in _header(to_yaml(kept, spec, HEADER))


def test_header_defaults_date_and_survives_newlines() -> None:
    spec = WORKLOADS["1gpu-n1-kl-vllm"]
    config = _sampled_configs(spec, count=5)[0]
    header = {"trial": 3, "device": "gpu\ndata.train_batch_size: 1", "metrics": {"step_time_s": 2.0}}
    text = to_yaml(config, spec, header)
    assert re.search(r"\d{4}-\d{2}-\d{2}", _header(text))
    assert load_exported_yaml(text) == verl_config(config, spec)
    values, _ = _parse_overrides(to_overrides(config, spec, header))
    assert values == verl_config(config, spec)


def test_yaml_is_nested_and_sorted() -> None:
    spec = WORKLOADS["4gpu-n8-nokl-vllm"]
    config = _sampled_configs(spec, count=5)[0]
    text = to_yaml(config, spec, HEADER)
    body = [line for line in text.splitlines() if not line.startswith("#")]
    top = [line.rstrip(":") for line in body if line and not line.startswith(" ")]
    assert top == ["actor_rollout_ref", "data", "trainer"]
    assert "  rollout:" in body
    assert text == to_yaml(dict(reversed(list(config.items()))), spec, HEADER)


def test_sglang_exports_its_chunk_size_not_max_num_batched_tokens() -> None:
    spec = WORKLOADS["8gpu-n8-kl-sglang"]
    configs = _sampled_configs(spec, count=40)
    assert all(R + "max_num_batched_tokens" not in c and SGLANG_CHUNK in c for c in configs)
    assert len({c[SGLANG_CHUNK] for c in configs}) > 1  # searched, as vLLM's token budget is
    config = configs[0]
    flat = verl_config(config, spec)
    assert flat[R + "name"] == "sglang" and flat[SGLANG_CHUNK] == config[SGLANG_CHUNK]
    overrides = to_overrides(config, spec, HEADER)
    assert f"+{SGLANG_CHUNK}={config[SGLANG_CHUNK]}\n" in overrides
    nested = yaml.safe_load(to_yaml(config, spec, HEADER))["actor_rollout_ref"]["rollout"]
    assert nested["engine_kwargs"] == {"sglang": {"chunked_prefill_size": config[SGLANG_CHUNK]}}
    assert nested["name"] == "sglang"


def test_a_knob_verl_does_not_pass_to_sglang_is_left_out_but_said() -> None:
    # A config measured before SGLang had its own chunk-size knob held vLLM's token budget.
    spec = WORKLOADS["8gpu-n8-kl-sglang"]
    config = _sampled_configs(spec, count=5)[0] | {R + "max_num_batched_tokens": 4096}
    for text in (to_yaml(config, spec, HEADER), to_overrides(config, spec, HEADER)):
        header = _header(text)
        assert "not emitted: " + R + "max_num_batched_tokens=4096" in header
        assert "counterpart is " + SGLANG_CHUNK in header
        assert "max_num_batched_tokens" not in text.replace(header, "")


def test_vllm_configs_never_carry_the_sglang_knob() -> None:
    spec = WORKLOADS["4gpu-n8-nokl-vllm"]
    assert not [c for c in _sampled_configs(spec, count=40) if SGLANG_CHUNK in c]


def test_max_num_seqs_is_emitted_even_when_absent() -> None:
    spec = WORKLOADS["1gpu-n1-kl-vllm"]
    config = _sampled_configs(spec, count=5)[0]
    del config[R + "max_num_seqs"]
    assert verl_config(config, spec)[R + "max_num_seqs"] == 256


def test_stale_batching_keys_are_dropped() -> None:
    spec = WORKLOADS["1gpu-n1-kl-vllm"]
    config = {
        A + "use_dynamic_bsz": True,
        A + "ppo_max_token_len_per_gpu": 2048,
        R + "log_prob_max_token_len_per_gpu": 4096,
        A + "ppo_micro_batch_size_per_gpu": 4,
        R + "log_prob_micro_batch_size_per_gpu": 4,
        REF + "log_prob_micro_batch_size_per_gpu": 4,
    }
    flat = verl_config(config, spec)
    assert not {k for k in flat if "micro_batch" in k}
    assert flat[REF + "log_prob_max_token_len_per_gpu"] == 4096
    flat = verl_config(config | {A + "use_dynamic_bsz": False}, spec)
    assert not {k for k in flat if "max_token_len" in k}
    assert flat[REF + "log_prob_micro_batch_size_per_gpu"] == 4


def test_unknown_key_is_refused() -> None:
    spec = WORKLOADS["1gpu-n1-kl-vllm"]
    unknown = r"unknown key\(s\) actor_rollout_ref\.actor\.ppo_micro_batch_size;"
    with pytest.raises(ExportError, match=unknown):
        verl_config({A + "ppo_micro_batch_size": 8, R + "max_num_seqs": 64}, spec)


def _add_knob(monkeypatch: pytest.MonkeyPatch, path: str, plus: bool, kind: str = "bool") -> None:
    monkeypatch.setitem(
        knobs.KNOBS,
        path,
        Knob(
            path,
            kind,  # type: ignore[arg-type]
            "rollout",
            "test knob",
            ("rollout", "x"),
            lambda ctx: [False, True],
            False,
            hydra_plus=plus,
        ),
    )


def test_hydra_plus_and_value_formats(monkeypatch: pytest.MonkeyPatch) -> None:
    _add_knob(monkeypatch, R + "enable_sleep_mode", plus=True)
    # Kinds the domain table does not describe: values of any type reach the formatter.
    _add_knob(monkeypatch, R + "cudagraph_capture_sizes", plus=False, kind="list")
    _add_knob(monkeypatch, R + "free_cache_engine", plus=False, kind="nullable")
    spec = WORKLOADS["1gpu-n1-kl-vllm"]
    config = _sampled_configs(spec, count=5)[0] | {
        R + "enable_sleep_mode": False,
        R + "cudagraph_capture_sizes": [1, 2, 4],
        R + "free_cache_engine": None,
    }
    text = to_overrides(config, spec, HEADER)
    lines = set(text.splitlines())
    assert f"+{R}enable_sleep_mode=False" in lines
    assert f"{R}cudagraph_capture_sizes=[1,2,4]" in lines
    assert f"{R}free_cache_engine=null" in lines
    assert f"{R}name=vllm" in lines
    assert f"{A}use_kl_loss=True" in lines
    values, plus = _parse_overrides(text)
    assert plus == {R + "enable_sleep_mode"}
    assert _typed(values) == _typed(verl_config(config, spec))
    assert _typed(load_exported_yaml(to_yaml(config, spec, HEADER))) == _typed(values)


def test_chunked_prefill_false_is_never_emitted(monkeypatch: pytest.MonkeyPatch) -> None:
    _add_knob(monkeypatch, R + "enable_chunked_prefill", plus=False)
    spec = WORKLOADS["1gpu-n1-kl-vllm"]
    config = _sampled_configs(spec, count=5)[0]
    assert R + "enable_chunked_prefill" not in verl_config(
        config | {R + "enable_chunked_prefill": False}, spec
    )
    assert (
        verl_config(config | {R + "enable_chunked_prefill": True}, spec)[R + "enable_chunked_prefill"] is True
    )


def test_ref_keys_are_dropped_without_kl_loss() -> None:
    spec = WORKLOADS["4gpu-n8-nokl-vllm"]
    static = {
        A + "use_dynamic_bsz": False,
        A + "ppo_micro_batch_size_per_gpu": 4,
        R + "log_prob_micro_batch_size_per_gpu": 4,
        REF + "log_prob_micro_batch_size_per_gpu": 4,
    }
    assert not {k for k in verl_config(static, spec) if k.startswith(REF)}
    dynamic = {
        A + "use_dynamic_bsz": True,
        A + "ppo_max_token_len_per_gpu": 4096,
        R + "log_prob_max_token_len_per_gpu": 4096,
    }
    assert not {k for k in verl_config(dynamic, spec) if k.startswith(REF)}


BUCKET_KEY = R + "checkpoint_engine.update_weights_bucket_megabytes"


def test_the_weight_sync_bucket_is_exported_with_verls_default_as_baseline() -> None:
    from autotuner.trialspec import knobs_for_trial

    spec = WORKLOADS["1gpu-n1-kl-vllm"]
    space = SearchSpace.build(spec, spec.validate_model(), "cuda")
    baseline = space.baseline_config()
    assert baseline[BUCKET_KEY] == 2048  # verl v0.9.0 rollout.yaml
    assert verl_config(baseline, spec)[BUCKET_KEY] == 2048
    config = baseline | {BUCKET_KEY: 512}
    assert f"{BUCKET_KEY}=512" in to_overrides(config, spec, HEADER).splitlines()  # no "+"
    rollout, _ = knobs_for_trial(config, "vllm")
    assert rollout.update_weights_bucket_megabytes == 512
