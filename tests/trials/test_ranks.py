"""Trials over several ranks (``trials.ranks``): real rank processes on the CPU, the tiny
model, the actor sharded over a real gloo world or each rank's faked one."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from trial_helpers import make_spec, wait_for_phase
from trial_watch import TrialSessions

from trials.launcher import launch_trial, proc_stats
from trials.ranks import merge, rank_spec, rotated_gpus
from trials.types import TrialResult


def ranked_spec(tiny_config, trial_id: str, ranks: int = 2, n_gpus: int = 2, **kw):
    """``ranks`` ranks' shares of 16 sequences each and, with TP 1, as many replicas."""
    spec = make_spec(tiny_config, trial_id=trial_id, requests=16 * ranks, **kw)
    spec.trial_gpus, spec.n_gpus, spec.rollout_replicas = ranks, n_gpus, n_gpus
    spec.local_mini_batch_size = 8
    return spec


def test_each_rank_gets_its_replicas_requests_and_its_own_sequences(tiny_config):
    spec = ranked_spec(tiny_config, "slices", ranks=4, n_gpus=8)
    spec.rollout.tensor_model_parallel_size = 2  # two replicas of two GPUs
    parts = [rank_spec(spec, r) for r in range(4)]
    assert [p.prompt_lengths for p in parts] == [
        spec.prompt_lengths[:32],
        spec.prompt_lengths[:32],
        spec.prompt_lengths[32:],
        spec.prompt_lengths[32:],
    ]
    assert [p.train_prompt_lengths for p in parts] == [
        spec.train_prompt_lengths[16 * r : 16 * (r + 1)] for r in range(4)
    ]
    assert {p.trial_gpus for p in parts} == {1} and {p.n_gpus for p in parts} == {8}
    assert [rotated_gpus(["4", "5", "6", "7"], r) for r in (0, 2)] == ["4,5,6,7", "6,7,4,5"]


def test_merge_takes_the_slowest_rank_per_phase_and_adds_up_the_replicas(tiny_config):
    spec = ranked_spec(tiny_config, "merge", ranks=2, n_gpus=4)
    ranks = [
        TrialResult(
            "merge",
            "ok",
            metrics={
                "rollout_makespan_s": 2.0,
                "rollout_generated_tokens": 100.0,
                "rollout_prompt_tokens": 50.0,
                "rollout_requests": 16.0,
                "kv_cache_tokens": 900.0,
                "peak_memory_gib": 3.0,
            },
            phase_timings_s={"rollout": 2.0, "update_actor": 1.0},
        ),
        TrialResult(
            "merge",
            "ok",
            metrics={
                "rollout_makespan_s": 4.0,
                "rollout_generated_tokens": 140.0,
                "rollout_prompt_tokens": 60.0,
                "rollout_requests": 16.0,
                "kv_cache_tokens": 800.0,
                "peak_memory_gib": 5.0,
            },
            phase_timings_s={"rollout": 4.0, "update_actor": 3.0},
        ),
    ]
    m = merge(spec, ranks).metrics
    assert m["rollout_makespan_s"] == 4.0 and m["peak_memory_gib"] == 5.0
    assert m["rollout_generated_tokens"] == 240.0 and m["rollout_requests"] == 32.0
    assert m["rollout_generated_tokens_per_s"] == pytest.approx(240 / 4)
    assert m["kv_cache_tokens"] == 800.0  # the tightest replica
    assert m["train_rank_imbalance"] == pytest.approx(3.0)  # update: 3 s against 1 s
    assert m["step_time_s"] == pytest.approx(4.0 + 3.0)
    # The trial's 32 sequences are half the world's (2 of 4 ranks).
    batch = sum(spec.train_prompt_lengths) + sum(spec.train_response_lengths)
    assert m["step_tokens"] == pytest.approx(batch * 2)
    assert m["throughput_tokens_per_s_per_gpu"] == pytest.approx(batch * 2 / 7.0 / 4)


