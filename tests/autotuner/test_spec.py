"""Job specs: valid ones load; bad ones fail with the field and the fix."""

from __future__ import annotations

import numpy as np
import pytest

from autotuner.errors import SpecError, UnknownModelError
from autotuner.samplers import SAMPLERS
from autotuner.spec import (
    MAX_DISTINCT_LENGTHS,
    STORED,
    JobSpec,
    ListLengths,
    LognormalLengths,
    NormalLengths,
    load_job_spec,
    parse_job_spec,
    resolve_model,
)
from autotuner.yamlload import load_spec_yaml
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
        (
            {"search": {"actor_rollout_ref.rollout.gpu_mem": 0.5}},
            "search.actor_rollout_ref.rollout.gpu_mem",
            "valid knobs are",
        ),
        (
            {"baselines": {"mine": {"foo.bar": 1}}},
            "baselines.mine.foo.bar",
            "use knob paths from the search space",
        ),
        (
            {"objectives": [{"metric": "step_time_s"}, {"metric": "step_time_s"}]},
            "objectives",
            "list each metric once",
        ),
        (
            {"search": {"actor_rollout_ref.rollout.max_num_seqs": {"low": 9, "high": 2}}},
            "search.actor_rollout_ref.rollout.max_num_seqs",
            "low (9.0) must be <= high",
        ),
        (
            {"cluster": {"n_gpus_per_node": 3}, "workload": {"train_batch_size": 256}},
            "workload.train_batch_size",
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
        (
            {"cluster": {"device_memory_gib": 1e-308}},
            "cluster.device_memory_gib",
            "greater than or equal to 0.0625",
        ),
        ({"workload": {"model": "m" * 5000}}, "workload.model", "at most 4096 characters"),
        (
            {"budget": {"max_trials": True}},
            "budget.max_trials",
            "true is a boolean, and max_trials takes none",
        ),
        ({"budget": {"max_trials": 1e308}}, "budget.max_trials", "too large for this whole-number field"),
        (
            {"workload": {"response_length": {"kind": "list", "values": [300, False]}}},
            "workload.response_length.list.values",
            "it holds a boolean, and values takes none",
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


def test_a_key_given_twice_in_a_spec_file_is_refused_with_its_line(tmp_path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: first\nbudget:\n  max_trials: 4\nname: second\n")
    with pytest.raises(SpecError, match=r"(?s)found key 'name' twice; .*line 4"):
        load_job_spec(spec)
    # A merge key's values may be overridden: that is what it is for.
    assert load_spec_yaml("b: &b {max_trials: 4, max_minutes: 9}\nbudget:\n  <<: *b\n  max_trials: 6\n") == {
        "b": {"max_trials": 4, "max_minutes": 9},
        "budget": {"max_trials": 6, "max_minutes": 9},
    }


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


def test_a_list_of_lengths_is_kept_as_its_distinct_lengths_and_draws_as_the_list_did() -> None:
    measured = [int(v) for v in np.random.default_rng(3).lognormal(np.log(400), 0.7, 200_000).clip(1, 4096)]
    spec = parse_job_spec(
        {
            "workload": {
                "response_length": {"kind": "list", "values": measured},
                "max_response_length": 3072,
            }
        }
    )
    kept = spec.workload.response_length
    assert isinstance(kept, ListLengths) and kept.counts is not None
    assert kept.values == sorted(set(measured)) and sum(kept.counts) == len(measured)
    assert dict(zip(kept.values, kept.counts, strict=True))[400] == measured.count(400)
    # The same lengths as the list written out, in order (as read back from before lists
    # were kept this way): the same draws, the same quantiles.
    written_out = ListLengths.model_validate({"values": sorted(measured)}, context=STORED)
    assert written_out.counts is None and len(written_out.values) == len(measured)
    assert kept.draw(4096, np.random.default_rng(9), 3000) == written_out.draw(
        4096, np.random.default_rng(9), 3000
    )
    u = np.random.default_rng(4).random(1000)
    assert (kept.quantiles(u, 3000) == written_out.quantiles(u, 3000)).all()
    # The stored spec reads back as stored, and submitting it again keeps it.
    stored = JobSpec.model_validate_json(spec.model_dump_json(), context=STORED)
    assert stored.workload.response_length == kept
    assert parse_job_spec(spec.model_dump(mode="json")).workload.response_length == kept
    merged = ListLengths(values=[9, 3, 9], counts=[2, 5, 1])
    assert (merged.values, merged.counts) == ([3, 9], [5, 3])


@pytest.mark.parametrize(
    ("lengths", "hint"),
    [
        ({"values": [5, 6], "counts": [1]}, "counts has 1 entries for 2 values; give one count per value"),
        ({"values": [5], "counts": [0]}, "greater than or equal to 1"),
        ({"values": list(range(1, 9101)), "counts": [10**12] * 9100}, "counts add up to more than 2**53"),
        (
            {"values": list(range(1, MAX_DISTINCT_LENGTHS + 2))},
            f"{MAX_DISTINCT_LENGTHS + 1:,} distinct lengths, more than the {MAX_DISTINCT_LENGTHS:,}",
        ),
    ],
)
def test_a_list_of_lengths_it_cannot_keep_names_the_field_and_the_fix(lengths, hint) -> None:
    with pytest.raises(SpecError) as info:
        parse_job_spec({"workload": {"prompt_length": {"kind": "list", **lengths}}})
    assert info.value.field.startswith("workload.prompt_length"), str(info.value)
    assert hint in str(info.value)


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
