"""A trial over several GPUs: one process per GPU, in lock-step, as verl places its workers.

verl's hybrid engine puts one FSDP actor rank on every GPU and one rollout replica on
every ``TP`` consecutive GPUs, the replica's engine beside the actors of those GPUs. A
trial with ``spec.trial_gpus = G > 1`` does the same on ``G`` GPUs:

- ``run_ranks`` (the trial's own process, ``python -m trials run``) is the coordinator:
  it starts ``G`` rank processes (``python -m trials rank``), touches no GPU itself, and
  merges their results (``merge``).
- Rank ``r`` sees every GPU of the trial, its own first (``CUDA_VISIBLE_DEVICES`` rotated
  by ``r``): its actor rank is on ``cuda:0``, and a replica's leader (``r % TP == 0``)
  starts the engine whose ``TP`` workers take GPUs ``r .. r+TP-1``, its replica's.
  Each leader serves its replica's share of the requests (``rank_spec``); each rank
  trains on its rank's share of the sequences.
- The actor: a trial over the whole world (``G == spec.n_gpus``) shards it over a real
  process group of the ``G`` ranks (NCCL on CUDA, gloo on CPU; TCP rendezvous on
  127.0.0.1), so the collectives are measured. A smaller trial (one replica of a larger
  world) lets each rank fake its world (``trials.distributed``): its memory and compute
  are those of one of verl's ranks; the collectives are not timed.
- Lock-step: the ranks meet (``RankGroup.meet``) after the actor is built, after the
  engines started, after the rollout, after the engines went to sleep, after training and
  inside the hand-over, so every GPU holds what verl's holds at that point of the step,
  and each phase lasts as long as its slowest rank (the step time is the sum of the
  slowest rank's parts).
- A failing rank writes the ``abort`` note (its status, phase and error, classified
  where it failed); a rank waiting at a meeting point stops with ``PeerFailed``. The
  coordinator also aborts when a rank dies without a result, waits ``rank_grace_s`` for the
  others to stop, kills what is left (a rank stuck in a collective with a dead peer),
  and reports the first real failure as the trial's.

The meeting points are files in a directory the coordinator owns: all ranks are on one
host, and a file survives a dead peer without a store to host.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trials import failures
from trials.errors import InvalidTrialSpec, TrialError
from trials.lengths import drawn
from trials.metrics import THROUGHPUT
from trials.phases import phase_of
from trials.step import complete_step
from trials.types import TrialResult, TrialSpec

log = logging.getLogger(__name__)

ABORT = "abort.json"
# Rollout metrics that add up over the trial's replicas; every other metric and phase
# time is the largest over the ranks (peaks, seconds), except the rates recomputed here.
SUMMED = ("rollout_requests", "rollout_prompt_tokens", "rollout_generated_tokens", "rollout_preemptions")
SMALLEST = ("kv_cache_tokens",)  # per replica: the tightest one
# The train side of a step: every rank trains an equal share, so the slowest rank's time
# over the fastest's (``train_rank_imbalance``) flags a rank slowed by something else.
TRAIN_PHASES = ("old_log_prob", "ref_log_prob", "update_actor")


class PeerFailed(TrialError):
    """Raised in a rank waiting for its peers when another rank of the trial failed; the
    message is that rank's failure."""


@dataclass(frozen=True)
class RankGroup:
    """This process's place in a trial's ranks (see the module docstring)."""

    rank: int
    size: int
    tp: int
    directory: str
    # The actor's real process group: its rendezvous port on 127.0.0.1. None: each rank
    # fakes its world (the trial is one replica of a larger world).
    master_port: int | None = None
    poll_s: float = 0.02

    @property
    def leader(self) -> bool:
        """Whether this rank starts its replica's engine."""
        return self.rank % self.tp == 0

    def meet(self, name: str) -> None:
        """Wait until every rank reached ``name``; ``PeerFailed`` if one failed instead."""
        here = Path(self.directory) / "meet" / name
        here.mkdir(parents=True, exist_ok=True)
        (here / str(self.rank)).touch()
        while True:
            self.check()
            if sum(1 for _ in here.iterdir()) >= self.size:
                return
            time.sleep(self.poll_s)

    def post(self, name: str, value: str) -> None:
        """Leave ``value`` for the ranks of this rank's replica (read after a meeting)."""
        here = Path(self.directory) / "post"
        here.mkdir(parents=True, exist_ok=True)
        (here / f"{name}.{self.rank}").write_text(value)

    def read(self, name: str, leader_of: int) -> str:
        """What the leader of rank ``leader_of``'s replica posted as ``name``."""
        leader = leader_of // self.tp * self.tp
        return (Path(self.directory) / "post" / f"{name}.{leader}").read_text()

    def check(self) -> None:
        note = read_abort(self.directory)
        if note is not None and note.get("rank") != self.rank:
            raise PeerFailed(
                f"rank {note.get('rank')} failed: {note.get('error_type')}: {note.get('error_message', '')}"[
                    :2000
                ]
            )

    def abort(self, exc: BaseException, log_text: str = "") -> None:
        """Tell the other ranks (and the coordinator) this rank failed; the first note wins."""
        if isinstance(exc, PeerFailed):
            return
        failure = failures.classify_failure(exc, log_text)
        write_abort(
            self.directory,
            {
                "rank": self.rank,
                "status": failure.status,
                "phase": phase_of(exc),
                "error_type": failure.error_type or type(exc).__name__,
                "error_message": str(exc)[:4000],
            },
        )

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RankGroup:
        return cls(**json.loads(text))


