"""The knob table is the one source of each knob's engine arguments, roles and rules: the
backends, composition, feasibility, the memory model and the rules read the rows."""

from __future__ import annotations

import dataclasses
import importlib
import re
from typing import Any

import pytest

from autotuner.compose import side_of
from autotuner.export import verl_config
from autotuner.feasibility import at_most
from autotuner.knobs import KNOBS, A, Knob, R, Rule, SpaceContext, engine_arguments, memory_knobs
from autotuner.memory import _mode_key
from autotuner.rules import violations
from autotuner.space import SearchSpace
from autotuner.spec import parse_job_spec
from autotuner.trialspec import build_trial_spec, knobs_for_trial
from trials.errors import InvalidTrialSpec
from trials.rollout import BACKENDS
from trials.types import RolloutKnobs, TrialSpec

from .conftest import REPO

RULE_IDS = set(re.findall(r"^\| ([A-Z0-9/]+) \|", (REPO / "docs" / "verl-rules.md").read_text(), re.M))


def _engine_kwargs(engine: str, spec: TrialSpec) -> dict[str, Any]:
    """The engine's arguments for ``spec`` as its backend module builds them (no engine started)."""
    module = importlib.import_module(BACKENDS[engine].split(":")[0])
    kwargs: dict[str, Any] = module.engine_kwargs(spec, spec.dtype, "/m")
    return kwargs


def _odd_value(knob: Knob, i: int) -> Any:
    """A value of ``knob`` no other knob and no default shares."""
    if knob.kind == "bool":
        return not knob.baseline
    if knob.kind == "float":
        return round(0.31 + 0.01 * i, 2)
    return 1000 + 16 * i


@pytest.mark.parametrize("engine", sorted(BACKENDS))
def test_every_engine_row_reaches_its_engines_arguments(engine):
    rows = [k for k in KNOBS.values() if engine in k.engines and engine in k.engine_args]
    assert rows, f"no knob reaches {engine}"
    config = {R + "max_model_len": 4096} | {k.path: _odd_value(k, i) for i, k in enumerate(rows)}
    rollout, _ = knobs_for_trial(config, engine)
    spec = TrialSpec("t", "m", {}, device="cuda", device_memory_cap_gib=None, rollout=rollout)
    kwargs = _engine_kwargs(engine, spec)
    assert {k.engine_args[engine]: kwargs.get(k.engine_args[engine]) for k in rows} == {
        k.engine_args[engine]: config[k.path] for k in rows
    }
    # One row per argument: two rows naming one argument would lose a value.
    assert len({k.engine_args[engine] for k in rows}) == len(rows)
    # A knob verl does not pass to this engine does not reach it under another engine's name.
    for k in KNOBS.values():
        if engine not in k.engines:
            for argument in set(k.engine_args.values()) - set(engine_arguments(engine)):
                assert argument not in kwargs, (k.path, argument)


def test_every_row_declares_roles_the_code_can_use():
    rollout_fields = {f.name for f in dataclasses.fields(RolloutKnobs)}
    for path, k in KNOBS.items():
        assert k.path == path
        assert set(k.engine_args) <= set(k.engines) <= set(BACKENDS), path
        if k.engine_args:  # the trial carries the value in a rollout field, passed by name
            assert k.trial_field[0] == "rollout" and k.trial_field[1] in rollout_fields, path
        assert k.composition_side in ("engine", "actor", "both"), path
        assert k.side != "both" or k.phase == "train", path  # a train knob the engine sees beside it
        assert k.memory != "grows" or k.kind in ("int", "float"), path  # "larger" must mean something
        assert k.memory != "mode" or k.phase == "rollout", path  # the engine's phases are fitted per mode
        assert {rule.id for rule in k.rules} <= RULE_IDS, path  # docs/verl-rules.md names each rule
    assert set(memory_knobs("grows")) >= {R + "gpu_memory_utilization", R + "max_num_seqs"}
    assert memory_knobs("mode") == (R + "enforce_eager",)


def test_the_row_alone_decides(monkeypatch):
    """Change one row, and the engine's arguments, composition, feasibility, the memory
    model's calibration keys and the rules follow, with no other code touched."""
    path = R + "max_num_seqs"
    row = KNOBS[path]
    spec = parse_job_spec({"cluster": {"device": "cpu"}})
    arch = spec.validate_model()
    config = SearchSpace.build(spec, arch, "cpu").baseline_config() | {path: 64}
    assert side_of(path) == "engine" and at_most({path: 32, "x": 1}, {path: 64, "x": 1})
    assert violations(config, spec.workload, spec.cluster, arch) == []
    monkeypatch.setitem(
        KNOBS,
        path,
        dataclasses.replace(
            row,
            engine_args={"vllm": "max_num_seqs_as_renamed"},
            side="both",
            memory="mode",
            rules=(Rule("V2", lambda value, cfg, ctx: f"{value} refused"),),
        ),
    )
    rollout, _ = knobs_for_trial(config, "vllm")
    kwargs = _engine_kwargs(
        "vllm", TrialSpec("t", "m", {}, device="cuda", device_memory_cap_gib=None, rollout=rollout)
    )
    assert kwargs["max_num_seqs_as_renamed"] == 64 and "max_num_seqs" not in kwargs
    assert side_of(path) == "both"
    # No longer a knob memory grows with: a smaller value no longer rules anything in or out.
    assert not at_most({path: 32, "x": 1}, {path: 64, "x": 1})
    assert "max_num_seqs=64" in _mode_key("startup", config)
    broken = violations(config, spec.workload, spec.cluster, arch)
    assert [(v.rule, v.key, v.message) for v in broken] == [("V2", path, "64 refused")]