def test_merge_reports_the_rank_that_failed_not_the_ones_it_stopped(tiny_config):
    spec = ranked_spec(tiny_config, "culprit")
    stopped = TrialResult(
        "culprit", "error", phase="startup", error_type="PeerFailed", error_message="rank 1 failed"
    )
    oom = TrialResult(
        "culprit",
        "oom",
        phase="update_actor",
        error_type="OutOfMemoryError",
        error_message="CUDA out of memory",
        log_tail="tail of rank 1",
    )
    merged = merge(spec, [stopped, oom])
    assert (merged.status, merged.phase, merged.error_type) == ("oom", "update_actor", "OutOfMemoryError")
    assert merged.error_message.startswith("rank 1: ") and merged.log_tail == "tail of rank 1"
    assert "throughput_tokens_per_s_per_gpu" not in merged.metrics
    # A rank killed before it could say anything: its abort note (the coordinator's) stands.
    died = TrialResult("culprit", "error", error_type="TrialProcessDied", error_message="x")
    merged = merge(
        spec,
        [stopped, died],
        {
            "rank": 1,
            "status": "oom",
            "phase": "rollout",
            "error_type": "OutOfMemoryError",
            "error_message": "killed",
        },
    )
    assert (merged.status, merged.phase, merged.error_message) == ("oom", "rollout", "rank 1: killed")


def test_a_world_of_two_ranks_trains_over_a_real_process_group(tiny_config):
    spec = ranked_spec(tiny_config, "world2", phases=["train"])
    with TrialSessions() as sessions:
        result = launch_trial(spec, timeout_s=240)
    assert result.status == "ok", (result.error_message, result.log_tail[-3000:])
    m = result.metrics
    assert m["trial_ranks"] == 2 and m["actor_real_collectives"] == 1
    assert m["actor_fsdp_world_size"] == 2 and m["actor_fsdp_fake_collectives"] == 0
    # Each rank trained its own half; the step counts the whole batch over both GPUs.
    half = sum(spec.train_prompt_lengths[:16]) + sum(spec.train_response_lengths[:16])
    other = sum(spec.train_prompt_lengths[16:]) + sum(spec.train_response_lengths[16:])
    assert m["train_tokens"] == max(half, other)
    assert m["step_tokens"] == half + other
    assert m["throughput_tokens_per_s_per_gpu"] == pytest.approx((half + other) / m["step_time_s"] / 2)
    assert sessions.leftovers() == []


def test_a_config_one_rank_rejects_fails_the_trial_at_once_naming_that_rank(tiny_config):
    spec = ranked_spec(tiny_config, "reject", phases=["train"])
    spec.train.use_dynamic_bsz = True
    spec.train.ppo_max_token_len_per_gpu = 200
    spec.train.log_prob_max_token_len_per_gpu = 200
    spec.train_prompt_lengths = [16] * 16 + [250] + [16] * 15  # rank 1: a 266-token sequence
    spec.train_response_lengths = [16] * 32
    result = launch_trial(spec, timeout_s=240)
    # A rank 0 left waiting for its peer would have run into the deadline: "timeout".
    assert (result.status, result.error_type) == ("error", "ConfigRejected"), result.error_message
    assert result.error_message.startswith("rank 1: ")


def test_a_rank_killed_mid_trial_fails_it_and_takes_the_other_ranks_down(tiny_config):
    spec = ranked_spec(tiny_config, "killed", phases=["train"])
    spec.rank_grace_s = 5.0  # rank 0 may sit in a collective with its dead peer
    results: list[TrialResult] = []
    with TrialSessions() as sessions:
        worker, rank1 = _launch_until_rank_1(spec, results)
        wait_for_phase(rank1)  # into its trial
        os.kill(rank1, signal.SIGKILL)
        worker.join(120)
    (result,) = results
    # Ranks left waiting for the dead one would have run into the deadline: "timeout".
    assert (result.status, result.error_type) == ("error", "TrialProcessDied"), result.error_message
    assert "rank 1" in result.error_message and "SIGKILL" in result.error_message
    assert sessions.leftovers() == []


def _launch_until_rank_1(spec, results: list[TrialResult]) -> tuple[threading.Thread, int]:
    """Launch the trial from a thread (its result into ``results``) and wait for its rank 1."""
    worker = threading.Thread(target=lambda: results.append(launch_trial(spec, 240)))
    worker.start()
    rank1 = None
    deadline = time.monotonic() + 60
    while rank1 is None and time.monotonic() < deadline:
        rank1 = next((pid for pid, _ in proc_stats() if _is_rank(pid, 1)), None)
        time.sleep(0.05)
    assert rank1 is not None, "rank 1 never started"
    return worker, rank1


