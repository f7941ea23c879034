"""``run_trial``: run a spec's phases in this process, co-located as verl runs a PPO step.

verl's hybrid engine keeps the FSDP actor and the rollout engine on the same GPUs; a
trial runs the phases in that order, whatever order ``spec.phases`` lists them in:

1. ``startup``: on CUDA, wait until the trial's GPUs are clean (``gpu_clean``). With
   ``train``: the actor's process group (``distributed``) and its ``ActorState`` (fp32
   master weights, AdamW state, the reference model, the offload policy applied) first,
   under the device cap. With both phases and ``train_probe``: each train sub-phase's
   largest micro-batch once (``train.probe_train``; a micro-batch too large for the
   device fails here, tagged with its sub-phase, before the engine's start-up and the
   rollout are paid for). With ``rollout``: then the engine, with the proposed
   ``gpu_memory_utilization``, beside the resident actor, so a value that does not fit
   beside it is refused as in verl (by vLLM on a GPU; by ``colocation`` on a capped
   device). ``engine_startup_s`` is a cost of the trial, not of a step.
2. ``weight_sync``: the actor's weights into the engine, bucket by bucket, as verl's
   checkpoint engine moves them before every rollout (``rollout.weight_sync``); an engine
   that sleeps between steps gets them as in verl, its KV cache released meanwhile. Twice:
   the second is timed, as verl's measured steps sync after its warm-up step's sync.
   ``rollout``: a warm-up, then the replica's requests (``rollout.phase``).
3. ``engine_sleep`` (with ``train`` and ``free_cache_engine``): the engine releases its
   memory (``sleep``); an engine that cannot sleep (vLLM on CPU) is shut down instead.
   Without ``free_cache_engine`` the engine stays resident through training and the
   train phase's cap shrinks by its share, ``cap * (1 - gpu_memory_utilization)``.
4. ``old_log_prob``, ``ref_log_prob``, ``update_actor`` (``train``), under the cap, the CUDA
   allocator with expandable segments as verl's training worker has it then
   (``train.expandable_segments``; ``train_expandable_segments`` records it).
5. ``engine_wake`` (with both phases, the engine asleep): the next step's hand-over, as
   verl 0.9.1's ``update_weights`` makes it around its sync: engine weights woken, the
   device synchronised and the allocator's cache emptied (no collection of Python's
   garbage: verl 0.9.1 makes none), KV cache woken. The actor's parameters do not move:
   under ``param_offload`` the sync streams them from the CPU, as verl's FSDP2 does.

A rank of a trial over several GPUs (``trials.ranks``) runs the same order with a
``RankGroup``: only a replica's leader starts an engine, and the ranks meet between the
steps above so every GPU holds what verl's holds at each point.

A trial with ``engine_side_only`` runs the order without step 4: the engine's side of a
config measured beside its resident actor, its step the engine's parts alone.

A trial given ``reused_rollout`` (an earlier trial measured the same engine beside the
same resident actor) starts no engine: it takes over that trial's rollout-side
measurements (``ADOPTED``) and trains with the memory that trial's sleeping engine kept
held on the device, so its step is composed as if its own engine had run.

The engine is shut down and the actor released at the end, whatever happened. Peak
memory is sampled per phase (``startup``, ``rollout``, ``train``, ``wake``:
``<phase>_peak_memory_gib``, and ``peak_memory_gib`` over all); ``actor_resident_gib``
is the device memory the actor holds while the engine starts; ``<event>_at_s`` record
when each step of the order happened.

``run_trial`` never raises: a failure becomes a ``TrialResult`` with ``status``
``oom`` or ``error`` (see ``failures``), the ``phase`` it happened in, its error type
and message, the tail of everything written to stderr (the engine's processes
included) and the metrics measured before it. Step metrics are composed as described in
``trials.step`` when every requested phase completed.
"""

from __future__ import annotations

import contextlib
import logging
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from typing import Any

