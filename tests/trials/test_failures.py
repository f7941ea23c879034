"""The classification table over messages the engines and allocators really print."""

from __future__ import annotations

import pytest

from trials.errors import EngineDied
from trials.failures import (
    PATTERNS,
    classify,
    classify_failure,
    classify_text,
    kv_exhaustion_marker,
    logged_cause,
)

# Real texts, verbatim from vLLM 0.24/0.32 (GPU and CPU workers), SGLang 0.5, PyTorch 2.x.
OOM_MESSAGES = [
    "ValueError: Free memory on device cuda:0 (12.1/139.8 GiB) on startup is less than desired "
    "GPU memory utilization (0.9, 125.82 GiB). Decrease GPU memory utilization or reduce GPU "
    "memory used by other processes.",
    "ValueError: Available memory on node 0 (5.78/8.21 GiB) on startup is less than desired CPU "
    "memory utilization (0.9, 7.39 GiB). On the CPU backend, the `--gpu-memory-utilization` flag "
    "controls the fraction of CPU memory reserved (despite its name).",
    "ValueError: Available memory on node 0 (5.78/8.21 GiB) on kv cache allocation is less than "
    "requested memory for kv (57.6 GiB). Decrease --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, "
    "or reduce CPU memory used by other processes.",
    "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
    "when initializing the engine.",
    "ValueError: To serve at least one request with the model's max seq len (4096), (0.0 GiB KV "
    "cache is needed, which is larger than the available KV cache memory (0.0 GiB). Based on the "
    "available memory, the estimated maximum model length is 384.",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 79.19 GiB of which 1.02 GiB is free.",
    "RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported",
    "RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't "
    "allocate memory: you tried to allocate 16384000 bytes. Error code 12 (Cannot allocate memory)",
    "terminate called after throwing an instance of 'std::bad_alloc'\n  what():  std::bad_alloc",
    "MemoryError",
    "OpenBLAS error: Memory allocation still failed after 10 retries, giving up.",
    "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
    # vLLM's cumem allocator when a sleeping engine wakes up next to the actor (verl #302).
    "RuntimeError: CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:62",
    "cupy_backends.cuda.api.runtime.CUDARuntimeError: cudaErrorMemoryAllocation: out of memory",
    "RuntimeError: CUDA driver error: out of memory",
    # NCCL running out of device memory for its own buffers is an OOM, not an NCCL bug.
    "host:3018451:3018451 [0] enqueue.cc:1085 NCCL WARN Cuda failure 'out of memory'",
    "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
    "NCCLUtils.hpp:275, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL "
    "version 2.20.5\nncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\n"
    "Cuda failure 2 'out of memory'",
    # SGLang 0.5.17 (kv_cache_configurator.py, pool_configurator.py, tp_worker.py,
    # schedule_batch.py retract_decode through tokenizer_manager.py, managers/utils.py,
    # decode_cuda_graph_runner.py).
    "ValueError: Loaded weights leave no GPU memory for the KV cache under "
    "--mem-fraction-static=0.1. Raise --mem-fraction-static above 0.123 (minimum viable = 1 - "
    "available/pre = 0.1225). If using speculative decoding, draft weights are now counted.",
    "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current "
    "value: mem_fraction_static=0.3",
    "AssertionError: Memory pool size is too small",
    "HTTPException: 500: Out of memory even after retracting all other requests in the decode "
    "batch. Aborting the last request.",
    "ValueError: Input length (3900 tokens) exceeds the maximum allowed length (3000 tokens). "
    "Use a shorter input or enable --allow-auto-truncate.",
    "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 1.17 GiB.\n"
    "Possible solutions:\n1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)",
    # Raised by trials.rollout.phase when SGLang returned requests its KV pool cut short.
    "KvCacheExhausted: engine returned 310 tokens for a request asking 500 (request 3; 41 of "
    "64 requests came back with other lengths than asked): the KV cache ran out",
    # Raised by trials.colocation with vLLM's words on a capped device.
    "EngineMemoryRefused: Free memory on device cpu (0.04/0.05 GiB) on startup is less than "
    "desired GPU memory utilization (0.9, 0.04 GiB): the actor holds 0.01 GiB",
]

# (text, error_type): failures that are no OOM but name their cause.
NAMED_ERRORS = [
    (
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "NCCLUtils.hpp:275, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL "
        "version 2.20.5\nncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\n"
        "Cuda failure 1 'invalid argument'",
        "NcclError",
    ),
    ("RuntimeError: NCCL error: unhandled cuda error", "NcclError"),
    (
        "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.",
        "NcclError",
    ),
    (
        "terminate called after throwing an instance of 'std::runtime_error'\n  what():  NCCL "
        "Error 1: unhandled cuda error",
        "NcclError",
    ),
    (
        "Test NCCL failure common.cu:1204 'unhandled system error (run with NCCL_DEBUG=INFO for details) / '",
        "NcclError",
    ),
    ("RuntimeError: CUDA driver error: invalid argument", "CudaDriverError"),
    ("NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus.", "CudaDriverError"),
    ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "CudaDriverError"),
]

