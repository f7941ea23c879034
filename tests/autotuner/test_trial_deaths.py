"""Trials that die or hang inside a running job: each is recorded with its reason, the job
goes on, and nothing of the trial is left holding memory before the next one starts.

Real jobs (``jobs.execute``: SQLite, the local Ray, ``python -m trials`` processes); the
test acts on a trial's processes from outside, as the kernel or an operator would:
SIGKILL of the trial worker, SIGSTOP (a hang), SIGKILL of vLLM's EngineCore.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from trial_watch import Poller, kernel_name  # tests/trials, on sys.path through tests/autotuner/conftest

from autotuner.jobs import JobContext, execute, runner_id
from autotuner.knobs import A, R
from autotuner.records import TrialRecord
from autotuner.settings import Settings
from autotuner.spec import parse_job_spec
from autotuner.study import RunHooks
from trials.launcher import session_processes

# A trial's processes may hold this much more than the tuner held before it, at most, once
# the trial is recorded (Ray may start a worker meanwhile); a leftover trial process holds
# several times more (torch alone is ~300 MiB; vLLM's EngineCore ~1 GiB).
MEMORY_SLACK_BYTES = 256 << 20

# The engine-death job's trial deadline: room for an engine start-up of several minutes (a
# loaded 2-core CI machine), and for the rollout after it.
DEADLINE_S = 420

WORKLOAD = {
    "model": "tiny",
    "dtype": "float32",
    "prompt_length": {"kind": "fixed", "value": 16},
    "max_prompt_length": 16,
    "train_batch_size": 8,
    "n": 1,
    "ppo_mini_batch_size": 4,
    "use_kl_loss": False,
}


class TrialProcesses(Poller):
    """Finds each trial's ``python -m trials run`` leader by its work directory and records
    every process seen in its session (so one that left the session is still known). The
    leader leads its session: a process the trial forks shows the same command line until
    it execs or renames itself (vLLM's EngineCore), and may be seen first in one poll."""

    def __init__(self) -> None:
        super().__init__()
        self.leaders: dict[str, int] = {}
        self.seen: dict[str, set[int]] = {}

    def poll(self) -> None:
        for proc in psutil.process_iter(["pid", "cmdline"]):
            cmd = proc.info["cmdline"] or []
            if cmd[1:4] != ["-m", "trials", "run"] or "--spec" not in cmd:
                continue
            try:
                if os.getsid(proc.pid) != proc.pid:
                    continue
            except OSError:  # ended meanwhile
                continue
            folder = Path(cmd[cmd.index("--spec") + 1]).parent.name  # trial-<id>-xxxx
            self.leaders.setdefault(folder.removeprefix("trial-").rsplit("-", 1)[0], proc.pid)
        for trial_id, sid in list(self.leaders.items()):
            self.seen.setdefault(trial_id, set()).update(session_processes(sid))

    def leader(self, trial_id: str, timeout_s: float = 120) -> psutil.Process:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if trial_id in self.leaders:
                return psutil.Process(self.leaders[trial_id])
            time.sleep(0.05)
        raise AssertionError(f"trial {trial_id} never started")

    def alive(self, trial_id: str) -> list[int]:
        """Processes ever seen in the trial's session that still live (zombies excepted)."""
        out = []
        for pid in self.seen.get(trial_id, ()):
            with contextlib.suppress(psutil.Error):
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    out.append(pid)
        return out


def progress_file(leader: psutil.Process) -> Path:
    """The trial's progress file, from its command line (read once: see ``kernel_name``)."""
    cmd = leader.cmdline()
    return Path(cmd[cmd.index("--progress") + 1])


def phase_of(progress: Path) -> str | None:
    """The phase the trial reported last (its progress file)."""
    try:
        return json.loads(progress.read_text()).get("phase")
    except (OSError, ValueError):
        return None


def wait_phase(progress: Path, phases: tuple[str, ...], timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if phase_of(progress) in phases:
            return
        time.sleep(0.05)
    raise AssertionError(f"the trial never reached {phases}; last phase {phase_of(progress)}")


def tuner_rss_bytes() -> int:
    """Resident memory of this process's whole tree: Ray and its workers, trials and engines."""
    total = 0
    for proc in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += proc.memory_info().rss
    return total


def run_job(
    tmp_path: Path, spec_doc: dict[str, Any], procs: TrialProcesses, actions: dict[int, Callable[[str], None]]
) -> tuple[Any, dict[int, TrialRecord], dict]:
    """Run a job to its end; ``actions[n](trial_id)`` runs in a thread when the n-th trial
    to launch starts (proposals told as duplicates launch nothing and take no place).

    Returns the summary, the recorded launched trials by launch order, and what was seen as
    each was recorded (before the next one starts): its processes still alive, the tuner's
    memory."""
    settings = Settings(data_dir=tmp_path / "data", ray_num_cpus=2)
    ctx = JobContext.open(settings)
    job = ctx.submit(parse_job_spec(spec_doc))
    ctx.store.claim(job.id, runner_id())
    recorded: dict[int, TrialRecord] = {}
    checks: dict[int, dict[str, Any]] = {}
    ids: dict[int, str] = {}
    threads: list[threading.Thread] = []
    failed: dict[int, BaseException] = {}  # launch order -> what its action raised

    order: dict[int, int] = {}  # trial number -> launch order

    def on_start(number: int, trial_id: str) -> None:
        ids[number] = trial_id
        k = order.setdefault(number, len(order))
        if k in actions:

            def act(action: Callable[[str], None] = actions[k], k: int = k) -> None:
                try:
                    action(trial_id)
                except BaseException as exc:  # reported by the test, not lost in a thread
                    failed[k] = exc

            thread = threading.Thread(target=act, daemon=True)
            threads.append(thread)
            thread.start()

    def on_record(record: TrialRecord) -> None:
        k = order.get(record.number)
        if k is None:  # told without running (a duplicate)
            return
        checks[k] = {"alive": procs.alive(ids[record.number]), "rss": tuner_rss_bytes()}
        recorded[k] = record

    try:
        summary = execute(ctx, job.id, RunHooks(on_record=on_record, on_start=on_start))
    finally:
        ctx.database.dispose()
    for thread in threads:
        thread.join(5)
    for k, exc in failed.items():
        # An action that missed its moment leaves a trial that proves nothing: say why.
        raise AssertionError(f"the action on launched trial {k} failed: {exc}") from exc
    return summary, recorded, checks


def engine_core(leader: psutil.Process, timeout_s: float = 60) -> psutil.Process:
    """vLLM's EngineCore process in the trial's session (``VLLM::EngineCore``, or
    ``_DP<rank>`` after it, cut to ``VLLM::EngineCor`` by the kernel), looked for until
    ``timeout_s`` (on a loaded machine the engine's start-up takes minutes, and it shows its
    name a moment after it began). The session, not the leader's descendants: one found
    there is the trial's whichever process started it. Says what it saw when it fails."""
    deadline = time.monotonic() + timeout_s
    seen: set[str] = set()
    while time.monotonic() < deadline:
        members = session_processes(leader.pid)
        if not members:
            raise AssertionError(
                "the trial ended before its EngineCore process was seen; processes seen in "
                f"its session: {sorted(seen)}"
            )
        for pid in members:
            name = kernel_name(pid)
            if name is None:
                continue
            seen.add(name)
            if "EngineCor" in name:
                with contextlib.suppress(psutil.Error):
                    return psutil.Process(pid)
        time.sleep(0.05)
    raise AssertionError(
        f"no EngineCore process in the trial's session after {timeout_s:g} s; seen: {sorted(seen)}"
    )


def kill_in(
    procs_phase: tuple[str, ...], sig: signal.Signals, target: str = "worker", within_s: float = 180
) -> Callable[[TrialProcesses], Callable[[str], None]]:
    """Sends ``sig`` to the trial's worker (or vLLM's EngineCore) once the trial reports one
    of ``procs_phase``, looked for for ``within_s`` (the trial's deadline where its start-up
    may take most of it). The EngineCore is found while the engine starts, before the phase:
    a rollout of a tiny model may end within the time a search of the trial's processes
    takes on a loaded machine."""

    def bind(procs: TrialProcesses) -> Callable[[str], None]:
        def act(trial_id: str) -> None:
            leader = procs.leader(trial_id)
            progress = progress_file(leader)
            victim = engine_core(leader, timeout_s=within_s) if target == "engine" else leader
            wait_phase(progress, procs_phase, timeout_s=within_s)
            os.kill(victim.pid, sig)

        return act

    return bind


@pytest.fixture
def trial_processes():
    with TrialProcesses() as procs:
        yield procs


def _assert_clean(checks: dict[int, dict[str, Any]], number: int, after_ok: int) -> None:
    """Trial ``number`` left no process, and the tuner held no more memory once it was
    recorded than once the ordinary trial ``after_ok`` was."""
    assert checks[number]["alive"] == [], f"trial {number} left processes {checks[number]['alive']}"
    over = checks[number]["rss"] - checks[after_ok]["rss"]
    assert over < MEMORY_SLACK_BYTES, (
        f"after trial {number} the tuner holds {over / 2**20:.0f} MiB more than after trial {after_ok}"
    )


@pytest.mark.slow
def test_a_killed_and_a_hung_trial_are_recorded_and_the_job_goes_on(
    tmp_path, ray_local, trial_processes
) -> None:
    # Trial 0 runs as it should; trial 1's worker is SIGKILLed mid-train (the kernel's OOM
    # killer, an operator); trial 2 is SIGSTOPped (a hang: it never finishes on its own).
    spec = {
        "name": "deaths",
        "workload": {
            **WORKLOAD,
            "phases": "train",
            "response_length": {"kind": "fixed", "value": 16},
            "max_response_length": 16,
        },
        "cluster": {"device": "cpu", "device_memory_gib": 2},
        "search": {
            A + "use_dynamic_bsz": False,
            A + "ppo_micro_batch_size_per_gpu": [1, 2, 4],
            "actor_rollout_ref.model.enable_gradient_checkpointing": [True, False],
        },
        # One run of the baseline: the n-th launch is the n-th trial the actions aim at.
        # A deadline the first trial meets on a loaded 2-core machine too.
        "budget": {"max_trials": 3, "trial_timeout_s": 90, "baseline_runs": 1},
        "sampler": "random",
        "seed": 3,
    }
    procs = trial_processes
    actions = {
        1: kill_in(("old_log_prob", "ref_log_prob", "update_actor"), signal.SIGKILL)(procs),
        2: kill_in(("startup",), signal.SIGSTOP)(procs),
    }
    summary, by_number, checks = run_job(tmp_path, spec, procs, actions)

    assert [by_number[n].status for n in (0, 1, 2)] == ["ok", "error", "timeout"], [
        (r.number, r.status, r.error_type, r.error_message) for r in by_number.values()
    ]
    killed, hung = by_number[1], by_number[2]
    assert killed.error_type == "TrialProcessDied"
    assert "killed by SIGKILL" in (killed.error_message or "")
    assert killed.phase in ("old_log_prob", "ref_log_prob", "update_actor")
    # The hang cost its deadline and the kill's clean-up: the launcher killed it
    # (TrialTimeout), not the executor's outer deadline a grace later (RayTaskDeadline).
    assert hung.error_type == "TrialTimeout" and "within 90 s" in (hung.error_message or "")
    assert summary.stop_reason == "reached max_trials (3)"
    for number in (1, 2):
        _assert_clean(checks, number, after_ok=0)


@pytest.mark.engine
@pytest.mark.timeout(3 * DEADLINE_S)
def test_a_killed_engine_process_is_an_error_naming_it(tmp_path, ray_local, trial_processes) -> None:
    # vLLM's EngineCore is SIGKILLed as the rollout starts: without the engine watch the
    # trial would block until its deadline and pass for a timeout. Sixteen samples per prompt
    # make the rollout, in waves of 4-8 requests, long enough for the kill to land in it on a
    # loaded machine: with four, a rollout in waves of 8 took 1.7 s on a loaded 2-core
    # machine and ended before the kill, which then met the engine's shutdown.
    spec = {
        "name": "engine-death",
        "workload": {
            **WORKLOAD,
            "n": 16,
            "phases": "rollout",
            "response_length": {"kind": "fixed", "value": 256},
            "max_response_length": 256,
        },
        "cluster": {"device": "cpu", "device_memory_gib": 2},
        "search": {R + "enforce_eager": True, R + "max_num_seqs": [4, 8]},
        "budget": {"max_trials": 2, "trial_timeout_s": DEADLINE_S, "baseline_runs": 1},
        "sampler": "random",
        "seed": 0,
    }
    # The engine's start-up alone took over 180 s on a loaded 2-core CI machine: the kill
    # waits for the rollout as long as the trial may run.
    kill = kill_in(("rollout",), signal.SIGKILL, target="engine", within_s=DEADLINE_S)
    actions = {0: kill(trial_processes)}
    summary, by_number, checks = run_job(tmp_path, spec, trial_processes, actions)

    died, next_one = by_number[0], by_number[1]
    assert (died.status, died.error_type, died.phase) == ("error", "EngineDied", "rollout"), (
        died.error_message
    )
    assert "EngineCore" in died.error_message and "killed by SIGKILL" in died.error_message
    # Short of the deadline it would have waited for: the engine's start-up on a loaded
    # 2-core machine alone can take a few minutes, the rollout's waves more than one.
    assert died.wall_s < DEADLINE_S - 60, "the trial waited for its deadline"
    assert next_one.status == "ok", (next_one.error_type, next_one.error_message)
    _assert_clean(checks, 0, after_ok=1)
    assert summary.stop_reason == "reached max_trials (2)"
