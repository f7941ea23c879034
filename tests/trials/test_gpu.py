"""On an NVIDIA GPU: the trials with device ``cuda`` (skipped without one).

The co-located tests use a Qwen2.5-0.5B-shaped model (``autotuner/catalog``) as verl runs
it: an FSDP2 actor with fp32 master weights and AdamW state resident on the GPU, the
vLLM engine started beside it, put to sleep for training and woken for the next step.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time

import pytest
from trial_helpers import QWEN_05B_CONFIG, make_spec

from trials.launcher import launch_trial
from trials.step import STEP_COMPONENTS


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _has_cuda(), reason="needs an NVIDIA GPU with CUDA"),
]

HOLD_GIB = 3


def _needs_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed here")


def qwen_spec(trial_id: str, **overrides):
    """64 requests of 192-255 prompt + 192-255 response tokens, one rank's batch, bf16."""
    config = json.loads(QWEN_05B_CONFIG.read_text())
    spec = make_spec(
        config,
        trial_id=trial_id,
        requests=64,
        device="cuda",
        dtype="bfloat16",
        device_memory_cap_gib=None,
        local_mini_batch_size=32,
    )
    spec.prompt_lengths = [192 + (i * 37) % 64 for i in range(64)]
    spec.response_lengths = [192 + (i * 53) % 64 for i in range(64)]
    spec.train_prompt_lengths = list(spec.prompt_lengths)
    spec.train_response_lengths = list(spec.response_lengths)
    spec.rollout.max_model_len = 512
    spec.rollout.max_num_seqs = 64
    spec.rollout.max_num_batched_tokens = 8192
    spec.train.ppo_micro_batch_size_per_gpu = 8
    spec.train.log_prob_micro_batch_size_per_gpu = 16
    spec.train.ref_log_prob_micro_batch_size_per_gpu = 16
    for key, value in overrides.items():
        setattr(spec, key, value)
    return spec


class HeldGpuMemory:
    """A separate process holding ``HOLD_GIB`` GiB on GPU 0 until the block ends."""

    def __enter__(self) -> HeldGpuMemory:
        code = (
            "import sys, time, torch\n"
            f"x = torch.empty({HOLD_GIB} << 30, dtype=torch.uint8, device='cuda')\n"
            "print('ready', flush=True)\n"
            "time.sleep(120)\n"
        )
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.kill()
        self.proc.wait()


def test_nvml_reader_sees_memory_another_process_holds():
    from trials.gpu_clean import unclean_message
    from trials.memory import gpu_readings

    with HeldGpuMemory() as held:
        readings = gpu_readings()
        assert readings and readings[0].used_gib >= HOLD_GIB
        message = unclean_message(readings, threshold_gib=2.0)
        assert message is not None and readings[0].gpu in message
        pids = [p.pid for p in readings[0].processes]
        if held.proc.pid in pids:  # same PID namespace: the holder is named
            assert f"pid {held.proc.pid}" in message
    deadline = time.monotonic() + 10
    while (readings := gpu_readings()) and readings[0].used_gib >= HOLD_GIB:
        assert time.monotonic() < deadline, "the holder's memory was not released"
        time.sleep(0.2)


def test_a_trial_refuses_a_gpu_someone_else_holds(tiny_config):
    spec = make_spec(tiny_config, trial_id="not-clean", phases=["train"], device="cuda")
    spec.gpu_clean_threshold_gib = 2.0
    spec.gpu_clean_wait_s = 2.0
    with HeldGpuMemory():
        result = launch_trial(spec, timeout_s=120)
    assert (result.status, result.phase, result.error_type) == ("error", "startup", "GpuNotClean")
    assert "GiB in use" in result.error_message


def cuda_train_spec(config, trial_id: str):
    """A train-only bf16 trial of ``config`` on the GPU, uncapped."""
    return make_spec(
        config,
        trial_id=trial_id,
        phases=["train"],
        device="cuda",
        dtype="bfloat16",
        device_memory_cap_gib=None,
    )