ERROR_MESSAGES = [
    "RuntimeError: CUDA error: an illegal memory access was encountered",
    "ValueError: The decoder prompt (length 300) is longer than the maximum model length of 256.",
    "RuntimeError: Engine core initialization failed. See root cause above. "
    "Failed core proc(s): {'EngineCore': 1}",
    "KeyError: 'model_type'",
    # SGLang: a request longer than the model's context (not its KV pool) is the config's.
    "ValueError: The input (5000 tokens) is longer than the model's context length (4096 tokens).",
    "Rank 0 scheduler died during initialization (exit code: 1). If exit code is -9 (SIGKILL), a "
    "common cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check.",
]


@pytest.mark.parametrize("text", OOM_MESSAGES)
def test_memory_messages_are_oom(text):
    assert classify_text(text) == "oom"


@pytest.mark.parametrize("text", ERROR_MESSAGES)
def test_other_messages_are_not_oom(text):
    assert classify_text(text) is None


@pytest.mark.parametrize(("text", "error_type"), NAMED_ERRORS)
def test_nccl_and_driver_failures_are_errors_named_for_their_cause(text, error_type):
    assert classify_failure(RuntimeError(text)) == ("error", error_type)


def test_an_oom_keeps_the_exceptions_own_type():
    assert classify_failure(RuntimeError("CUDA error: out of memory")) == ("oom", None)


def test_a_named_error_behind_an_engine_wrapper_is_found_in_the_log():
    wrapper = RuntimeError("EngineCore encountered an issue. See stack trace for the root cause.")
    log = "(Worker_TP1 pid=9) RuntimeError: NCCL error: unhandled system error"
    assert classify_failure(wrapper, log) == ("error", "NcclError")


def test_table_is_data():
    assert all(rule.status in ("oom", "error") for rule in PATTERNS)
    assert all(rule.status == "error" for rule in PATTERNS if rule.error_type)


def test_real_python_memory_error():
    with pytest.raises(MemoryError) as info:
        bytearray(1 << 62)
    assert classify(info.value) == "oom"


def test_real_torch_allocator_failure():
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError) as info:
        torch.empty(1 << 50, dtype=torch.uint8)  # 1 PiB
    assert classify(info.value) == "oom"


def test_wrapper_error_is_classified_by_the_engine_log():
    wrapper = RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {}")
    log = "(EngineCore pid=7) ValueError: No available memory for the cache blocks. Try ..."
    assert classify(wrapper, log) == "oom"
    assert classify(wrapper, "(EngineCore pid=7) KeyError: 'model_type'") == "error"


def test_an_engine_death_behind_vllms_dead_engine_error_is_classified_by_the_log():
    # trials.rollout.watch.named_deaths raises EngineDied from vLLM's EngineDeadError: the
    # wrapper in the chain sends the classification to the engine's log, so an engine
    # that died of memory stays an OOM, and one killed for no logged reason an error.
    class EngineDeadError(Exception):
        pass

    def died() -> EngineDied:
        try:
            try:
                raise EngineDeadError("EngineCore encountered an issue. See stack trace (above)")
            except EngineDeadError as front_end:
                raise EngineDied(
                    "the engine process EngineCore (pid 7) exited with code 1 "
                    "while the trial ran; the engine cannot finish"
                ) from front_end
        except EngineDied as exc:
            return exc

    assert classify(died(), "(EngineCore pid=7) torch.OutOfMemoryError: CUDA out of memory") == "oom"
    assert classify(died(), "(EngineCore pid=7) killed") == "error"


def test_log_is_ignored_for_a_self_explaining_error():
    error = ValueError("max_model_len must be >= 1")
    assert classify(error, "earlier: CUDA out of memory") == "error"


def test_chained_cause_counts():
    try:
        try:
            raise MemoryError()
        except MemoryError as inner:
            raise RuntimeError("phase failed") from inner
    except RuntimeError as outer:
        assert classify(outer) == "oom"


SGLANG_SCHEDULER_LOG = (
    "[2026-11-21 12:00:01] Scheduler hit an exception: Traceback (most recent call last):\n"
    '  File "sglang/srt/managers/scheduler.py", line 4930, in run_scheduler_process\n'
    "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current "
    "value: mem_fraction_static=0.2\n"
    "[2026-11-21 12:00:01] Received sigquit from a child process. It usually means the child "
    "failed.\n"
)


