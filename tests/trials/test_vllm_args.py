"""The vLLM engine arguments a spec turns into (no engine started)."""

from __future__ import annotations

import json
from pathlib import Path

from trial_helpers import make_spec

from trials.launcher import scratch_dirs
from trials.rollout.base import DUMMY_MODEL_PREFIX, dummy_model_dir
from trials.rollout.vllm import engine_kwargs

VERL_ARGS = (
    "gpu_memory_utilization",
    "max_num_batched_tokens",
    "max_num_seqs",
    "tensor_parallel_size",
    "enforce_eager",
    "max_model_len",
    "enable_prefix_caching",
    "enable_chunked_prefill",
    "enable_sleep_mode",
    "load_format",
    "skip_tokenizer_init",
)


def test_cpu_kv_cache_is_sized_from_the_cap(tiny_config):
    spec = make_spec(tiny_config, device_memory_cap_gib=2.0)
    spec.rollout.gpu_memory_utilization = 0.25
    kwargs = engine_kwargs(spec, "float32", "/m")
    assert kwargs["kv_cache_memory_bytes"] == 512 * 2**20
    assert kwargs["load_format"] == "dummy" and kwargs["skip_tokenizer_init"] is True
    assert kwargs["max_model_len"] == 256 and kwargs["tensor_parallel_size"] == 1
    assert kwargs["enable_prefix_caching"] is True and kwargs["enable_chunked_prefill"] is True
    assert "enable_sleep_mode" not in kwargs  # vLLM has no sleep mode on CPU


def test_cudagraph_sizes_only_without_eager_and_engine_kwargs_win(tiny_config):
    spec = make_spec(tiny_config, device="cuda", device_memory_cap_gib=None)
    spec.rollout.cudagraph_capture_sizes = [1, 8, 64]
    spec.rollout.enforce_eager = True
    assert "compilation_config" not in engine_kwargs(spec, "bfloat16", "/m")
    spec.rollout.enforce_eager = False
    spec.rollout.engine_kwargs = {"max_num_seqs": 7, "enable_prefix_caching": False}
    kwargs = engine_kwargs(spec, "bfloat16", "/m")
    assert kwargs["compilation_config"] == {
        "cudagraph_mode": "FULL_AND_PIECEWISE",
        "cudagraph_capture_sizes": [1, 8, 64],
    }
    assert kwargs["max_num_seqs"] == 7 and kwargs["enable_prefix_caching"] is False
    assert "kv_cache_memory_bytes" not in kwargs


def test_cuda_engine_is_built_as_verls_colocated_rollout(tiny_config):
    spec = make_spec(tiny_config, device="cuda", device_memory_cap_gib=None)
    spec.rollout.gpu_memory_utilization = 0.6
    spec.rollout.max_num_batched_tokens = 4096
    spec.rollout.max_num_seqs = 128
    spec.rollout.enforce_eager = False
    kwargs = engine_kwargs(spec, "bfloat16", "/m")
    assert {k: kwargs[k] for k in VERL_ARGS} == {
        "gpu_memory_utilization": 0.6,
        "max_num_batched_tokens": 4096,
        "max_num_seqs": 128,
        "tensor_parallel_size": 1,
        "enforce_eager": False,
        "max_model_len": 256,
        "enable_prefix_caching": True,
        "enable_chunked_prefill": True,
        "enable_sleep_mode": True,
        "load_format": "dummy",
        "skip_tokenizer_init": True,
    }
    assert kwargs["compilation_config"] == {"cudagraph_mode": "FULL_AND_PIECEWISE"}


def test_trials_of_one_model_share_its_dummy_model_directory(tiny_config):
    """vLLM keys its compile cache by the model's path: the trials of one model config load
    it from one directory, named by its content, so a later trial finds the graphs an
    earlier one compiled (as verl, loading one checkpoint path, does)."""
    first = dummy_model_dir(make_spec(tiny_config, trial_id="job-shared-0"))
    assert dummy_model_dir(make_spec(tiny_config, trial_id="job-shared-1")) == first
    assert Path(first).name.startswith(DUMMY_MODEL_PREFIX)
    assert json.loads((Path(first) / "config.json").read_text()) == tiny_config
    assert [p.name for p in Path(first).iterdir()] == ["config.json"]  # no partial file left
    deeper = {**tiny_config, "num_hidden_layers": tiny_config["num_hidden_layers"] + 1}
    other = dummy_model_dir(make_spec(deeper, trial_id="job-shared-2"))
    assert other != first and json.loads((Path(other) / "config.json").read_text()) == deeper
    assert scratch_dirs("job-shared") == []  # no trial's scratch: a killed trial's clean-up keeps it
