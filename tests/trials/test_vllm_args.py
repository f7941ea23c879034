"""The vLLM engine arguments a spec turns into (no engine started)."""

from __future__ import annotations

from trial_helpers import make_spec

from trials.rollout.vllm import engine_kwargs


def test_cpu_kv_cache_is_sized_from_the_cap(tiny_config):
    spec = make_spec(tiny_config, device_memory_cap_gib=2.0)
    spec.rollout.gpu_memory_utilization = 0.25
    kwargs = engine_kwargs(spec, "float32", "/m")
    assert kwargs["kv_cache_memory_bytes"] == 512 * 2**20
    assert kwargs["load_format"] == "dummy" and kwargs["skip_tokenizer_init"] is True
    assert kwargs["max_model_len"] == 256 and kwargs["tensor_parallel_size"] == 1


def test_cudagraph_sizes_only_without_eager_and_engine_kwargs_win(tiny_config):
    spec = make_spec(tiny_config, device="cuda", device_memory_cap_gib=None)
    spec.rollout.cudagraph_capture_sizes = [1, 8, 64]
    spec.rollout.enforce_eager = True
    assert "compilation_config" not in engine_kwargs(spec, "bfloat16", "/m")
    spec.rollout.enforce_eager = False
    spec.rollout.engine_kwargs = {"max_num_seqs": 7, "enable_prefix_caching": False}
    kwargs = engine_kwargs(spec, "bfloat16", "/m")
    assert kwargs["compilation_config"] == {"cudagraph_capture_sizes": [1, 8, 64]}
    assert kwargs["max_num_seqs"] == 7 and kwargs["enable_prefix_caching"] is False
    assert "kv_cache_memory_bytes" not in kwargs
