"""The SGLang engine arguments a spec turns into, as verl maps its keys (no engine started)."""

from __future__ import annotations

import json

import pytest
from trial_helpers import QWEN_05B_CONFIG, make_spec, with_engine

from trials.errors import ConfigRejected, EngineMemoryRefused
from trials.rollout.sglang import _on_sigquit, emulated_fraction, engine_kwargs


def _cuda_spec(**rollout):
    spec = make_spec(json.loads(QWEN_05B_CONFIG.read_text()), device="cuda", device_memory_cap_gib=None)
    with_engine(spec, "sglang")
    for key, value in rollout.items():
        setattr(spec.rollout, key, value)
    return spec


def test_verls_keys_map_to_sglangs_arguments():
    spec = _cuda_spec(
        gpu_memory_utilization=0.7,
        max_num_seqs=512,
        tensor_model_parallel_size=2,
        enforce_eager=True,
        max_num_batched_tokens=4096,
        max_model_len=4096,
    )
    kwargs = engine_kwargs(spec, "bfloat16", "/m")
    assert {
        k: kwargs[k]
        for k in (
            "mem_fraction_static",
            "max_running_requests",
            "tp_size",
            "disable_cuda_graph",
            "chunked_prefill_size",
        )
    } == {
        "mem_fraction_static": 0.7,
        "max_running_requests": 512,
        "tp_size": 2,
        "disable_cuda_graph": True,
        "chunked_prefill_size": 4096,
    }
    # Dummy weights, token ids in, no tokenizer; as verl: memory saver with a CPU copy of the
    # weights (its hybrid engine sleeps), no context_length; SGLang picks its attention.
    assert kwargs["model_path"] == "/m" and kwargs["load_format"] == "dummy"
    assert kwargs["skip_tokenizer_init"] is True and kwargs["dtype"] == "bfloat16"
    assert kwargs["enable_memory_saver"] is True and kwargs["enable_weights_cpu_backup"] is True
    assert "attention_backend" not in kwargs
    assert "context_length" not in kwargs and "max_num_batched_tokens" not in kwargs
    assert kwargs["random_seed"] == spec.seed and kwargs["log_level"] == "warning"
    # The failure handler travels to SGLang's processes with its arguments: module level.
    assert kwargs["custom_sigquit_handler"] is _on_sigquit
    assert _on_sigquit.__qualname__ == "_on_sigquit"


def test_engine_kwargs_are_merged_last():
    spec = _cuda_spec(
        engine_kwargs={"chunked_prefill_size": -1, "attention_backend": "fa3", "max_total_tokens": 300}
    )
    kwargs = engine_kwargs(spec, "bfloat16", "/m")
    assert kwargs["chunked_prefill_size"] == -1 and kwargs["attention_backend"] == "fa3"
    assert kwargs["max_total_tokens"] == 300


def test_a_cpu_trial_is_refused_with_the_fix():
    spec = make_spec(json.loads(QWEN_05B_CONFIG.read_text()))
    with pytest.raises(ConfigRejected, match="CUDA GPUs only.*use engine vllm on a CPU"):
        engine_kwargs(spec, "float32", "/m")


def test_a_smaller_gpu_is_emulated_with_sglangs_own_budget():
    # SGLang takes its fraction of the memory free when it starts: on an 80 GiB card with
    # 20 GiB held, 0.5 is 30 GiB; on a 140 GiB card with the same 20 GiB held, 0.25 is too.
    assert emulated_fraction(0.5, 80.0, 140.0, 20.0) == pytest.approx(0.25)
    assert emulated_fraction(0.5, 80.0, 80.0, 20.0) == pytest.approx(0.5)
    with pytest.raises(EngineMemoryRefused, match="Not enough memory.*holds 90.00 GiB"):
        emulated_fraction(0.5, 80.0, 140.0, 90.0)