from trials import failures
from trials.colocation import check_engine_fits, emulated_capacity_gib
from trials.device import compute_dtype, describe_device, dtype_bits, hostname, software
from trials.errors import InvalidTrialSpec
from trials.lengths import drawn
from trials.logcapture import StderrTail
from trials.memory import (
    PeakMemorySampler,
    gpu_readings,
    gpu_total_gib,
    process_tree_rss,
)
from trials.memory_cap import device_memory_cap
from trials.metrics import PEAK_MEMORY
from trials.phases import in_phase, listening, phase_of
from trials.ranks import RankGroup
from trials.rollout import RolloutBackend, get_backend
from trials.rollout.phase import check_rollout_spec, measure_rollout
from trials.step import ROLLOUT_COMPONENTS, complete_step
from trials.types import TrialResult, TrialSpec
from trials.verl.gcclock import CLOCK

log = logging.getLogger(__name__)


class EngineState(str, Enum):
    """Where a trial's rollout engine is while the actor trains (``free_engine``); a str, as
    a replica leader posts it to its ranks."""

    ASLEEP = "asleep"  # slept (free_cache_engine): its weights kept, its KV cache freed
    RESIDENT = "resident"  # kept its memory through training (free_cache_engine off)
    GONE = "gone"  # shut down (no sleep mode), or none here


KNOWN_PHASES = ("rollout", "train")
# What a trial reusing another's rollout takes over from it: the engine's metrics (a
# prefix match) and its parts of the step.
ADOPTED = (
    "rollout_",
    "kv_cache_tokens",
    "engine_sleep_s",
    "engine_wake_",
    "engine_asleep_gib",
    "wake_peak_memory_gib",
    "weight_sync_",
)
LOG_TAIL_CHARS = 12_000


def run_trial(
    spec: TrialSpec,
    on_progress: Callable[[TrialResult], None] | None = None,
    group: RankGroup | None = None,
) -> TrialResult:
    """Run ``spec`` here; ``on_progress(result)`` hears each phase entry (``result.phase``).

    ``group``: this process is one rank of a trial over several GPUs (``trials.ranks``).
    """
    start = time.perf_counter()
    result = TrialResult(trial_id=spec.trial_id, status="ok", hostname=hostname())

    def entered(phase: str) -> None:
        if phase == result.phase:  # e.g. the engine's start-up after the actor's
            return
        result.phase = phase
        if on_progress is not None:
            on_progress(result)

    with StderrTail() as tail, listening(entered):
        try:
            spec = drawn(spec)
            result.device = describe_device(spec.device)
            result.software = software(spec.device, spec.rollout.engine)
            _Trial(spec, result, start, group).run()
            result.phase = None
            complete_step(spec, result.metrics, result.phase_timings_s)
        except Exception as exc:
            trace = traceback.format_exc()
            log.error("trial %s failed:\n%s", spec.trial_id, trace)
            _record_failure(result, exc, tail.text(), trace)
    result.wall_s = time.perf_counter() - start
    return result


def _record_failure(result: TrialResult, exc: BaseException, log_text: str, trace: str) -> None:
    failure = failures.classify_failure(exc, log_text)
    result.status = failure.status  # type: ignore[assignment]
    result.phase = phase_of(exc)
    result.error_type = failure.error_type or type(exc).__name__
    cause = failures.logged_cause(exc, log_text)
    result.error_message = (f"{exc} (the engine's log: {cause})" if cause else str(exc))[:4000]
    if trace.strip().splitlines()[-1] not in log_text:  # logging did not reach stderr
        log_text = f"{log_text}\n{trace}"
    result.log_tail = log_text[-LOG_TAIL_CHARS:]


def _collected(phase: str, collector: dict[str, float]) -> dict[str, float]:
    """Python's collector in a stretch of the hand-over: its seconds, its collections and
    the full ones among them (each a walk of the whole heap; ``train_gc_walk_s`` is what one
    costs this process), as verl's traced ``update_weights`` records them."""
    return {
        f"{phase}_gc_s": collector["gc_s"],
        f"{phase}_gcs": collector["gcs"],
        f"{phase}_full_gcs": collector["full_gcs"],
    }


