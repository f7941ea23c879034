"""Real trials through ``launch_trial``: vLLM on CPU with the tiny model, plus train.

One engine start per engine test; ~3 minutes in all on 2 cores.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import threading
import time

import pytest
from trial_helpers import make_spec, wait_for_phase, with_engine
from trial_watch import EngineCpus, TrialSessions, is_engine_core

from trials.launcher import launch_trial, session_processes
from trials.rollout import BACKENDS
from trials.step import STEP_COMPONENTS, TRAIN_SUB_PHASES

# The deadline of a trial stopped in its engine's start-up (test_timeout_kills_the_whole_process_group).
TOO_SLOW_S = 120


@pytest.mark.engine
@pytest.mark.parametrize("engine", sorted(BACKENDS))
def test_full_trial_on_cpu(tiny_config, engine):
    if importlib.util.find_spec(engine) is None:
        pytest.skip(f"{engine} is not installed here")
    spec = make_spec(tiny_config, trial_id=f"e2e-{engine}", samples_per_prompt=4)
    with_engine(spec, engine)
    spec.rollout.free_cache_engine = False  # the engine stays up beside the training actor
    spec.train_probe = True
    spec.prompt_lengths = [p for p in spec.prompt_lengths[::4] for _ in range(4)]
    with TrialSessions() as sessions, EngineCpus() as engine_cpus:
        result = launch_trial(spec, timeout_s=240)
    assert result.status == "ok", (result.error_message, result.log_tail[-3000:])
    m, t = result.metrics, result.phase_timings_s
    if engine == "vllm":
        # vLLM's worker kept the trial's CPUs: not pinned to the host's first core, where
        # the engines of trials side by side (or of a trial's replicas) would share one.
        assert list(engine_cpus.cpus.values()) == [os.sched_getaffinity(0)], engine_cpus.cpus
    # Every request came back with exactly its length (a mismatch fails the trial).
    assert m["rollout_generated_tokens"] == sum(spec.response_lengths)
    assert m["rollout_requests"] == len(spec.prompt_lengths)
    for name in (
        "rollout_generated_tokens_per_s",
        "rollout_total_tokens_per_s",
        *(f"{p}_tokens_per_s" for p in TRAIN_SUB_PHASES),
        "throughput_tokens_per_s_per_gpu",
        "engine_startup_s",
        "actor_resident_gib",
    ):
        assert m[name] > 0, name
    assert m["kv_cache_tokens"] >= spec.rollout.max_model_len
    assert m["rollout_preemptions"] >= 0
    peaks = [m[f"{p}_peak_memory_gib"] for p in ("startup", "rollout", "train")]
    assert min(peaks) > 0 and m["peak_memory_gib"] == max(peaks)
    # The actor (FSDP2 on gloo, a world of one) was built before the engine started; the
    # engine stayed up (its processes' memory counted) until the actor had trained.
    assert m["actor_fsdp"] == 1 and m["actor_fsdp_world_size"] == 1
    assert m["actor_ready_at_s"] < m["train_probe_end_at_s"] <= m["engine_start_at_s"]
    assert m["engine_start_at_s"] < m["engine_ready_at_s"]
    assert m["train_probe_s"] > 0 and m["train_probe_peak_memory_gib"] > 0
    # The probe leaves the actor as it found it (AdamW's state was there already).
    assert m["train_probe_allocated_gib"] == pytest.approx(m["actor_allocated_gib"], rel=0.02)
    assert m["engine_ready_at_s"] < m["train_start_at_s"] < m["train_end_at_s"]
    assert m["train_end_at_s"] < m["engine_shutdown_at_s"]
    assert m["engine_resident_in_train"] == 1 and "engine_released_at_s" not in m
    assert m["train_expandable_segments"] == 0  # a CUDA allocator's setting: not on the CPU
    # The host's processor as the trial met it: its model and the CPUs it could run on.
    assert result.software["cpu"] and result.software["cpu_cores"] == str(len(os.sched_getaffinity(0)))
    assert int(result.software["host_cpus"]) >= int(result.software["cpu_cores"])
    assert m["train_peak_memory_gib"] >= 0.9 * m["rollout_peak_memory_gib"]
    assert set(t) == {"startup", "weight_sync", "rollout", "rollout_poll", *TRAIN_SUB_PHASES, "actor_reload"}
    # The actor's fp32 weights went into the running engine before the rollout, in one
    # bucket of verl's default 2048 MB; the sync is part of the step.
    params = m["actor_params"]
    embed = tiny_config["vocab_size"] * tiny_config["hidden_size"]  # lm_head, tied, sent too
    assert m["weight_sync_bytes"] == 4 * (params + embed) and m["weight_sync_buckets"] == 1
    assert m["engine_ready_at_s"] < m["weights_synced_at_s"] < m["train_start_at_s"]
    assert t["weight_sync"] == m["weight_sync_s"] > 0
    # The timed sync is the second: the first, cold one (verl's warm-up step pays it) is kept apart.
    assert m["weight_sync_first_s"] > 0 and m["weight_sync_load_s"] > 0
    parts = m["weight_sync_pack_s"] + m["weight_sync_load_s"] + m["weight_sync_release_s"]
    assert parts == pytest.approx(m["weight_sync_s"])
    assert 0 < m["weight_sync_gc_s"] <= m["weight_sync_s"]  # the buffer's release collects
    assert m["weight_sync_full_gcs"] >= 1 and m["weight_sync_gcs"] >= m["weight_sync_full_gcs"]
    # What one full collection costs the process is walked on a GPU only, where verl's worker
    # records it too (tests/trials/test_gpu.py).
    assert "train_gc_walk_s" not in m
    step = sum(t[p] for p in STEP_COMPONENTS if p in t)
    # verl sees the rollout at its replay buffer's first 2 s poll after the rollout's end.
    gen = m["rollout_makespan_s"] + t["rollout_poll"]
    assert 0 <= t["rollout_poll"] < 2.0 and gen / 2.0 == pytest.approx(round(gen / 2.0))
    rollout_side = gen + t["weight_sync"]
    assert step == pytest.approx(rollout_side + sum(t[p] for p in TRAIN_SUB_PHASES))
    assert m["step_time_s"] == pytest.approx(step)
    tokens = sum(spec.train_prompt_lengths) + sum(spec.train_response_lengths)
    assert m["throughput_tokens_per_s_per_gpu"] == pytest.approx(tokens / step)
    assert sessions.sids and sessions.leftovers() == []


@pytest.mark.engine
def test_an_engine_side_trial_starts_its_engine_beside_the_actor_and_trains_nothing(tiny_config):
    spec = make_spec(tiny_config, trial_id="engine-side", requests=8, engine_side_only=True, train_probe=True)
    with TrialSessions() as sessions:
        result = launch_trial(spec, timeout_s=240)
    assert result.status == "ok", (result.error_message, result.log_tail[-3000:])
    m, t = result.metrics, result.phase_timings_s
    assert m["engine_side_only"] == 1
    # The actor was built and probed before the engine started, as in a whole trial, so the
    # engine met the device as it would; then it synced, rolled out and was released.
    assert m["actor_resident_gib"] > 0 and m["train_probe_s"] > 0
    assert m["actor_ready_at_s"] < m["train_probe_end_at_s"] <= m["engine_start_at_s"]
    assert m["engine_ready_at_s"] < m["weights_synced_at_s"] < m["engine_released_at_s"]
    assert m["rollout_generated_tokens"] == sum(spec.response_lengths)
    # No training: none of its parts, its timeline or its peak.
    assert not set(TRAIN_SUB_PHASES) & set(t) and not any(k.startswith("train_start") for k in m)
    assert "train_peak_memory_gib" not in m and "old_log_prob_tokens_per_s" not in m
    # The step is the engine's side: its throughput the rollout's tokens over it.
    step = sum(t[p] for p in STEP_COMPONENTS if p in t)
    assert m["step_time_s"] == pytest.approx(step) and step >= m["rollout_makespan_s"]
    tokens = m["rollout_prompt_tokens"] + m["rollout_generated_tokens"]
    assert m["throughput_tokens_per_s_per_gpu"] == pytest.approx(tokens / step)
    assert sessions.leftovers() == []


@pytest.mark.engine
def test_kv_cache_too_small_for_max_model_len_is_oom_at_startup(tiny_config):
    # 0.0005 * 1 GiB = 0.5 MiB of KV cache: a few hundred tokens, max_model_len 4096. The
    # actor is resident already (built first, as in verl) and is torn down with the trial.
    spec = make_spec(tiny_config, trial_id="kv-oom", device_memory_cap_gib=1.0, requests=8)
    spec.rollout.gpu_memory_utilization = 0.0005
    spec.rollout.max_model_len = 4096
    with TrialSessions() as sessions:
        result = launch_trial(spec, timeout_s=240)
    assert (result.status, result.phase) == ("oom", "startup"), result.error_message
    # The exception only says "see root cause above"; the engine's log said why.
    assert "larger than the available KV cache memory" in result.log_tail
    assert result.metrics["actor_ready_at_s"] <= result.metrics["engine_start_at_s"]
    assert sessions.leftovers() == []


@pytest.mark.engine
def test_timeout_kills_the_whole_process_group(tiny_config):
    # The trial hangs in its engine's start-up: once vLLM's engine process is up beside it,
    # the trial is stopped (SIGSTOP), so it can neither finish first on a fast machine nor
    # be short of its start-up when the deadline fires on a loaded one.
    # The deadline leaves a loaded 2-core machine time to import vLLM and spawn its engine.
    spec = make_spec(tiny_config, trial_id="too-slow", phases=["rollout"])
    results, engines = [], []
    with TrialSessions() as sessions:
        worker = threading.Thread(
            target=lambda: results.append(launch_trial(spec, timeout_s=TOO_SLOW_S, grace_s=3))
        )
        worker.start()
        deadline = time.monotonic() + TOO_SLOW_S - 10
        while not engines and time.monotonic() < deadline:
            engines = [pid for sid in sessions.sids for pid in session_processes(sid) if is_engine_core(pid)]
            time.sleep(0.05)
        assert engines, f"the trial started no engine process within {TOO_SLOW_S - 10} s"
        os.kill(next(iter(sessions.sids)), signal.SIGSTOP)
        worker.join(120)
    (result,) = results
    assert result.status == "timeout"
    assert result.phase == "startup"  # from the progress file: the engine was starting
    assert result.wall_s < TOO_SLOW_S + 3 + 10 + 5
    assert sessions.leftovers() == []


def test_timeout_before_any_phase(tiny_config):
    spec = make_spec(tiny_config, trial_id="three-s", phases=["train"])
    with TrialSessions() as sessions:
        result = launch_trial(spec, timeout_s=1, grace_s=2)
    assert result.status == "timeout" and result.error_type == "TrialTimeout"
    assert sessions.leftovers() == []


def test_a_trial_killed_without_a_result_is_an_error_with_its_signal(tiny_config):
    spec = make_spec(tiny_config, trial_id="killed", phases=["train"])
    results = []
    with TrialSessions() as sessions:
        worker = threading.Thread(target=lambda: results.append(launch_trial(spec, 120)))
        worker.start()
        deadline = time.monotonic() + 30
        while not sessions.sids and time.monotonic() < deadline:
            time.sleep(0.05)
        trial = next(iter(sessions.sids))
        wait_for_phase(trial)  # into its trial
        os.kill(trial, signal.SIGKILL)  # as the kernel's OOM killer would
        worker.join(60)
    (result,) = results
    assert (result.status, result.error_type) == ("error", "TrialProcessDied")
    assert "killed by SIGKILL" in result.error_message
    assert sessions.leftovers() == []