@pytest.mark.parametrize("offload", [False, True])
def test_train_trial_on_cuda(tiny_config, offload):
    spec = cuda_train_spec(tiny_config, f"gpu-train-{offload}")
    spec.train.param_offload = spec.train.optimizer_offload = offload
    result = launch_trial(spec, timeout_s=300)
    assert result.status == "ok", (result.error_message, result.log_tail[-3000:])
    m = result.metrics
    assert m["train_dtype_bits"] == 16 and m["actor_master_dtype_bits"] == 32
    assert m["actor_fsdp"] == 1 and m["actor_fsdp_fake_collectives"] == 0  # NCCL, world of 1
    assert m["train_peak_memory_gib"] > 0 and m["actor_resident_gib"] > 0
    assert (m["actor_reload_s"] > 0) == offload
    assert m["gpu_memory_after_gib"] < spec.gpu_clean_threshold_gib
    assert not result.device.startswith("cpu")


def test_verls_fsdp1_strategy_trains_as_fsdp2_does(tiny_config):
    """strategy fsdp: the actor and the ref under FSDP1, as verl v0.9 builds them by default;
    the same step's work as FSDP2's, the same master weights and the ref offloaded."""
    results = {}
    for strategy in ("fsdp", "fsdp2"):
        spec = cuda_train_spec(tiny_config, f"gpu-{strategy}")
        spec.train.strategy = strategy
        results[strategy] = launch_trial(spec, timeout_s=300)
    for strategy, result in results.items():
        assert result.status == "ok", (strategy, result.error_message, result.log_tail[-3000:])
    one, two = results["fsdp"].metrics, results["fsdp2"].metrics
    assert (one["actor_fsdp_version"], two["actor_fsdp_version"]) == (1, 2)
    assert one["actor_master_dtype_bits"] == 32 and one["ref_cpu_offload"] == 1
    assert one["actor_fsdp_units"] == two["actor_fsdp_units"]  # each decoder layer and the root
    assert one["actor_params"] >= two["actor_params"]  # FSDP1's flat parameters may pad
    for key in ("old_log_prob_micro_batches", "update_actor_micro_batches", "step_tokens"):
        assert one[key] == two[key], key


@pytest.mark.engine
def test_verls_fsdp1_actor_sends_its_full_weights_into_the_engine(tiny_config):
    _needs_vllm()
    spec = make_spec(
        tiny_config, trial_id="gpu-fsdp1-e2e", device="cuda", dtype="bfloat16", device_memory_cap_gib=None
    )
    spec.train.strategy = "fsdp"
    spec.rollout.gpu_memory_utilization = 0.3
    result = launch_trial(spec, timeout_s=600)
    assert result.status == "ok", (result.error_message, result.log_tail[-3000:])
    m = result.metrics
    # FSDP1's full state dict on a world of one: every fp32 weight, by its own name (the
    # flat parameters of a world of one hold no padding).
    embed = tiny_config["vocab_size"] * tiny_config["hidden_size"]  # lm_head, tied, sent too
    assert m["actor_fsdp_version"] == 1
    assert m["weight_sync_bytes"] == 4 * (m["actor_params"] + embed)
    assert result.phase_timings_s["weight_sync"] > 0


def test_one_rank_of_eight_holds_an_eighth_of_the_actor():
    one = launch_trial(qwen_spec("rank-of-1", phases=["train"]), timeout_s=600)
    eight = launch_trial(qwen_spec("rank-of-8", phases=["train"], n_gpus=8), timeout_s=600)
    for result in (one, eight):
        assert result.status == "ok", (result.error_message, result.log_tail[-3000:])
    assert eight.metrics["actor_fsdp_world_size"] == 8
    assert eight.metrics["actor_fsdp_fake_collectives"] == 1
    # 12 bytes per parameter of the rank's share (fp32 weights + AdamW; the reference model
    # lives in pinned host memory): an eighth, give or take the unsharded buffers.
    assert one.metrics["actor_allocated_gib"] > 6 * eight.metrics["actor_allocated_gib"]
    # What the engine cannot use also holds the allocator's cached blocks (seen on an H200:
    # 6.25 vs 1.56 GiB reserved, 4x), still far below the unsharded actor.
    assert one.metrics["actor_resident_gib"] > 3 * eight.metrics["actor_resident_gib"]