def check_spec(spec: TrialSpec) -> None:
    unknown = [p for p in spec.phases if p not in KNOWN_PHASES]
    if unknown or not spec.phases:
        raise InvalidTrialSpec(f"phases must be a non-empty list of {KNOWN_PHASES}, got {spec.phases}")
    if spec.device not in ("cuda", "cpu"):
        raise InvalidTrialSpec(f"device must be 'cuda' or 'cpu', got {spec.device!r}")
    if spec.engine_side_only and set(spec.phases) != set(KNOWN_PHASES):
        raise InvalidTrialSpec(
            f"engine_side_only measures the engine's side beside the actor: it needs phases "
            f"{list(KNOWN_PHASES)}, got {spec.phases}"
        )
    if spec.engine_side_only and spec.reused_rollout:
        raise InvalidTrialSpec(
            "engine_side_only with reused_rollout would measure nothing (no engine, no training): "
            "drop one of them"
        )
    if "rollout" in spec.phases:
        check_rollout_spec(spec)
    if "train" in spec.phases:
        from trials.train import check_train_spec

        check_train_spec(spec)


class _Trial:
    """One run of the order in the module docstring; owns the engine and the actor."""

    def __init__(
        self, spec: TrialSpec, result: TrialResult, start: float, group: RankGroup | None = None
    ) -> None:
        self.spec = spec
        self.group = group
        self.result = result
        self.metrics = result.metrics
        self.timings = result.phase_timings_s
        self.start = start
        self.dtype = ""
        self.backend: RolloutBackend | None = None
        self.actor: Any = None  # trials.actor_state.ActorState (imports torch)
        self.world: Any = None  # trials.distributed.ActorWorld, or None: a plain actor
        self.peaks: list[float] = []
        self.baseline: dict[int, int] | None = None  # on CPU: the tree's RSS before the actor
        self.rollout = "rollout" in spec.phases
        self.train = "train" in spec.phases
        # The actor's sub-phases run (not with engine_side_only: the actor is built, not trained).
        self.trains = self.train and not spec.engine_side_only
        self.reuse = spec.reused_rollout if self.rollout and group is None else None
        self.engine_here = self.rollout and not self.reuse and (group is None or group.leader)
        self.before_engine_gib = 0.0
        self.held: Any = None  # the reused engine's sleeping memory, held while training
        self.cut: Any = None  # trials.verl.cut.PreparedCut: verl's cut, readied meanwhile

    def mark(self, event: str) -> None:
        self.metrics[f"{event}_at_s"] = time.perf_counter() - self.start

    def meet(self, name: str) -> None:
        """Wait for the trial's other ranks here (a trial over several GPUs)."""
        if self.group is not None:
            self.group.meet(name)

    def run(self) -> None:
        with contextlib.ExitStack() as stack:
            try:
                check_spec(self.spec)
                if self.spec.engine_side_only:
                    self.metrics["engine_side_only"] = 1.0
                self.dtype = compute_dtype(self.spec.device, self.spec.dtype)
                self.prepare(stack)
                stack.callback(self.release)  # before the actor's world goes
                self.run_steps()
            except BaseException as exc:
                if self.group is not None:  # before tearing down: peers may wait on us
                    self.group.abort(exc)
                raise

    def run_steps(self) -> None:
        self.startup()
        self.cut_ready()
        if self.rollout:
            self.sync_weights()
            self.generate()
            self.meet("rollout_done")
        engine = EngineState.GONE  # none started (a train-only trial)
        if self.rollout and self.train:
            engine = self.free_engine()
        if self.trains:
            self.train_phase(engine_resident=engine is EngineState.RESIDENT)
        if self.train:
            self.meet("trained")
        if self.rollout and self.train:
            self.hand_over(engine)

    def cut_ready(self) -> None:
        """Wait for verl's cut to be readied before anything measured runs beside it."""
        if self.cut is not None:
            with in_phase("startup"):
                self.metrics["verl_cut_ready_wait_s"] = self.cut.ready()

    # 1. startup
    def prepare(self, stack: contextlib.ExitStack) -> None:
        """Clean GPUs, the train phase's code, the actor's world: before anything is measured."""
        spec = self.spec
        with in_phase("startup"):
            if spec.device == "cuda":
                self.check_gpus_clean()
            self.meet("gpus_clean")  # before any rank puts anything on its GPU
            if self.train:
                from trials.train import prepare_train, prepare_verl_cut

                # verl's cut, readied while the actor and engine start (for training)
                self.cut = prepare_verl_cut(spec) if self.trains else None
                if self.cut is not None:
                    stack.callback(self.cut.cancel)
                prepare_train(spec, self.dtype)  # code and thread pools, not the phase
                if spec.actor_fsdp:
                    from trials.distributed import actor_world

                    self.world = stack.enter_context(actor_world(spec.device, spec.n_gpus, self.group))
        if spec.device == "cpu":
            self.baseline = process_tree_rss()

    def startup(self) -> None:
        if self.train:
            with self.sampled("startup"):
                self.build_actor()
        if self.train and self.rollout and self.spec.train_probe:
            self.probe_train()
        self.meet("actor_ready")  # every GPU holds its actor before any engine starts
        if self.reuse:
            self.adopt_rollout()
        if self.engine_here:
            with self.sampled("startup"):
                self.start_engine()
        self.meet("engines_ready")

    def probe_train(self) -> None:
        """Fail fast: the train sub-phases' largest micro-batches before the engine starts."""
        from trials.train import probe_train

        with self.sampled("train_probe"), device_memory_cap(self.spec.device, self.train_cap_gib(False)):
            self.metrics["train_probe_s"] = probe_train(self.spec, self.dtype, self.actor)
        # What the actor holds when the engine starts, after the probe (compare with
        # actor_resident_gib: allocator blocks the probe left pinned show up here).
        self.metrics["train_probe_resident_gib"] = self.actor.resident_gib()
        self.metrics["train_probe_allocated_gib"] = self.actor.allocated_gib()
        self.mark("train_probe_end")

    def check_gpus_clean(self) -> None:
        from trials.gpu_clean import wait_for_clean_gpus

        t0 = time.perf_counter()
        readings = wait_for_clean_gpus(self.spec.gpu_clean_threshold_gib, self.spec.gpu_clean_wait_s)
        if readings:
            self.metrics["gpu_clean_wait_s"] = time.perf_counter() - t0
            self.metrics["gpu_memory_before_gib"] = max(r.used_gib for r in readings)

    def build_actor(self) -> None:
        from trials.actor_state import build_actor_state

        spec = self.spec
        with in_phase("startup"):
            t0 = time.perf_counter()
            with device_memory_cap(spec.device, spec.device_memory_cap_gib):
                self.actor = build_actor_state(spec, self.dtype, self.world)
            self.metrics["train_model_build_s"] = time.perf_counter() - t0
            self.metrics["actor_resident_gib"] = self.actor.resident_gib()
            self.metrics["actor_allocated_gib"] = self.actor.allocated_gib()
            self.metrics.update(self.actor.metrics())
        self.mark("actor_ready")

    def start_engine(self) -> None:
        spec = self.spec
        self.metrics["rollout_dtype_bits"] = dtype_bits(self.dtype)
        with in_phase("startup"):
            self.backend = get_backend(spec.rollout.engine)
            self.check_engine_fits()
            if spec.device == "cuda":
                self.before_engine_gib = self.device_used_gib()
            self.mark("engine_start")
            startup_s = self.backend.start(spec, self.dtype)
        self.metrics["engine_startup_s"] = self.timings["startup"] = startup_s
        self.metrics["engine_import_s"] = float(getattr(self.backend, "import_s", 0.0))
        self.mark("engine_ready")

    def check_engine_fits(self) -> None:
        spec = self.spec
        physical = gpu_total_gib() if spec.device == "cuda" else None
        capacity = emulated_capacity_gib(spec, physical)
        if capacity is None:
            return  # the engine measures the real device itself
        check_engine_fits(spec.device, capacity, self.device_used_gib(), spec.rollout.gpu_memory_utilization)

    def device_used_gib(self) -> float:
        """What the device holds before the engine starts: the actor (CPU), NVML (CUDA)."""
        if self.spec.device == "cpu":
            return float(self.metrics.get("actor_resident_gib", 0.0))
        readings = gpu_readings()
        if readings:
            return max(r.used_gib for r in readings)
        return float(self.metrics.get("actor_resident_gib", 0.0))

    # 2. weight_sync, rollout
    def sync_weights(self) -> None:
        """The actor's weights into the engine (``rollout.weight_sync``). Every rank with an
        actor takes part (its gathers are collectives), only a replica's leader sends. An
        engine that sleeps between steps receives them as in verl's ``update_weights``:
        weights woken, KV cache released (the step's ``engine_wake`` is the hand-over's).

        Twice, the second timed: verl's measured steps come after its warm-up step, so their
        syncs find the bucket's IPC, the engine's loading path and the gathers' collectives
        used once already; the first, cold sync is ``weight_sync_first_s``."""
        if self.reuse or not (self.engine_here or self.actor is not None):
            return
        import torch

        from trials.rollout.weight_sync import WeightSync, actor_weights, model_weights, sync_weights

        spec, backend, actor = self.spec, self.backend, self.actor
        device = actor.device if actor is not None else torch.device(spec.device)

        def sync() -> WeightSync:
            weights = (
                actor_weights(actor.model, device)
                if actor is not None
                else model_weights(spec.model_config, device)
            )
            return sync_weights(weights, backend, spec.rollout.update_weights_bucket_megabytes, device)

        collector: dict[str, float] = {}
        with self.sampled("weight_sync"), in_phase("weight_sync"), self.kv_cache_released():
            first = sync()
            with CLOCK.install().window(collector):
                synced = sync()
        self.timings["weight_sync"] = synced.seconds
        self.metrics.update(synced.metrics())
        self.metrics["weight_sync_first_s"] = first.seconds
        self.metrics.update(_collected("weight_sync", collector))
        self.mark("weights_synced")

    @contextmanager
    def kv_cache_released(self) -> Iterator[None]:
        """An engine that sleeps between steps: weights awake, KV cache released, as verl's
        ``update_weights`` finds it (none of it timed)."""
        backend = self.backend
        if backend is None or not (backend.can_sleep and self.spec.rollout.free_cache_engine):
            yield
            return
        backend.sleep()
        backend.wake_up(["weights"])
        yield
        backend.wake_up(["kv_cache"])

    def generate(self) -> None:
        backend = self.backend
        if backend is None:
            return
        with self.sampled("rollout"), in_phase("rollout"):
            self.metrics.update(measure_rollout(backend, self.spec))
        self.timings["rollout"] = self.metrics["rollout_makespan_s"]

    # 3. engine_sleep
    def free_engine(self) -> EngineState:
        """Release the engine's memory for training (free_cache_engine); where it is now. A
        rank without an engine hears its replica leader's answer."""
        state = self.release_engine() if self.engine_here else None
        if self.group is None:
            # None: a reused rollout, no engine here (its hand-over adopted).
            return state or EngineState.GONE
        if state is not None:
            self.group.post("engine", state.value)
        self.meet("engines_released")
        return EngineState(self.group.read("engine", leader_of=self.group.rank))

    def release_engine(self) -> EngineState:
        if self.backend is None:
            return EngineState.GONE
        if not self.spec.rollout.free_cache_engine:
            return EngineState.RESIDENT
        if self.backend.can_sleep:
            with in_phase("engine_sleep"):
                self.timings["engine_sleep"] = self.backend.sleep()
            self.metrics["engine_sleep_s"] = self.timings["engine_sleep"]
            if self.spec.device == "cuda":  # what the sleeping engine keeps, for reuse
                kept = self.device_used_gib() - self.before_engine_gib
                self.metrics["engine_asleep_gib"] = max(0.0, kept)
            self.mark("engine_released")
            return EngineState.ASLEEP
        self.shutdown_engine()  # no sleep mode (vLLM on CPU): its memory goes with it
        self.metrics["engine_asleep_gib"] = 0.0
        self.mark("engine_released")
        return EngineState.GONE

    def adopt_rollout(self) -> None:
        """Take over the rollout side another trial measured (``reused_rollout``)."""
        reuse = self.reuse or {}
        donor = reuse.get("metrics", {})
        self.metrics.update(
            {k: float(v) for k, v in donor.items() if k.startswith(ADOPTED) and not k.endswith("_at_s")}
        )
        self.metrics["rollout_reused_from_trial"] = float(reuse.get("trial", -1))
        for part in ROLLOUT_COMPONENTS:
            if part in reuse.get("timings", {}):
                self.timings[part] = float(reuse["timings"][part])
        for key in ("rollout_peak_memory_gib", "wake_peak_memory_gib"):
            if key in self.metrics:
                self.peaks.append(self.metrics[key])
        asleep = float(donor.get("engine_asleep_gib", 0.0))
        if asleep > 0 and self.spec.device == "cuda" and self.spec.rollout.free_cache_engine:
            import torch

            with in_phase("engine_sleep"):
                self.held = torch.empty(
                    int(asleep * (1 << 30)),
                    dtype=torch.uint8,
                    device=self.actor.device if self.actor else "cuda",
                )

    # 4. train
    def train_phase(self, engine_resident: bool) -> None:
        """The actor's sub-phases; ``engine_resident``: the engine holds its memory meanwhile."""
        from trials.actor_state import train_allocator
        from trials.train import run_train

        spec = self.spec
        expandable = spec.device == "cuda" and spec.train.expandable_segments
        self.metrics["engine_resident_in_train"] = float(engine_resident)
        self.metrics["train_expandable_segments"] = float(expandable)
        self.mark("train_start")
        cap = self.train_cap_gib(engine_resident)
        with (
            self.sampled("train"),
            device_memory_cap(spec.device, cap),
            train_allocator(spec.device, spec.train.expandable_segments),
        ):
            run_train(spec, self.dtype, self.metrics, self.timings, self.actor, self.cut)
        self.mark("train_end")

    def train_cap_gib(self, engine_resident: bool) -> float | None:
        cap = self.spec.device_memory_cap_gib
        if cap is None:
            return None
        if engine_resident:  # the engine keeps its share of the device
            cap *= max(0.0, 1.0 - self.spec.rollout.gpu_memory_utilization)
        if self.spec.device == "cpu":  # the CPU cap counts from here; the actor is in already
            cap = max(0.0, cap - float(self.metrics.get("actor_resident_gib", 0.0)))
        return cap

    # 5. engine_wake
    def hand_over(self, engine: EngineState) -> None:
        """The next step's hand-over, as verl 0.9.1's ``update_weights`` makes it around the
        sync: the engine's weights woken, the device synchronised and its cache emptied on
        every rank (a barrier), the KV cache woken. The actor's parameters stay where
        training left them: under ``param_offload`` on the CPU, from where the sync streams
        them tensor by tensor, as verl's FSDP2 engine does (``get_per_tensor_param`` stages
        the whole module on the GPU only under FSDP1, which the trial refuses with
        ``param_offload``).

        ``engine``: where ``free_engine`` left it. Every rank decides alike (the leader's
        answer), so they meet at the same points.
        """
        from trials.actor_state import hand_back

        backend, actor = self.backend, self.actor
        if engine is not EngineState.ASLEEP or actor is None:
            return
        parts: dict[str, float] = {}  # engine_wake's parts, each a metric
        collector: dict[str, float] = {}
        with self.sampled("wake"), in_phase("engine_wake"), CLOCK.install().window(collector):
            if backend is not None:
                parts["engine_wake_weights_s"] = backend.wake_up(["weights"])
            self.meet("weights_in")  # the peak: the engine's weights beside the actor on every GPU
            parts["engine_wake_release_s"] = actor.timed(lambda: hand_back(actor.device))
            self.meet("released")  # verl 0.9.1's barrier: every rank's cache emptied first
            if backend is not None:
                parts["engine_wake_kv_cache_s"] = backend.wake_up(["kv_cache"])
            self.meet("awake")
        self.metrics.update(parts)
        self.metrics.update(_collected("engine_wake", collector))
        self.timings["engine_wake"] = self.metrics["engine_wake_s"] = sum(parts.values())

    # the end
    def release(self) -> None:
        if self.backend is not None:
            self.shutdown_engine()
        self.held = None
        if self.actor is not None:
            from trials.actor_state import release

            device = self.actor.device
            self.actor = None
            release(device)

    def shutdown_engine(self) -> None:
        backend, self.backend = self.backend, None
        if backend is None:
            return
        t0 = time.perf_counter()
        try:
            backend.shutdown()
        except Exception:  # never mask the phase's own outcome
            log.exception("rollout engine shutdown failed")
        self.metrics["engine_shutdown_s"] = time.perf_counter() - t0
        self.mark("engine_shutdown")

    @contextmanager
    def sampled(self, name: str) -> Iterator[None]:
        """Sample the device's peak memory while the block runs, as ``<name>_peak_memory_gib``."""
        sampler = PeakMemorySampler(self.spec.device, baseline=self.baseline)
        try:
            with sampler:
                yield
        finally:
            key = f"{name}_peak_memory_gib"  # a phase sampled in parts keeps its highest
            self.metrics[key] = max(sampler.peak_gib, self.metrics.get(key, 0.0))
            self.peaks.append(sampler.peak_gib)
            self.metrics[PEAK_MEMORY] = max(self.peaks)