def write_abort(directory: str, note: dict[str, object]) -> None:
    path = Path(directory) / ABORT
    tmp = path.with_name(f"{ABORT}.{os.getpid()}")
    tmp.write_text(json.dumps(note))
    with contextlib.suppress(FileExistsError):
        os.link(tmp, path)  # atomic, and never replaces an earlier note
    tmp.unlink(missing_ok=True)


def read_abort(directory: str) -> dict[str, object] | None:
    try:
        return json.loads((Path(directory) / ABORT).read_text())  # type: ignore[no-any-return]
    except (FileNotFoundError, json.JSONDecodeError):
        return None


# ---------------------------------------------------------------------- specs


def check_ranks_spec(spec: TrialSpec) -> None:
    g, tp = spec.trial_gpus, spec.rollout.tensor_model_parallel_size
    if g < 1 or tp < 1 or g % tp:
        raise InvalidTrialSpec(
            f"trial_gpus ({g}) must be a positive multiple of tensor_model_parallel_size ({tp})"
        )
    if g > spec.n_gpus:
        raise InvalidTrialSpec(f"trial_gpus ({g}) cannot exceed the world's n_gpus ({spec.n_gpus})")
    if "rollout" in spec.phases and len(spec.prompt_lengths) % (g // tp):
        raise InvalidTrialSpec(f"{len(spec.prompt_lengths)} requests do not split over {g // tp} replicas")
    if "train" in spec.phases and len(spec.train_prompt_lengths) % g:
        raise InvalidTrialSpec(
            f"{len(spec.train_prompt_lengths)} train sequences do not split over {g} ranks"
        )


def real_world(spec: TrialSpec) -> bool:
    """Whether the trial's ranks are the whole world (a real process group)."""
    return spec.trial_gpus == spec.n_gpus and spec.actor_fsdp and "train" in spec.phases


def rank_spec(spec: TrialSpec, rank: int) -> TrialSpec:
    """What rank ``rank`` runs: its replica's requests, its rank's sequences."""
    tp = spec.rollout.tensor_model_parallel_size
    replicas = spec.trial_gpus // tp
    per_replica = len(spec.prompt_lengths) // replicas
    per_rank = len(spec.train_prompt_lengths) // spec.trial_gpus
    k = rank // tp
    return dataclasses.replace(
        spec,
        trial_gpus=1,
        prompt_lengths=spec.prompt_lengths[k * per_replica : (k + 1) * per_replica],
        response_lengths=spec.response_lengths[k * per_replica : (k + 1) * per_replica],
        train_prompt_lengths=spec.train_prompt_lengths[rank * per_rank : (rank + 1) * per_rank],
        train_response_lengths=spec.train_response_lengths[rank * per_rank : (rank + 1) * per_rank],
    )


def rotated_gpus(visible: list[str], rank: int) -> str:
    """``CUDA_VISIBLE_DEVICES`` for ``rank``: the trial's GPUs, its own first."""
    return ",".join(visible[rank:] + visible[:rank])


# ---------------------------------------------------------------------- coordinator


def run_ranks(
    spec: TrialSpec,
    on_progress: Callable[[TrialResult], None] | None = None,
    python: str = sys.executable,
) -> TrialResult:
    """Run ``spec`` over ``spec.trial_gpus`` rank processes and merge them; never raises."""
    start = time.perf_counter()
    try:
        spec = drawn(spec)
        check_ranks_spec(spec)
        visible = _trial_gpus(spec)
    except TrialError as exc:
        return TrialResult(
            spec.trial_id, "error", phase="startup", error_type=type(exc).__name__, error_message=str(exc)
        )
    workdir = Path(tempfile.mkdtemp(prefix="ranks-", dir=os.getcwd()))
    (workdir / "spec.json").write_text(spec.to_json())
    port = None
    if real_world(spec):
        from trials.distributed import free_port

        port = free_port()
    procs = []
    for r in range(spec.trial_gpus):
        group = RankGroup(r, spec.trial_gpus, spec.rollout.tensor_model_parallel_size, str(workdir), port)
        (workdir / f"group{r}.json").write_text(group.to_json())
        env = dict(os.environ)
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = rotated_gpus(visible, r)
        cmd = [
            python,
            "-m",
            "trials",
            "rank",
            "--spec",
            str(workdir / "spec.json"),
            "--group",
            str(workdir / f"group{r}.json"),
            "--out",
            str(workdir / f"result{r}.json"),
            "--progress",
            str(workdir / f"progress{r}.json"),
        ]
        procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, env=env))
    codes = _wait(procs, workdir, spec.rank_grace_s, on_progress)
    results = [_rank_result(spec, workdir, r, codes[r]) for r in range(spec.trial_gpus)]
    merged = merge(spec, results, read_abort(str(workdir)))
    merged.wall_s = time.perf_counter() - start
    shutil.rmtree(workdir, ignore_errors=True)
    return merged


