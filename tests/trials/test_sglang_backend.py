"""The SGLang backend's own code over a stand-in engine (SGLang runs on CUDA GPUs only).

``stand_in_sglang/`` provides ``sglang.srt.entrypoints.engine.Engine`` with the behaviours
of SGLang 0.5.17 the backend must handle (see its README): requests cut to what the KV pool
holds without an error, retraction warnings, SIGQUIT from a failed process, release and
resume by tag, and its event loop (uvloop; the output reader on the loop running when it
is first needed). Everything else here is the real backend, phase code and failure table;
the GPU tests (``test_gpu_sglang.py``) run the real engine.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

import pytest
from trial_helpers import QWEN_05B_CONFIG, make_spec, with_engine

from trials.errors import EngineDied, KvCacheExhausted
from trials.failures import classify_failure
from trials.logcapture import StderrTail
from trials.rollout import get_backend
from trials.rollout.base import dummy_model_dir
from trials.rollout.phase import measure_rollout


def _spec(requests: int = 8):
    spec = make_spec(
        json.loads(QWEN_05B_CONFIG.read_text()), requests=requests, device="cuda", device_memory_cap_gib=None
    )
    with_engine(spec, "sglang")
    spec.warmup_requests = 2
    return spec


def _started(spec):
    backend = get_backend("sglang")
    backend.start(spec, "bfloat16")
    return backend


def test_a_rollout_counts_lengths_kv_and_retractions(stand_in):
    stand_in.retractions = 3  # warnings per generation, 2 requests each
    spec = _spec()
    quit_before, term_before = signal.getsignal(signal.SIGQUIT), signal.getsignal(signal.SIGTERM)
    backend = _started(spec)
    try:
        engine = stand_in.instances[0]
        assert signal.getsignal(signal.SIGTERM) == term_before  # the trial's, not SGLang's
        # SGLang's output reader runs on the loop generate runs, else every generation waits
        assert engine.tokenizer_manager.event_loop is engine.loop
        assert engine.kwargs["mem_fraction_static"] == spec.rollout.gpu_memory_utilization
        assert os.path.exists(os.path.join(engine.kwargs["model_path"], "config.json"))
        with StderrTail():
            metrics = measure_rollout(backend, spec)
        assert metrics["rollout_generated_tokens"] == sum(spec.response_lengths)
        assert metrics["kv_cache_tokens"] == 4096
        assert metrics["rollout_preemptions"] == 6  # the main generation's, not the warm-up's
        assert backend.facts().preemptions == 12
    finally:
        backend.shutdown()
    assert engine.scheduler.poll() is not None and ("shutdown", ()) in engine.calls
    assert signal.getsignal(signal.SIGQUIT) == quit_before
    assert engine.killed_tree == [] and engine.drained == []  # SGLang's handlers never ran
    # the dummy model's directory is the host's, shared by the next trial of this model
    assert engine.kwargs["model_path"] == dummy_model_dir(spec)
    assert os.path.exists(os.path.join(engine.kwargs["model_path"], "config.json"))


def test_requests_cut_short_by_the_kv_pool_are_an_oom_not_a_fast_success(stand_in):
    spec = _spec()
    longest = max(p + r for p, r in zip(spec.prompt_lengths, spec.response_lengths, strict=True))
    stand_in.kv_tokens = longest - 10  # SGLang cuts max_new_tokens to what the pool holds
    backend = _started(spec)
    try:
        with StderrTail() as tail, pytest.raises(KvCacheExhausted) as caught:
            measure_rollout(backend, spec)
    finally:
        backend.shutdown()
    message = str(caught.value)
    assert f"the cache holds {longest - 10}" in message and "gpu_memory_utilization" in message
    failure = classify_failure(caught.value, tail.text())
    assert (failure.status, failure.error_type) == ("oom", None)


def test_sleep_and_wake_release_and_resume_what_verl_releases(stand_in):
    backend = _started(_spec())
    try:
        engine = stand_in.instances[0]
        assert backend.can_sleep
        backend.sleep()
        backend.wake_up(["weights"])
        backend.wake_up(["kv_cache"])
        backend.sleep()
        backend.wake_up()
    finally:
        backend.shutdown()
    assert engine.calls[:5] == [
        ("release", ("kv_cache", "weights")),
        ("resume", ("weights",)),
        ("resume", ("kv_cache",)),
        ("flush", ()),
        ("release", ("kv_cache", "weights")),
    ]
    assert engine.calls[5] == ("resume", ("kv_cache", "weights")) and not engine.offload_tags


def test_a_failure_sglang_signals_raises_in_the_blocked_generation(stand_in):
    stand_in.block_in_generate = True
    spec = _spec()
    backend = _started(spec)
    engine = stand_in.instances[0]
    try:
        with StderrTail() as tail:
            # What a scheduler does when it hits an exception: log it, SIGQUIT its parent.
            print(
                "[2026-11-21 12:00:00] Scheduler hit an exception: Traceback (most recent call "
                "last):\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
                file=sys.stderr,
                flush=True,
            )
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGQUIT)).start()
            with pytest.raises(EngineDied, match="see the engine's log") as caught:
                backend.generate([[1, 2, 3]], [4])
            failure = classify_failure(caught.value, tail.text())
    finally:
        backend.shutdown()
    assert failure.status == "oom"
    assert engine.killed_tree == []  # SGLang's own handler (kill the tree) never ran


def test_a_killed_engine_process_raises_in_the_blocked_generation(stand_in):
    stand_in.block_in_generate = True
    backend = _started(_spec())
    engine = stand_in.instances[0]
    try:
        threading.Timer(0.3, engine.scheduler.kill).start()
        with pytest.raises(EngineDied, match=f"engine process {engine.scheduler.pid} exited"):
            backend.generate([[1, 2, 3]], [4])
        os.kill(os.getpid(), signal.SIGQUIT)  # SGLang's watchdog, late: the failure was raised
    finally:
        backend.shutdown()


def test_a_failed_start_leaves_no_process_behind(stand_in, monkeypatch):
    spec = _spec()
    spec.rollout.engine_kwargs = {"no_such_argument": 1}  # ServerArgs refuses it
    backend = get_backend("sglang")
    with pytest.raises(TypeError, match="no_such_argument"):
        backend.start(spec, "bfloat16")
    backend.shutdown()
    assert stand_in.instances == []
