"""Job specs: valid ones load; bad ones fail with the field and the fix."""

from __future__ import annotations

import numpy as np
import pytest

from autotuner.errors import SpecError, UnknownModelError
from autotuner.samplers import SAMPLERS
from autotuner.spec import (
    JobSpec,
    LognormalLengths,
    NormalLengths,
    load_job_spec,
    parse_job_spec,
    resolve_model,
)
from trials.rollout import BACKENDS


def test_defaults_are_a_valid_job() -> None:
    spec = parse_job_spec({})
    assert spec.workload.model == "tiny"
    assert [o.metric for o in spec.objectives] == ["throughput_tokens_per_s_per_gpu", "peak_memory_gib"]
    assert [o.resolved_direction for o in spec.objectives] == ["maximize", "minimize"]


def test_yaml_file_loads(tmp_path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(
        "name: grpo\nworkload:\n  model: qwen2.5-1.5b\n  train_batch_size: 256\n  n: 8\n"
        "  ppo_mini_batch_size: 64\n  prompt_length: {kind: normal, mean: 300, std: 80}\n"
        "  response_length: {kind: lognormal, median: 500, max: 3072}\n"
        "  max_response_length: 3072\n"
        "search:\n  actor_rollout_ref.rollout.enforce_eager: true\n"
        "  actor_rollout_ref.rollout.max_num_seqs: [128, 256]\n"
    )
    spec = load_job_spec(path)
    assert spec.workload.n == 8
    assert spec.search["actor_rollout_ref.rollout.enforce_eager"].fixed is True
    assert spec.search["actor_rollout_ref.rollout.max_num_seqs"].choices == [128, 256]


@pytest.mark.parametrize(
    ("data", "field", "hint"),
    [
        ({"workload": {"train_batch_size": "many"}}, "workload.train_batch_size", "integer"),
        ({"workload": {"n": 0}}, "workload.n", "greater than or equal to 1"),
        ({"workload": {"model": "gpt-9"}}, "workload.model", "qwen2.5-7b"),
        (
            {"workload": {"train_batch_size": 8, "ppo_mini_batch_size": 16}},
            "workload",
            "lower ppo_mini_batch_size",
        ),
        ({"workload": {"prompt_length": {"kind": "zipf"}}}, "workload.prompt_length", "fixed"),
        (
            {"workload": {"prompt_length": {"kind": "uniform", "low": 50, "high": 10}}},
            "workload.prompt_length",
            "swap",
        ),
        (
            {"workload": {"prompt_length": {"kind": "fixed", "value": 900}}},
            "workload",
            "raise max_prompt_length",
        ),
        ({"search": {"actor_rollout_ref.rollout.gpu_mem": 0.5}}, "(job)", "valid knobs are"),
        (
            {"search": {"actor_rollout_ref.rollout.max_num_seqs": {"low": 9, "high": 2}}},
            "search.actor_rollout_ref.rollout.max_num_seqs",
            "low (9.0) must be <= high",
        ),
        (
            {"cluster": {"n_gpus_per_node": 3}, "workload": {"train_batch_size": 256}},
            "(job)",
            "(verl rule S1)",
        ),
        ({"budget": {"max_trials": 0}}, "budget.max_trials", "greater than or equal to 1"),
        (
            {"sampler": "grid-of-doom"},
            "sampler",
            "unknown sampler 'grid-of-doom'; valid samplers: nsga2, random, tpe",
        ),
        (
            {"workload": {"engine": "tgi"}},
            "workload.engine",
            "unknown rollout engine 'tgi'; valid rollout engines: sglang, vllm",
        ),
        (
            {"workload": {"max_prompt_length": 4000, "max_response_length": 4000}},
            "workload.max_response_length",
            "max_position_embeddings",
        ),
        ({"unknown_top_level": 1}, "unknown_top_level", "Extra inputs are not permitted"),
        ([1, 2], "(job)", "mapping"),
    ],
)
def test_bad_specs_name_the_field_and_the_fix(data, field, hint) -> None:
    with pytest.raises(SpecError) as info:
        parse_job_spec(data)
    assert info.value.field.startswith(field), str(info.value)
    assert hint in str(info.value)


def test_unreadable_file_is_a_spec_error(tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("workload: [unclosed")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_job_spec(bad)
    with pytest.raises(SpecError, match="cannot read"):
        load_job_spec(tmp_path / "missing.yaml")


def test_model_from_a_config_path(tmp_path) -> None:
    cfg = tmp_path / "m" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(
        '{"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, '
        '"vocab_size": 100, "intermediate_size": 128}'
    )
    arch = resolve_model(str(cfg.parent))
    assert arch.num_key_value_heads == 4 and arch.head_dim == 16
    cfg.write_text('{"hidden_size": 64}')
    with pytest.raises(UnknownModelError, match="lacks num_hidden_layers"):
        resolve_model(str(cfg))


@pytest.mark.parametrize(
    ("name", "billions"),
    [
        ("qwen2.5-0.5b", 0.49),
        ("qwen2.5-1.5b", 1.54),
        ("qwen2.5-7b", 7.6),
        ("qwen2-7b", 7.6),
        ("llama-3.1-8b", 8.0),
        ("qwen3-8b", 8.2),
    ],
)
def test_catalog_parameter_counts_match_the_published_sizes(name, billions) -> None:
    # Published sizes: Qwen2.5-0.5B 0.49B, 1.5B 1.54B, 7B 7.61B, Llama-3.1-8B 8.03B, Qwen3-8B 8.19B.
    assert resolve_model(name).num_parameters / 1e9 == pytest.approx(billions, rel=0.02)


def test_length_draws_respect_caps_and_are_seeded() -> None:
    dist = LognormalLengths(median=500, sigma=1.0, max=3072)
    a = dist.draw(5000, np.random.default_rng(1), cap=2048)
    b = dist.draw(5000, np.random.default_rng(1), cap=2048)
    assert a == b
    assert min(a) >= 1 and max(a) == 2048
    assert 400 < float(np.median(a)) < 600
    normal = NormalLengths(mean=300, std=80, min=10).draw(5000, np.random.default_rng(2), cap=512)
    assert min(normal) >= 10 and max(normal) <= 512
    assert 290 < float(np.mean(normal)) < 310


@pytest.mark.parametrize(
    ("max_trials", "explicit", "finalists"),
    [(4, None, 0), (7, None, 0), (8, None, 1), (22, None, 2), (200, None, 3), (4, 2, 2), (200, 0, 0)],
)
def test_finalists_default_to_one_per_8_trials_at_most_3(max_trials, explicit, finalists) -> None:
    budget = {"max_trials": max_trials}
    if explicit is not None:
        budget["remeasure_finalists"] = explicit
    assert parse_job_spec({"budget": budget}).budget.finalists == finalists


@pytest.mark.parametrize(
    ("section", "field", "value", "message"),
    [
        ("budget", "remeasure_runs", 1, "greater than or equal to 2"),
        ("budget", "noise_band_pct", -1, "greater than or equal to 0"),
        ("budget", "patience_trials", -1, "greater than or equal to 0"),
        ("memory_model", "skip_margin", -0.1, "greater than or equal to 0"),
    ],
)
def test_search_settings_are_bounded(section, field, value, message) -> None:
    with pytest.raises(SpecError, match=message) as caught:
        parse_job_spec({section: {field: value}})
    assert caught.value.field == f"{section}.{field}"


def test_engine_and_sampler_choices_are_the_registries():
    # Every registered name is accepted, and the schema (OpenAPI, the web form) lists exactly
    # the registries' rows: a new engine or sampler is its registry row only.
    for engine in BACKENDS:
        assert parse_job_spec({"workload": {"engine": engine}}).workload.engine == engine
    for sampler in SAMPLERS:
        assert parse_job_spec({"sampler": sampler}).sampler == sampler
    schema = JobSpec.model_json_schema()
    assert schema["$defs"]["Workload"]["properties"]["engine"]["enum"] == sorted(BACKENDS)
    assert schema["properties"]["sampler"]["enum"] == sorted(SAMPLERS)