def _trial_gpus(spec: TrialSpec) -> list[str] | None:
    if spec.device != "cuda":
        return None
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return [str(i) for i in range(spec.trial_gpus)]
    visible = [t.strip() for t in raw.split(",") if t.strip()]
    if len(visible) < spec.trial_gpus:
        raise InvalidTrialSpec(
            f"the trial needs {spec.trial_gpus} GPUs but CUDA_VISIBLE_DEVICES={raw!r} gives it {len(visible)}"
        )
    return visible[: spec.trial_gpus]


def _wait(
    procs: list[subprocess.Popen[bytes]],
    workdir: Path,
    grace_s: float,
    on_progress: Callable[[TrialResult], None] | None,
) -> list[int | None]:
    """Wait for every rank; after a failure, ``grace_s`` for the rest, then kill them."""
    failed_at: float | None = None
    seen_progress = ""
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return codes
        if failed_at is None:
            for r, code in enumerate(codes):
                if code is not None and read_abort(str(workdir)) is None:
                    _abort_if_failed(workdir, r, code)
            if read_abort(str(workdir)) is not None:
                failed_at = time.monotonic()
        elif time.monotonic() - failed_at > grace_s:
            for p in procs:
                if p.poll() is None:
                    _kill_tree(p.pid)
            return [p.wait() for p in procs]
        seen_progress = _forward_progress(workdir, seen_progress, on_progress)
        time.sleep(0.1)


def _abort_if_failed(workdir: Path, rank: int, code: int) -> None:
    """Abort for a rank that ended without a result, or with a failure it could not tell
    its peers about (one before its trial began)."""
    path = workdir / f"result{rank}.json"
    result = None
    if code == 0 and path.exists():
        with contextlib.suppress(ValueError, TypeError):
            result = TrialResult.from_json(path.read_text())
    if result is None:
        write_abort(
            str(workdir),
            {
                "rank": rank,
                "status": "error",
                "phase": _progress_phase(workdir, rank),
                "error_type": "TrialProcessDied",
                "error_message": f"rank {rank}'s process {failures.exit_text(code)} without a result",
            },
        )
    elif result.status != "ok":
        write_abort(
            str(workdir),
            {
                "rank": rank,
                "status": result.status,
                "phase": result.phase,
                "error_type": result.error_type,
                "error_message": result.error_message,
            },
        )


def _forward_progress(workdir: Path, seen: str, on_progress: Callable[[TrialResult], None] | None) -> str:
    """Rank 0's progress (a leader: it passes through every phase) is the trial's."""
    try:
        text = (workdir / "progress0.json").read_text()
    except FileNotFoundError:
        return seen
    if text != seen and on_progress is not None:
        with contextlib.suppress(ValueError, TypeError):
            on_progress(TrialResult.from_json(text))
    return text