def test_train_trial_on_cuda_hits_a_real_oom_under_a_cap(tiny_config):
    spec = make_spec(
        tiny_config,
        trial_id="gpu-oom",
        phases=["train"],
        device="cuda",
        requests=64,
        train_prompt_lengths=[2000] * 64,
        train_response_lengths=[2000] * 64,
        local_mini_batch_size=64,
        device_memory_cap_gib=1.0,
    )
    spec.train.ppo_micro_batch_size_per_gpu = 64
    spec.train.log_prob_micro_batch_size_per_gpu = 1
    spec.train.ref_log_prob_micro_batch_size_per_gpu = 1
    result = launch_trial(spec, timeout_s=300)
    assert (result.status, result.phase) == ("oom", "update_actor"), result.error_message


@pytest.mark.engine
def test_full_trial_on_cuda(tiny_config):
    _needs_vllm()
    spec = make_spec(
        tiny_config, trial_id="gpu-e2e", device="cuda", dtype="bfloat16", device_memory_cap_gib=None
    )
    spec.rollout.gpu_memory_utilization = 0.3
    result = launch_trial(spec, timeout_s=600)
    assert result.status == "ok", (result.error_message, result.log_tail[-3000:])
    assert result.metrics["rollout_generated_tokens"] == sum(spec.response_lengths)
    assert result.metrics["kv_cache_tokens"] > 0
    m = result.metrics
    assert m["engine_sleep_s"] > 0 and m["engine_wake_s"] > 0
    # The hand-over's parts (engine weights, the actor's cache emptied, KV cache) make its time.
    wake_parts = ("engine_wake_weights_s", "engine_wake_release_s", "engine_wake_kv_cache_s")
    assert all(m[k] > 0 for k in wake_parts)
    assert sum(m[k] for k in wake_parts) == pytest.approx(m["engine_wake_s"])
    # As in verl 0.9.1's update_weights, the cache is emptied without collecting garbage: no
    # walk of the heap (the trial's took 0.13-0.5 s, verl's traced worker made none).
    assert m["engine_wake_full_gcs"] == 0 and m["engine_wake_gc_s"] < m["engine_wake_s"]
    assert m["weight_sync_full_gcs"] == 0  # nor does the sync's release of its bucket buffer
    assert m["train_gc_walk_s"] > 0  # what one would cost: a walk of the trial's heap
    # The timed weight sync is the second; the first, cold one is kept apart.
    assert m["weight_sync_first_s"] > 0 and m["weight_sync_load_s"] > 0


@pytest.mark.engine
def test_colocated_qwen_half_b_step_on_cuda():
    _needs_vllm()
    spec = qwen_spec("colocated")
    spec.rollout.gpu_memory_utilization = 0.5
    spec.rollout.enforce_eager = False
    spec.rollout.cudagraph_capture_sizes = [1, 2, 4, 8, 16, 32, 64]
    # Offloaded: the actor moves around each train sub-phase, and the weight sync streams its
    # parameters from the CPU tensor by tensor (verl's FSDP2); the hand-over moves none.
    spec.train.param_offload = True
    result = launch_trial(spec, timeout_s=600)
    assert result.status == "ok", (result.error_message, result.log_tail[-3000:])
    m, t = result.metrics, result.phase_timings_s
    # The actor (fp32 weights offloaded, AdamW state on the GPU) was resident when the engine
    # started beside it, and the engine slept while the actor trained.
    assert m["actor_resident_gib"] > 1.0
    assert m["actor_ready_at_s"] <= m["engine_start_at_s"] < m["engine_ready_at_s"]
    assert m["engine_released_at_s"] <= m["train_start_at_s"]
    assert m["engine_resident_in_train"] == 0 and m["engine_sleep_s"] > 0
    assert m["train_expandable_segments"] == 1  # verl's training worker trains with them
    assert m["train_peak_memory_gib"] < m["rollout_peak_memory_gib"] / 2
    assert m["engine_wake_s"] > 0 and m["actor_reload_s"] > 0
    assert m["engine_wake_full_gcs"] == 0 and "actor_wake_reload_s" not in m
    assert m["rollout_generated_tokens"] == sum(spec.response_lengths)
    assert set(STEP_COMPONENTS) <= set(t)
    assert m["step_time_s"] == pytest.approx(sum(t[k] for k in STEP_COMPONENTS))
    for name in ("startup", "rollout", "train", "wake"):
        assert m[f"{name}_peak_memory_gib"] > 0, name
    assert m["gpu_memory_after_gib"] < spec.gpu_clean_threshold_gib