@pytest.mark.parametrize(
    "wrapper",
    [
        RuntimeError(
            "Rank 0 scheduler died during initialization (exit code: 1). If exit code is -9 "
            "(SIGKILL), a common cause is the OS OOM killer."
        ),
        RuntimeError("Initialization failed. Please see the error messages above."),
        # trials.rollout.sglang, when an SGLang process signals the trial that it failed.
        EngineDied(
            "an SGLang process failed and signalled the trial (SIGQUIT); see the engine's log "
            "above while the trial ran"
        ),
    ],
)
def test_sglangs_wrappers_are_classified_by_its_schedulers_log(wrapper):
    assert classify_failure(wrapper, SGLANG_SCHEDULER_LOG) == ("oom", None)
    assert classify(wrapper, "Scheduler hit an exception: KeyError: 'model_type'") == "error"


def test_sglangs_kv_exhaustion_lines_are_found_in_its_log():
    log = (
        "[2026-11-21 12:00:00] Prefill batch, #new-seq: 64, #new-token: 8192\n"
        "[2026-11-21 12:00:02] KV cache pool is full. Retract requests. #retracted_reqs: 3, "
        "#new_tokens_gained: 1536, #new_token_ratio: 0.4100 -> 0.9000\n"
        "[2026-11-21 12:00:03] Decode batch, #running-req: 61\n"
    )
    assert kv_exhaustion_marker(log).startswith("[2026-11-21 12:00:02] KV cache pool is full")
    assert kv_exhaustion_marker("retract_decode: aborted last request 7f3a due to OOM")
    assert kv_exhaustion_marker("[2026-11-21 12:00:03] Decode batch, #running-req: 61") is None


# The ends of two trials' logs on an H200 (vLLM 0.24.0, 2026-11-27), verbatim but for the
# frames between: an engine that refused its budget, and one out of memory in its warm-up.
ENGINE_INIT = RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {}")
REFUSED_LOG = """\
(EngineCore pid=7384)   File "/tmp/site/vllm/v1/worker/utils.py", line 415, in request_memory
(EngineCore pid=7384)     raise ValueError(
(EngineCore pid=7384) ValueError: Free memory on device cuda:0 (120.37/139.8 GiB) on startup is \
less than desired GPU memory utilization (0.95, 132.81 GiB). Decrease GPU memory utilization or \
reduce GPU memory used by other processes.
[rank0]:[W1127 05:50:49.901455496 ProcessGroupNCCL.cpp:1575] Warning: WARNING: \
destroy_process_group() was not called before program exit, which can leak resources.
  File "/tmp/site/vllm/v1/engine/core_client.py", line 1053, in wait_for_engine_startup
    raise RuntimeError(
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""
WARM_UP_LOG = """\
(EngineCore pid=5605)   File "/tmp/site/vllm/v1/worker/gpu_model_runner.py", line 6111, in _dummy_sampler_run
(EngineCore pid=5605)     raise RuntimeError(
(EngineCore pid=5605) RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 \
dummy requests. Please try lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine.
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


@pytest.mark.parametrize(
    ("log", "cause"),
    [
        (REFUSED_LOG, "ValueError: Free memory on device cuda:0 (120.37/139.8 GiB) on startup"),
        (WARM_UP_LOG, "RuntimeError: CUDA out of memory occurred when warming up sampler with 1024"),
        # No table row: the last line that raises, not the wrapper itself.
        (
            "(EngineCore pid=7) KeyError: 'model_type'\nRuntimeError: Engine core initialization failed.",
            "KeyError: 'model_type'",
        ),
    ],
)
def test_the_logs_cause_of_a_wrapper_error_is_named(log, cause):
    assert classify(ENGINE_INIT, log) in ("oom", "error")
    found = logged_cause(ENGINE_INIT, log)
    assert found is not None and found.startswith(cause) and "pid=" not in found


def test_a_self_explaining_error_needs_no_cause_from_the_log():
    assert logged_cause(ValueError("max_model_len must be >= 1"), REFUSED_LOG) is None
    assert logged_cause(ENGINE_INIT, "nothing raised here") is None


def test_a_failed_trials_message_carries_the_logs_cause():
    from trials.runner import _record_failure
    from trials.types import TrialResult

    result = TrialResult("t", "ok")
    _record_failure(result, ENGINE_INIT, REFUSED_LOG, "RuntimeError: Engine core initialization failed.")
    assert result.status == "oom"
    assert result.error_message.startswith("Engine core initialization failed. See root cause above.")
    assert (
        "(the engine's log: ValueError: Free memory on device cuda:0 (120.37/139.8 GiB)"
        in result.error_message
    )