def _progress_phase(workdir: Path, rank: int) -> str | None:
    try:
        return TrialResult.from_json((workdir / f"progress{rank}.json").read_text()).phase
    except (FileNotFoundError, ValueError, TypeError):
        return None


def _kill_tree(pid: int) -> None:
    import psutil

    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for proc in [*root.children(recursive=True), root]:
            with contextlib.suppress(psutil.Error):
                proc.kill()


def _rank_result(spec: TrialSpec, workdir: Path, rank: int, code: int | None) -> TrialResult:
    path = workdir / f"result{rank}.json"
    if path.exists():
        with contextlib.suppress(ValueError, TypeError):
            return TrialResult.from_json(path.read_text())
    return TrialResult(
        spec.trial_id,
        "error",
        phase=_progress_phase(workdir, rank),
        error_type="TrialProcessDied",
        error_message=f"rank {rank}'s process {failures.exit_text(code)} without a result",
    )


# ---------------------------------------------------------------------- merge


def merge(spec: TrialSpec, results: list[TrialResult], abort: dict[str, object] | None = None) -> TrialResult:
    """One trial's result from its ranks' (see the module docstring)."""
    first = results[0]
    merged = TrialResult(spec.trial_id, "ok", device=first.device, hostname=first.hostname)
    metrics, timings = merged.metrics, merged.phase_timings_s
    for one in results:
        for key, value in one.phase_timings_s.items():
            timings[key] = max(value, timings.get(key, value))
        for key, value in one.metrics.items():
            if key in SUMMED:
                metrics[key] = metrics.get(key, 0.0) + value
            elif key in SMALLEST:
                metrics[key] = min(value, metrics.get(key, value))
            else:
                metrics[key] = max(value, metrics.get(key, value))
    makespan = metrics.get("rollout_makespan_s")
    if makespan:
        generated = metrics.get("rollout_generated_tokens", 0.0)
        metrics["rollout_generated_tokens_per_s"] = generated / makespan
        metrics["rollout_total_tokens_per_s"] = (
            generated + metrics.get("rollout_prompt_tokens", 0.0)
        ) / makespan
    train_s = [
        sum(res.phase_timings_s.get(p, 0.0) for p in TRAIN_PHASES) for res in results if res.status == "ok"
    ]
    if len(train_s) > 1 and min(train_s) > 0:  # the ranks do equal work: ~1 unless one lags
        metrics["train_rank_imbalance"] = max(train_s) / min(train_s)
    metrics["trial_ranks"] = float(spec.trial_gpus)
    metrics["trial_replicas"] = float(spec.trial_gpus // spec.rollout.tensor_model_parallel_size)
    metrics["actor_real_collectives"] = float(real_world(spec))
    for key in ("step_time_s", "step_tokens", THROUGHPUT):
        metrics.pop(key, None)  # a rank's own: one rank's share, not the trial's
    failed = {r: res for r, res in enumerate(results) if res.status != "ok"}
    if not failed and abort is None:
        complete_step(spec, metrics, timings)
        return merged
    rank, res = _culprit(failed, abort)
    if res is not None and res.error_type not in ("PeerFailed", "TrialProcessDied"):
        merged.status, merged.phase, merged.error_type = res.status, res.phase, res.error_type
        merged.error_message = f"rank {rank}: {res.error_message}"
    elif abort is not None:  # the note the rank wrote where it failed, or ours for a death
        merged.status = str(abort.get("status") or "error")  # type: ignore[assignment]
        merged.phase = abort.get("phase")  # type: ignore[assignment]
        merged.error_type = str(abort.get("error_type") or "TrialError")
        merged.error_message = f"rank {rank}: {abort.get('error_message', '')}"
    elif res is not None:
        merged.status, merged.phase, merged.error_type = res.status, res.phase, res.error_type
        merged.error_message = f"rank {rank}: {res.error_message}"
    if res is not None:
        merged.log_tail = res.log_tail
    return merged


def _culprit(
    failed: dict[int, TrialResult], abort: dict[str, object] | None
) -> tuple[int | None, TrialResult | None]:
    """The rank whose failure is the trial's: the abort note's, else the first real one."""
    if abort is not None:
        rank = abort.get("rank")
        return (rank, failed.get(rank)) if isinstance(rank, int) else (None, None)
    real = [r for r, res in failed.items() if res.error_type != "PeerFailed"]
    rank = (real or sorted(failed))[0]
    return rank, failed[rank]