def test_the_train_allocator_maps_expandable_segments_only_inside():
    # In a process of its own: the allocator's settings are the process's.
    code = """
import torch
from trials.actor_state import train_allocator

def expandable(t):
    p = t.data_ptr()
    segs = [s for s in torch.cuda.memory_snapshot() if s["address"] <= p < s["address"] + s["total_size"]]
    return segs[0]["is_expandable"]

before = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
with train_allocator("cuda", True):
    inside = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    flags = [expandable(before), expandable(inside)]
del inside
after = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
with train_allocator("cuda", False):
    control = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
print(flags + [expandable(after), expandable(control)])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-4:] == ["[False,", "True,", "False,", "False]"]


@pytest.mark.engine
def test_a_gpu_memory_utilization_that_cannot_fit_beside_the_actor_is_oom_at_startup():
    _needs_vllm()
    spec = qwen_spec("too-greedy")
    spec.rollout.gpu_memory_utilization = 0.97  # the actor holds more than the 3% left
    result = launch_trial(spec, timeout_s=600)
    assert (result.status, result.phase) == ("oom", "startup"), (
        result.error_message,
        result.log_tail[-3000:],
    )
    assert result.metrics["actor_resident_gib"] > 0
    assert "less than desired GPU memory utilization" in (result.error_message + result.log_tail)


@pytest.mark.engine
def test_the_train_probe_leaves_the_engine_the_memory_an_offloaded_actor_frees():
    """After the probe, an offloaded actor holds (almost) nothing, reserved included: the
    math libraries' workspaces must not pin segments the probe's temporaries freed."""
    _needs_vllm()
    spec = qwen_spec("probe-residue", phases=["rollout", "train"], train_probe=True)
    spec.train.param_offload = spec.train.optimizer_offload = True
    spec.rollout.gpu_memory_utilization = 0.3
    result = launch_trial(spec, timeout_s=600)
    assert result.status == "ok", (result.error_message, result.log_tail[-3000:])
    m = result.metrics
    assert m["train_probe_allocated_gib"] < 0.5
    assert m["train_probe_resident_gib"] - m["train_probe_allocated_gib"] < 1.0, m


@pytest.mark.engine
def test_an_engine_side_sleeps_and_wakes_its_engine_around_no_training():
    """The engine's side of a step alone (``engine_side_only``): the actor built, probed and
    resident; the engine started beside it, put to sleep and woken; nothing trained."""
    _needs_vllm()
    spec = qwen_spec("engine-side", phases=["rollout", "train"], train_probe=True, engine_side_only=True)
    spec.rollout.gpu_memory_utilization = 0.3
    result = launch_trial(spec, timeout_s=600)
    assert result.status == "ok", (result.error_message, result.log_tail[-3000:])
    m, t = result.metrics, result.phase_timings_s
    assert m["engine_side_only"] == 1 and m["train_probe_s"] > 0 and m["actor_resident_gib"] > 0
    assert t["engine_sleep"] > 0 and t["engine_wake"] > 0 and m["engine_asleep_gib"] > 0
    assert not {"old_log_prob", "ref_log_prob", "update_actor"} & set(t) and "train_peak_memory_gib" not in m
    assert m["step_time_s"] == pytest.approx(sum(t[p] for p in STEP_COMPONENTS if p in t))


def _needs_gpus(n: int) -> None:
    import torch

    if torch.cuda.device_count() < n:
        pytest.skip(f"needs {n} GPUs, this host shows {torch.cuda.device_count()}")


def tp2_world_spec(trial_id: str, gpus: int):
    """The whole world of ``gpus`` GPUs in one trial: a rank per GPU over a real process
    group, a TP-2 replica per two GPUs, each replica and rank with its share of the step."""
    spec = qwen_spec(trial_id, trial_gpus=gpus, n_gpus=gpus, rollout_replicas=gpus // 2)
    spec.prompt_lengths = spec.prompt_lengths * (gpus // 2)  # the replicas' shares
    spec.response_lengths = spec.response_lengths * (gpus // 2)
    spec.train_prompt_lengths = spec.train_prompt_lengths * gpus  # the ranks' shares
    spec.train_response_lengths = spec.train_response_lengths * gpus
    spec.rollout.tensor_model_parallel_size = 2
    spec.rollout.gpu_memory_utilization = 0.5
    return spec


@pytest.mark.engine
def test_a_world_of_two_gpus_runs_one_tp2_replica_beside_a_real_fsdp_actor():
    """The whole world in one trial: two rank processes, NCCL between their actor shards,
    one TP-2 engine over both GPUs, slept for training and woken for the next step."""
    _needs_vllm()
    _needs_gpus(2)
    spec = tp2_world_spec("world-tp2", 2)
    spec.train.param_offload = True
    result = launch_trial(spec, timeout_s=600)
    assert result.status == "ok", (result.error_message, result.log_tail[-3000:])
    m, t = result.metrics, result.phase_timings_s
    assert m["trial_ranks"] == 2 and m["trial_replicas"] == 1
    assert m["actor_real_collectives"] == 1 and m["actor_fsdp_world_size"] == 2
    assert m["rollout_generated_tokens"] == sum(spec.response_lengths)
    assert m["engine_sleep_s"] > 0 and m["engine_wake_s"] > 0 and m["actor_reload_s"] > 0
    assert set(STEP_COMPONENTS) <= set(t)
    assert m["step_time_s"] == pytest.approx(sum(t[k] for k in STEP_COMPONENTS))
    assert result.visible_gpus is None or len(result.visible_gpus.split(",")) >= 2
    assert m["gpu_memory_after_gib"] < spec.gpu_clean_threshold_gib


@pytest.mark.engine
@pytest.mark.parametrize("bucket_megabytes", [2048, 256])
def test_a_world_of_four_gpus_runs_two_tp2_replicas_beside_a_real_fsdp_actor(bucket_megabytes):
    """verl's layout of a 4-GPU world: four actor ranks over NCCL, two TP-2 engines (GPUs 0-1
    and 2-3), each fed the actor's weights by its replica's leader, its second worker copying
    them over from the leader's GPU. With a bucket of 256 MB the embedding and lm_head (545 MB
    each in fp32) do not fit and are shared from their own memory, as Qwen2-7B's are with
    verl's default bucket."""
    _needs_vllm()
    _needs_gpus(4)
    spec = tp2_world_spec(f"world-2x-tp2-{bucket_megabytes}", 4)
    spec.rollout.update_weights_bucket_megabytes = bucket_megabytes
    result = launch_trial(spec, timeout_s=600)
    assert result.status == "ok", (result.phase, result.error_message, result.log_tail[-6000:])
    m = result.metrics
    assert m["trial_ranks"] == 4 and m["trial_replicas"] == 2
    assert m["actor_real_collectives"] == 1 and m["actor_fsdp_world_size"] == 4
    assert m["rollout_generated_tokens"] == sum(spec.response_lengths)
    assert m["weight_sync_bytes"] > 0
    assert m["gpu_memory_after_gib"] < spec.gpu_clean_threshold_gib


@pytest.mark.engine
def test_two_tp1_replicas_of_a_larger_world_run_side_by_side():
    """One trial, two GPUs of a world of eight: each rank fakes its world (a rank's eighth
    of the actor) and leads its own TP-1 replica with its own requests."""
    _needs_vllm()
    _needs_gpus(2)
    spec = qwen_spec("replicas-tp1", trial_gpus=2, n_gpus=8, rollout_replicas=8)
    spec.prompt_lengths = spec.prompt_lengths * 2
    spec.response_lengths = spec.response_lengths[::-1] * 2
    spec.train_prompt_lengths = spec.train_prompt_lengths * 2
    spec.train_response_lengths = spec.train_response_lengths * 2
    result = launch_trial(spec, timeout_s=600)
    assert result.status == "ok", (result.error_message, result.log_tail[-3000:])
    m = result.metrics
    assert m["trial_replicas"] == 2 and m["actor_fsdp_fake_collectives"] == 1
    assert m["rollout_requests"] == 128
    assert m["rollout_generated_tokens"] == sum(spec.response_lengths)
    assert m["gpu_memory_after_gib"] < spec.gpu_clean_threshold_gib