def test_the_export_keeps_the_knobs_whose_row_applies(monkeypatch):
    spec = parse_job_spec({"cluster": {"device": "cpu"}})  # entropy_coeff 0: no entropy term
    config = SearchSpace.build(spec, spec.validate_model(), "cpu").baseline_config()
    path = A + "entropy_checkpointing"
    assert path not in verl_config(config | {path: True}, spec)
    monkeypatch.setitem(KNOBS, path, dataclasses.replace(KNOBS[path], applies=lambda w, cfg: True))
    assert verl_config(config | {path: True}, spec)[path] is True


def test_a_cpu_vllm_trial_gets_its_engine_arguments_from_the_rows():
    """The tiny model's job on CPU, as the study builds its trial: every knob of the config
    that the table gives vLLM an argument for reaches ``vllm.LLM`` with its value."""
    spec = parse_job_spec({"workload": {"model": "tiny", "engine": "vllm"}, "cluster": {"device": "cpu"}})
    arch = spec.validate_model()
    space = SearchSpace.build(spec, arch, "cpu")
    config = space.baseline_config() | {R + "max_num_seqs": 16, R + "gpu_memory_utilization": 0.4}
    trial = build_trial_spec(spec, arch, config, "t0", "cpu", 2.0)
    kwargs = _engine_kwargs("vllm", trial)
    passed = {k.engine_args["vllm"]: config[p] for p, k in KNOBS.items() if "vllm" in k.engine_args}
    assert passed and {a: kwargs[a] for a in passed} == passed
    assert kwargs["kv_cache_memory_bytes"] == int(0.4 * 2.0 * 2**30)  # the CPU's own use of the fraction
    ctx = SpaceContext(spec.workload, spec.cluster, arch, "cpu")  # each of them is in the config
    assert all(k.relevant(ctx, config) for k in KNOBS.values() if "vllm" in k.engine_args)


@pytest.mark.parametrize(
    ("device", "n_gpus", "offload", "strategy"),
    [
        ("cuda", 1, False, "fsdp"),  # verl's default FSDP1, as verl runs it on one GPU
        ("cuda", 1, True, "fsdp2"),  # the actor's offload is moved as FSDP2's
        ("cuda", 8, False, "fsdp2"),  # one rank of eight: FSDP1's collectives not measured
        ("cpu", 1, False, "fsdp2"),  # FSDP1 runs on GPUs only
    ],
)
def test_a_trial_builds_verls_default_fsdp1_where_it_runs_as_verl_runs_it(device, n_gpus, offload, strategy):
    spec = parse_job_spec(
        {
            "workload": {"model": "qwen2.5-0.5b", "train_batch_size": 16, "ppo_mini_batch_size": 8},
            "cluster": {"device": device, "n_gpus_per_node": n_gpus},
        }
    )
    arch = spec.validate_model()
    config = SearchSpace.build(spec, arch, device).baseline_config()
    config[A + "fsdp_config.param_offload"] = offload
    trial = build_trial_spec(spec, arch, config, "t0", device, None)
    assert trial.train.strategy == strategy
    # verl runs its default FSDP1 unless the export names the FSDP2 an offloading trial measured
    assert verl_config(config, spec).get(A + "strategy", "fsdp") == ("fsdp2" if offload else "fsdp")


def test_a_spec_without_engine_arguments_is_refused():
    # Built by hand without the table's names, its knobs would all be the engine's defaults.
    spec = TrialSpec("t", "m", {}, device="cuda", device_memory_cap_gib=None)
    with pytest.raises(InvalidTrialSpec, match="engine_args is empty"):
        _engine_kwargs("vllm", spec)
    spec.rollout.engine_args = {"max_num_seqs": "max_seqs"}
    with pytest.raises(InvalidTrialSpec, match="names max_seqs, not fields"):
        _engine_kwargs("vllm", spec)


def test_a_trial_takes_the_shared_field_from_its_own_engines_knob_only() -> None:
    """vLLM's max_num_batched_tokens and SGLang's chunked_prefill_size share the trial's
    token-budget field: a config holding both gives each engine its own, in either order."""
    vllm_key, sglang_key = R + "max_num_batched_tokens", R + "engine_kwargs.sglang.chunked_prefill_size"
    assert KNOBS[vllm_key].trial_field == KNOBS[sglang_key].trial_field
    for config in (
        {R + "max_model_len": 4096, vllm_key: 8192, sglang_key: 1024},
        {R + "max_model_len": 4096, sglang_key: 1024, vllm_key: 8192},
    ):
        assert knobs_for_trial(config, "vllm")[0].max_num_batched_tokens == 8192
        assert knobs_for_trial(config, "sglang")[0].max_num_batched_tokens == 1024