def _is_rank(pid: int, rank: int) -> bool:
    """Whether ``pid`` is rank ``rank`` of a trial this test process started."""
    import psutil

    try:
        proc = psutil.Process(pid)
        argv = proc.cmdline()
        ours = any(parent.pid == os.getpid() for parent in proc.parents())
    except psutil.Error:
        return False
    return ours and "rank" in argv and any(a.endswith(f"group{rank}.json") for a in argv)


@pytest.mark.engine
def test_two_replicas_generate_and_train_in_lock_step(tiny_config):
    # A trial of 2 ranks out of a world of 4: each rank fakes its world; TP 1, so each
    # rank leads a replica and runs its own engine beside its actor.
    spec = ranked_spec(tiny_config, "replicas", n_gpus=4)
    spec.rollout.max_num_seqs = 16
    with TrialSessions() as sessions:
        result = launch_trial(spec, timeout_s=420)
    assert result.status == "ok", (result.error_message, result.log_tail[-3000:])
    m, t = result.metrics, result.phase_timings_s
    assert m["trial_replicas"] == 2 and m["actor_real_collectives"] == 0
    assert m["actor_fsdp_world_size"] == 4 and m["actor_fsdp_fake_collectives"] == 1
    # Both replicas served their own requests, every one at its length.
    assert m["rollout_requests"] == len(spec.prompt_lengths)
    assert m["rollout_generated_tokens"] == sum(spec.response_lengths)
    # Engines started only once every actor was built; training after both released theirs.
    assert m["actor_ready_at_s"] < m["engine_start_at_s"]
    assert m["engine_released_at_s"] < m["train_start_at_s"]
    assert m["step_time_s"] == pytest.approx(sum(t[k] for k in t if k != "startup"))
    batch = sum(spec.train_prompt_lengths) + sum(spec.train_response_lengths)
    assert m["step_tokens"] == pytest.approx(batch * 2)  # the trial ran half the world
    assert sessions.leftovers() == []


def test_ranks_of_a_world_cut_as_many_dynamic_micro_batches_as_the_busiest(tiny_config):
    # Rank 1's long sequences need more micro-batches under the token budget than rank 0's
    # short ones; in a real world both must run as many (verl's same_micro_num_in_dp), or
    # rank 0 finishes its forwards while rank 1 waits for it in a collective.
    spec = ranked_spec(tiny_config, "dynamic", phases=["train"])
    spec.train.use_dynamic_bsz = True
    spec.train.ppo_max_token_len_per_gpu = spec.train.log_prob_max_token_len_per_gpu = 300
    spec.train_prompt_lengths = [16] * 16 + [120] * 16
    spec.train_response_lengths = [16] * 16 + [120] * 16
    result = launch_trial(spec, timeout_s=240)
    assert result.status == "ok", (result.error_message, result.log_tail[-3000:])
    assert result.metrics["actor_real_collectives"] == 1


def test_a_burst_of_sigterms_to_the_coordinator_takes_every_rank_down_cleanly(tiny_config):
    """The launcher's SIGTERM, then another before the first handler is done (the parent
    watch or a second kill): the group still goes down, with no traceback from the handler
    (seen on an H200: a handler importing psutil met the half-imported module)."""
    spec = ranked_spec(tiny_config, "sigterms", phases=["train"])
    results: list[TrialResult] = []
    with TrialSessions() as sessions:
        worker, rank1 = _launch_until_rank_1(spec, results)
        import psutil

        coordinator = psutil.Process(rank1).parent()
        wait_for_phase(rank1, past=("startup",))
        for _ in range(3):
            coordinator.send_signal(signal.SIGTERM)
            time.sleep(0.002)
        worker.join(120)
    (result,) = results
    assert result.status == "error", result.error_message
    assert "Traceback" not in result.log_tail, result.log_tail[-2000:]
    assert sessions.leftovers() == []
