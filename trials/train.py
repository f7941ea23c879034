"""The train phase: verl's three actor sub-phases, measured on real fwd/bwd steps.

Order and batching follow verl: ``old_log_prob`` (forward only, with every row's entropy,
micro-batches of ``log_prob_micro_batch_size_per_gpu``), ``ref_log_prob`` (same on the
reference model at ``ref_log_prob_micro_batch_size_per_gpu``, only with ``use_ref``),
``update_actor`` (forward + backward per micro-batch of ``ppo_micro_batch_size_per_gpu``
through verl's loss, the KL to the reference included with ``use_kl_loss``
(``actor.policy_loss``; without an entropy term in verl's own layout and order,
``actor.verl_policy_loss``: the log-probs cut back to padded responses sequence by
sequence, the host reading as it goes), gradients accumulated, one AdamW step per local mini-batch after
verl's gradient clipping (``actor.optimizer_step``)). ``use_dynamic_bsz`` cuts
micro-batches by token budget instead (see ``batching``). Each micro-batch is laid out as
verl lays it out for ``use_remove_padding`` (``trials.actor``: packed rows or padded rows);
a micro-batch is verl's TensorDict, built on the host before its sub-phase is timed and moved
to the device whole at its start, its layout made there (``trials.worker_batch``,
``_Setup.staging``).

The actor, its AdamW state and the reference model are an ``ActorState``
(``trials.actor_state``), built before the rollout engine starts and passed in; without
one, ``run_train`` builds its own (in its own process group). Each sub-phase runs its
largest micro-batch once, untimed (a warm-up, and a configuration that does not fit fails
there), then every micro-batch of its plan, timed as one pass: a sub-phase's time is what
the rank's whole share took, the update's optimizer steps included (``optimizer_step_s``
is their mean). ``<sub-phase>_tokens_per_s`` is the batch's real tokens over that time.
Each micro-batch ends with the host reading its results, as verl's engine does (a
placeholder loss in the forward passes; the loss and its metrics before the backward in the
update, ``actor.read_to_host``): the update's means over its micro-batches are
``update_actor_<figure>`` (``loss``, ``pg_loss``, ``ppo_kl``, ``pg_clipfrac``, ...).
Each timed micro-batch is also timed alone, as verl's traced worker times its own
(``trials.verl.trace``): on a GPU from a mark on the device's stream at its start to the
next (the time the device waited for the host included, no sync added), on the CPU by the
host's clock (``_MicroBatchClock``). ``<sub-phase>_micro_batch_s_mean`` / ``_median`` /
``_max`` and ``<sub-phase>_micro_batch_tokens_median`` summarise them, beside the host
thread's CPU seconds in a micro-batch (``_micro_batch_thread_s_mean``), the process's over
the pass (``<sub-phase>_process_cpu_s``) and the host's busy cores over it
(``<sub-phase>_host_busy_cores``, for a pass of a second or more). With
``AUTOTUNER_PROFILE`` set, a few micro-batches of the update are profiled
(``trials.profiling``), and ``update_actor_profiled`` marks the trial's figures as taken
under the profiler.
The offload moves around the sub-phases (``param_offload`` / ``optimizer_offload``) are
timed apart, into ``actor_reload``; the reference model's moves (its own
``param_offload``) count in ``ref_log_prob``, as they happen inside verl's ref forward.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from trials import actor, profiling, worker_batch
from trials.actor_state import ADAMW_LR, STRATEGIES, ActorState, build_actor_state, release
from trials.batching import MicroBatch, log_prob_plan, update_plan
from trials.device import dtype_bits
from trials.distributed import actor_world
from trials.errors import InvalidTrialSpec, TrialError
from trials.phases import in_phase
from trials.types import TrialSpec
from trials.verl.cut import PHASES as CUT_PHASES
from trials.verl.cut import CutPlan, PreparedCut
from trials.verl.gcclock import CLOCK, heap, walk
from trials.workload import random_sequences

log = logging.getLogger(__name__)


@dataclass
class _Setup:
    spec: TrialSpec
    device: torch.device
    autocast: torch.dtype | None
    sequences: list[np.ndarray]
    response_lengths: list[int]
    lengths: list[int]

    phase: str = "old_log_prob"  # the pass whose batch a micro-batch is cut from
    staged: dict[tuple[int, ...], worker_batch.StagedMicroBatch] = field(default_factory=dict)

    def tensors(self, mb: MicroBatch) -> actor.MicroBatchTensors:
        """The micro-batch's tensors on the device: verl's micro-batch moved whole and its
        inputs derived on the device in the config's layout (``trials.worker_batch``), staged
        beforehand where its pass is timed."""
        staged = self.staged.get(tuple(mb.indices))
        if staged is None:  # outside a staged pass: the probe, a warm-up
            staged = worker_batch.stage(self.sequences, self.response_lengths, tuple(mb.indices), self.phase)
        return worker_batch.to_device(
            staged, self.device, actor.layout_of(self.spec.train.use_remove_padding)
        )

    @contextlib.contextmanager
    def staging(self, plan: list[MicroBatch], phase: str) -> Iterator[None]:
        """``plan``'s micro-batches built on the host as ``phase``'s pass holds them in verl,
        before the pass is timed (in verl its cut builds them, counted apart)."""
        self.phase = phase
        self.staged = worker_batch.staged_plan(self.sequences, self.response_lengths, plan, phase)
        try:
            yield
        finally:
            self.staged = {}

    def tokens(self, mb: MicroBatch) -> int:
        """The micro-batch's real tokens."""
        return sum(self.lengths[i] for i in mb.indices)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()


class _MicroBatchClock:
    """Each micro-batch's seconds in a pass, marked as verl's traced worker marks its own
    (``trials.verl.trace``): on a GPU a CUDA event on the stream at each micro-batch's start
    and where the pass stops for something else (an optimizer step, its end), read after the
    pass's closing sync, so that a micro-batch's seconds hold the time the device waited for
    the host and no sync is added; on the CPU, whose work is done when its call returns, the
    host's clock at the same points. Beside them, the CPU seconds this thread spent in each
    micro-batch (``time.thread_time``: the forward and the loss; PyTorch runs a GPU's
    backward on a thread of its own), the process's CPU seconds over the pass (every
    thread's) and how many of the host's cores were busy over it
    (``trials.profiling.busy_cores``)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.open: tuple[Any, int, float] | None = None  # (mark, tokens, thread time) running
        self.closed: list[tuple[Any, Any, int, float]] = []  # (start, end, tokens, thread s)
        # (wall clock, host_cpu, this process's CPU seconds) at the first start and the last end
        self.host: list[tuple[float, tuple[float, float], float]] = []

    def _mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _close(self, mark: Any) -> None:
        if self.open is not None:
            self.closed.append((self.open[0], mark, self.open[1], time.thread_time() - self.open[2]))
            self.open = None

    def _host(self) -> tuple[float, tuple[float, float], float]:
        return time.perf_counter(), profiling.host_cpu(), time.process_time()

    def start(self, tokens: int) -> None:
        """A micro-batch of ``tokens`` starts (and ends the one before, if open)."""
        if not self.host:
            self.host.append(self._host())
        mark = self._mark()
        self._close(mark)
        self.open = (mark, tokens, time.thread_time())

    def stop(self) -> None:
        """The open micro-batch ends here, and with it the pass or a stretch of it."""
        if self.open is not None:
            self._close(self._mark())
            self.host[1:] = [self._host()]

    def seconds(self) -> list[float]:
        """Each closed micro-batch's seconds (on a GPU: after the stream has passed its marks)."""
        if self.cuda:
            return [start.elapsed_time(end) / 1000 for start, end, _, _ in self.closed]
        return [end - start for start, end, _, _ in self.closed]

    def summary(self, phase: str) -> dict[str, float]:
        seconds = self.seconds()
        if not seconds:
            return {}
        tokens = [float(t) for _, _, t, _ in self.closed]
        out = {
            f"{phase}_micro_batch_s_mean": float(np.mean(seconds)),
            f"{phase}_micro_batch_s_median": float(np.median(seconds)),
            f"{phase}_micro_batch_s_max": float(max(seconds)),
            f"{phase}_micro_batch_thread_s_mean": float(np.mean([s for *_, s in self.closed])),
            f"{phase}_micro_batch_tokens_median": float(np.median(tokens)),
        }
        if len(self.host) == 2:
            (t0, first, cpu0), (t1, last, cpu1) = self.host
            out[f"{phase}_process_cpu_s"] = cpu1 - cpu0
            if t1 - t0 >= profiling.BUSY_MIN_S:
                out[f"{phase}_host_busy_cores"] = profiling.busy_cores(first, last, t1 - t0)
        return out


def check_train_spec(spec: TrialSpec) -> None:
    p, r = spec.train_prompt_lengths, spec.train_response_lengths
    if not p or len(p) != len(r):
        raise InvalidTrialSpec(
            f"train_prompt_lengths ({len(p)}) and train_response_lengths ({len(r)}) must be "
            "non-empty and of equal length for the train phase"
        )
    if min(p) < 1 or min(r) < 1:
        raise InvalidTrialSpec("every train prompt and response length must be >= 1")
    if spec.n_gpus < 1:
        raise InvalidTrialSpec(f"n_gpus must be >= 1, got {spec.n_gpus}")
    strategy = spec.train.strategy
    if strategy not in STRATEGIES:
        raise InvalidTrialSpec(f"actor strategy must be one of {STRATEGIES}, got {strategy!r}")
    if strategy == "fsdp" and spec.train.param_offload:
        raise InvalidTrialSpec(
            "actor_rollout_ref.actor.fsdp_config.param_offload=True with strategy fsdp (FSDP1) is "
            "not measured by the trial; use strategy fsdp2 or param_offload=False"
        )
    train_plans(spec)  # a knob verl would reject fails here, before any engine starts


def train_plans(
    spec: TrialSpec, min_groups: dict[str, list[int]] | None = None
) -> dict[str, list[MicroBatch]]:
    """Each sub-phase's micro-batches; a rejected knob is tagged with its sub-phase.

    ``min_groups``: per sub-phase, the fewest micro-batches (per mini-batch for the update)
    a dynamic plan may have (``synced_plans``)."""
    least = min_groups or {}
    t = spec.train
    pairs = zip(spec.train_prompt_lengths, spec.train_response_lengths, strict=True)
    lengths = [p + r for p, r in pairs]
    knob = "log_prob_max_token_len_per_gpu"
    builders = {
        "old_log_prob": lambda: log_prob_plan(
            lengths,
            t.log_prob_micro_batch_size_per_gpu,
            t.use_dynamic_bsz,
            t.log_prob_max_token_len_per_gpu,
            knob,
            least.get("old_log_prob", [0])[0],
        ),
        "ref_log_prob": lambda: log_prob_plan(
            lengths,
            t.ref_log_prob_micro_batch_size_per_gpu,
            t.use_dynamic_bsz,
            t.log_prob_max_token_len_per_gpu,
            knob,
            least.get("ref_log_prob", [0])[0],
        ),
        "update_actor": lambda: update_plan(
            lengths,
            spec.local_mini_batch_size,
            t.ppo_micro_batch_size_per_gpu,
            t.use_dynamic_bsz,
            t.ppo_max_token_len_per_gpu,
            min_groups=least.get("update_actor"),
        ),
    }
    plans = {}
    if not t.use_ref:
        del builders["ref_log_prob"]
    for name, build in builders.items():
        try:
            plans[name] = build()
        except TrialError as exc:
            exc.trial_phase = name  # type: ignore[attr-defined]
            raise
    return plans


def synced_plans(spec: TrialSpec, state: ActorState) -> dict[str, list[MicroBatch]]:
    """``train_plans``, each rank of a real world cutting as many micro-batches as the rank
    that needs most, as verl's dynamic batching does (every rank must run the same
    collectives: a rank with fewer forwards would leave its peers waiting)."""
    plans = train_plans(spec)
    world = state.world
    if not spec.train.use_dynamic_bsz or world is None or world.fake or world.world_size == 1:
        return plans
    counts = {
        "old_log_prob": [len(plans["old_log_prob"])],
        "update_actor": _per_mini_batch(plans["update_actor"]),
    }
    if "ref_log_prob" in plans:
        counts["ref_log_prob"] = [len(plans["ref_log_prob"])]
    flat = torch.tensor(
        [c for name in sorted(counts) for c in counts[name]], dtype=torch.int64, device=world.device
    )
    torch.distributed.all_reduce(flat, op=torch.distributed.ReduceOp.MAX)
    synced, values = {}, flat.tolist()
    for name in sorted(counts):
        synced[name], values = values[: len(counts[name])], values[len(counts[name]) :]
    return train_plans(spec, synced) if synced != counts else plans


def _per_mini_batch(plan: list[MicroBatch]) -> list[int]:
    counts, current = [], 0
    for mb in plan:
        current += 1
        if mb.ends_mini_batch:
            counts.append(current)
            current = 0
    return counts


def prepare_train(spec: TrialSpec, dtype: str) -> None:
    """Load what the train phase's code needs, outside the memory cap.

    - Building the model class imports transformers' modeling code and the optional
      libraries it pulls in (scikit-learn, SciPy with its own OpenBLAS), whose load-time
      buffers (+0.9 GiB of data segment on a 16-core host) are no device memory; under
      the CPU cap OpenBLAS would ``exit(1)`` on them without a traceback. A build on the
      meta device allocates nothing and loads all of it.
    - On CPU, the math libraries' per-thread workspaces (oneDNN/MKL/OpenMP, glibc
      arenas) appear at the first forward/backward and grow with the core count (over
      0.25 GiB on 16 cores). A one-layer proxy of the model runs one micro-batch and an
      AdamW step first, so the cap measures the phase, not the host's thread pools.
    """
    actor.build_causal_lm(spec.model_config, torch.float32, torch.device("meta"), False)
    if spec.device != "cpu":
        return
    proxy_config = {**spec.model_config, "num_hidden_layers": 1}
    proxy = actor.build_causal_lm(proxy_config, torch.float32, torch.device("cpu"), True)
    optimizer = torch.optim.AdamW(proxy.parameters(), lr=ADAMW_LR)
    sequences = random_sequences(spec.model_config, [48, 32], spec.seed)
    mb = actor.micro_batch(sequences, [16, 8], (0, 1), torch.device("cpu"))
    autocast = None if dtype == "float32" else actor.torch_dtype(dtype)
    log_probs = actor.response_log_probs(proxy, mb, autocast)
    actor.policy_loss(log_probs, mb, torch.ones_like(log_probs)).backward()
    optimizer.step()
    del proxy, optimizer, log_probs
    gc.collect()


def _make_setup(spec: TrialSpec, dtype: str, state: ActorState) -> _Setup:
    pairs = zip(spec.train_prompt_lengths, spec.train_response_lengths, strict=True)
    lengths = [p + r for p, r in pairs]
    return _Setup(
        spec=spec,
        device=state.device,
        autocast=None if dtype == "float32" else actor.torch_dtype(dtype),
        sequences=random_sequences(spec.model_config, lengths, spec.seed + 1),
        response_lengths=list(spec.train_response_lengths),
        lengths=lengths,
    )


def probe_train(spec: TrialSpec, dtype: str, state: ActorState) -> float:
    """Run each sub-phase's largest micro-batch once, untimed, with the sub-phase's
    offload moves, as ``run_train`` will; return the seconds it took.

    Meant for the moment between the actor's build and the engine's start-up
    (``TrialSpec.train_probe``): nothing but the actor is on the device, which is less
    than training will have beside it (the sleeping engine's remains), so a
    micro-batch that runs out of memory here also would after the rollout. Exceptions
    propagate, tagged with the sub-phase. The allocator's cache is emptied afterwards,
    so the engine sees the device as the actor alone leaves it.
    """
    check_train_spec(spec)
    setup = _make_setup(spec, dtype, state)
    plans = synced_plans(spec, state)
    setup.sync()
    t0 = time.perf_counter()
    with in_phase("old_log_prob"):
        state.model.eval()
        state.load_params()
        _forward(setup, state.model, _largest(setup, plans["old_log_prob"]), _entropy(setup))
        _reshard(state.model)
        state.offload_params()
    if state.ref is not None:
        with in_phase("ref_log_prob"):
            setup.phase = "ref_log_prob"
            _forward(setup, state.ref, _largest(setup, plans["ref_log_prob"]), None)
            _reshard(state.ref)
    with in_phase("update_actor"):
        state.model.train()
        state.load_params()
        state.load_optimizer()
        setup.phase = "update_actor"
        _forward_backward(setup, state.model)(_largest(setup, plans["update_actor"]))
        actor.optimizer_step(state.model, state.optimizer)
        state.offload_optimizer()
        state.offload_params()
    setup.sync()
    seconds = time.perf_counter() - t0
    release(state.device)
    return seconds


def _entropy(setup: _Setup) -> actor.EntropyKernel:
    """How the old-log-prob forward computes every row's entropy (verl's
    ``calculate_entropy=True`` there) and the update its entropy term: as verl's engine does
    with the actor's ``use_torch_compile`` and ``entropy_from_logits_with_chunking``
    (``actor.EntropyKernel``)."""
    t = setup.spec.train
    return actor.EntropyKernel.for_config(
        setup.device.type, t.use_torch_compile, t.entropy_from_logits_with_chunking, t.use_remove_padding
    )


def _reshard(model: torch.nn.Module) -> None:
    """Free FSDP2's unsharded parameters a forward without backward leaves behind (the
    root module's, which FSDP keeps after forward for the backward that never comes).
    FSDP1 reshards after a forward without gradients itself (and has no ``reshard``)."""
    reshard = getattr(model, "reshard", None)
    if callable(reshard):
        reshard()


def run_train(
    spec: TrialSpec,
    dtype: str,
    metrics: dict[str, float],
    timings: dict[str, float],
    state: ActorState | None = None,
    prepared_cut: PreparedCut | None = None,
) -> None:
    """Measure the sub-phases into ``metrics``/``timings`` as they finish (partial on failure).
    ``prepared_cut``: verl's cut of the batch, readied while the trial started
    (``prepare_verl_cut``); without it, the cut is readied and timed here.

    Exceptions propagate, tagged with the sub-phase they happened in.
    """
    check_train_spec(spec)
    if state is None:
        with contextlib.ExitStack() as stack:
            world = None
            if spec.actor_fsdp:
                world = stack.enter_context(actor_world(spec.device, spec.n_gpus))
            with in_phase("startup"):
                own = build_actor_state(spec, dtype, world)
            try:
                run_train(spec, dtype, metrics, timings, own, prepared_cut)
            finally:
                device = own.device
                del own
                release(device)
        return
    setup = _make_setup(spec, dtype, state)
    lengths = setup.lengths
    metrics["train_dtype_bits"] = dtype_bits(dtype)
    # Every micro-batch is verl's TensorDict, moved whole, its layout made on the device
    # (``trials.worker_batch``; before 2026-11-27 a padded micro-batch was not: 0).
    metrics["train_micro_batch_tensordict"] = 1.0
    # The entropy through torch.compile, as verl's engine computes it on packed rows
    # (``actor.EntropyKernel``; every trial's was eager until 2026-11-27: 0).
    metrics["train_entropy_compiled"] = float(_entropy(setup).compiled)
    metrics["train_tokens"] = float(sum(lengths))
    metrics.update(state.metrics())
    trials_plans = synced_plans(spec, state)
    cut, partitions = verl_cut(spec, prepared_cut)
    plans = verls_plans(state, trials_plans, partitions)
    metrics["train_plans_from_verl"] = float(plans is not trials_plans)
    metrics.update({f"{name}_micro_batches": float(len(plan)) for name, plan in plans.items()})
    metrics.update({f"{name}_verl_cut_s": seconds for name, seconds in cut.items() if name in CUT_PHASES})
    metrics.update({f"verl_cut_{name}": value for name, value in cut.items() if name not in CUT_PHASES})
    reload_s = 0.0
    with in_phase("old_log_prob"):
        state.model.eval()
        reload_s += state.load_params()
        _reset_allocated_peak(setup)
        clock = _MicroBatchClock(setup.device)
        with setup.staging(plans["old_log_prob"], "old_log_prob"), _collector("old_log_prob", metrics):
            seconds = _forward_phase(setup, state.model, plans["old_log_prob"], _entropy(setup), clock)
        _record_allocated_peak("old_log_prob", setup, metrics)
        metrics.update(clock.summary("old_log_prob"))
        reload_s += state.offload_params()
        _record("old_log_prob", seconds + cut.get("old_log_prob", 0.0), metrics, timings)
    if state.ref is not None:
        with in_phase("ref_log_prob"):
            _reset_allocated_peak(setup)
            clock = _MicroBatchClock(setup.device)
            with setup.staging(plans["ref_log_prob"], "ref_log_prob"), _collector("ref_log_prob", metrics):
                seconds = _forward_phase(setup, state.ref, plans["ref_log_prob"], None, clock)
            _record_allocated_peak("ref_log_prob", setup, metrics)
            metrics.update(clock.summary("ref_log_prob"))
            _record("ref_log_prob", seconds + cut.get("ref_log_prob", 0.0), metrics, timings)
    with in_phase("update_actor"):
        state.model.train()
        reload_s += state.load_params() + state.load_optimizer()
        _reset_allocated_peak(setup)
        clock = _MicroBatchClock(setup.device)
        with setup.staging(plans["update_actor"], "update_actor"), _collector("update_actor", metrics):
            seconds, step_s, losses = _update_phase(
                setup, state.model, state.optimizer, plans["update_actor"], clock
            )
        _record_allocated_peak("update_actor", setup, metrics)
        metrics.update(clock.summary("update_actor"))
        reload_s += state.offload_optimizer() + state.offload_params()
        metrics["optimizer_step_s"] = step_s
        metrics.update({f"update_actor_{name}": value for name, value in losses.items()})
        _record("update_actor", seconds + cut.get("update_actor", 0.0), metrics, timings)
    timings["actor_reload"] = timings.get("actor_reload", 0.0) + reload_s
    metrics["actor_reload_s"] = timings["actor_reload"]
    metrics["train_heap_objects"] = heap()["heap_objects"]  # after the timed phases
    if spec.device == "cuda":  # what one full collection costs this process, beside verl's worker's
        metrics["train_gc_walk_s"] = walk()


@contextlib.contextmanager
def _collector(phase: str, metrics: dict[str, float]) -> Iterator[None]:
    """Python's garbage collector in ``phase``: its seconds and full collections, as verl's
    traced worker records them in its passes (``trials.verl.gcclock``)."""
    stretch: dict[str, float] = {}
    with CLOCK.install().window(stretch):
        yield
    metrics[f"{phase}_gc_s"] = stretch["gc_s"]
    metrics[f"{phase}_full_gcs"] = stretch["full_gcs"]


def cut_plan(spec: TrialSpec) -> CutPlan | None:
    """What verl's cut of this rank's batch depends on, where the spec names verl's
    environment (``trials.verl.cut``); else None."""
    if not spec.verl_cut_env:
        return None
    t = spec.train
    b = spec.batch
    return CutPlan(
        prompt_lengths=list(spec.train_prompt_lengths),
        response_lengths=list(spec.train_response_lengths),
        max_prompt_length=b.max_prompt_length if b else max(spec.train_prompt_lengths),
        max_response_length=b.max_response_length if b else max(spec.train_response_lengths),
        use_dynamic_bsz=t.use_dynamic_bsz,
        log_prob_max_token_len=t.log_prob_max_token_len_per_gpu,
        ppo_max_token_len=t.ppo_max_token_len_per_gpu,
        log_prob_micro_batch_size=t.log_prob_micro_batch_size_per_gpu,
        ref_log_prob_micro_batch_size=t.ref_log_prob_micro_batch_size_per_gpu,
        ppo_micro_batch_size=t.ppo_micro_batch_size_per_gpu,
        mini_batch_size=spec.local_mini_batch_size,
        use_ref=t.use_ref,
    )


def prepare_verl_cut(spec: TrialSpec) -> PreparedCut | None:
    """verl's cut of this rank's batch, readied in verl's environment while the trial starts
    (``PreparedCut``), where the spec names that environment."""
    plan = cut_plan(spec)
    return PreparedCut(plan, spec.verl_cut_env) if plan is not None else None


def verls_plans(
    state: ActorState,
    plans: dict[str, list[MicroBatch]],
    partitions: dict[str, list[list[list[int]]]],
) -> dict[str, list[MicroBatch]]:
    """The micro-batches verl's own cut made of this rank's batch (``partitions``, from
    ``trials.verl.cut``), in its order, in place of the trial's, for the phases it cut: verl
    partitions by its own workload and adds micro-batches until each fits its token budget.
    A rank of a real world of several keeps the trial's plans, which every rank syncs
    (``synced_plans``); verl's cut, run on one rank's batch alone, cannot."""
    world = state.world
    if not partitions or not (world is None or world.fake or world.world_size == 1):
        return plans
    out = dict(plans)
    for name, groups in partitions.items():
        if name in plans:
            out[name] = [
                MicroBatch(tuple(mb), k == len(g) - 1 and name == "update_actor")
                for g in groups
                for k, mb in enumerate(g)
            ]
    return out


def verl_cut(
    spec: TrialSpec, prepared: PreparedCut | None = None
) -> tuple[dict[str, float], dict[str, list[list[list[int]]]]]:
    """Per phase (``trials.verl.cut.PHASES``), the seconds verl's own cut of this rank's batch
    into micro-batches takes on this host's CPU, beside what the cut recorded of Python's
    collector and heap (``trials.verl.cut.cut_seconds``; ``prepared``: readied by
    ``prepare_verl_cut``), where the spec names verl's environment; else, or when it cannot
    be timed, none; and verl's micro-batches of each phase (``PreparedCut.partitions``)."""
    cut = prepared or prepare_verl_cut(spec)
    if cut is None:
        return {}, {}
    try:
        return cut.result() or {}, cut.partitions
    finally:
        cut.cancel()  # its process is done with (a no-op once the result is in)


def _reset_allocated_peak(setup: _Setup) -> None:
    if setup.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(setup.device)


def _record_allocated_peak(name: str, setup: _Setup, metrics: dict[str, float]) -> None:
    """``<sub-phase>_max_allocated_gib``: the most this process's tensors held during the
    sub-phase (CUDA; the allocator's cache excluded, unlike the sampled device peak)."""
    if setup.device.type == "cuda":
        metrics[f"{name}_max_allocated_gib"] = torch.cuda.max_memory_allocated(setup.device) / (1 << 30)


def _record(name: str, seconds: float, metrics: dict[str, float], timings: dict[str, float]) -> None:
    timings[name] = seconds
    metrics[f"{name}_tokens_per_s"] = metrics["train_tokens"] / seconds
    log.info("%s: %.3f s for the batch (%.0f tokens/s)", name, seconds, metrics[f"{name}_tokens_per_s"])


def _timed(setup: _Setup, fn: Callable[[], object]) -> float:
    setup.sync()
    t0 = time.perf_counter()
    fn()
    setup.sync()
    return time.perf_counter() - t0


def _largest(setup: _Setup, plan: list[MicroBatch]) -> MicroBatch:
    """The micro-batch that computes the most positions in the config's layout (packed:
    real tokens; padded: rows x the longest row)."""

    def positions(mb: MicroBatch) -> int:
        if setup.spec.train.use_remove_padding:
            return sum(setup.lengths[i] for i in mb.indices)
        return len(mb.indices) * max(setup.lengths[i] for i in mb.indices)

    return max(plan, key=positions)


def _forward(
    setup: _Setup, model: torch.nn.Module, mb: MicroBatch, entropy: actor.EntropyKernel | None
) -> None:
    with torch.no_grad():
        actor.response_log_probs(model, setup.tensors(mb), setup.autocast, entropy)
        # verl's forward-only micro-batch ends reading its placeholder loss to the host.
        actor.read_to_host({"loss": torch.ones((), device=setup.device)})


def _forward_phase(
    setup: _Setup,
    model: torch.nn.Module,
    plan: list[MicroBatch],
    entropy: actor.EntropyKernel | None = None,
    clock: _MicroBatchClock | None = None,
) -> float:
    """Seconds of one forward pass over the whole plan (after the largest once, untimed).
    ``entropy``: the old-log-prob forward's entropy (see ``actor.response_log_probs``);
    ``clock``: times each micro-batch of the pass."""
    forward = functools.partial(_forward, setup, model, entropy=entropy)
    forward(_largest(setup, plan))
    clock = clock or _MicroBatchClock(setup.device)

    def every() -> None:
        for mb in plan:
            clock.start(setup.tokens(mb))
            forward(mb)
        clock.stop()

    return _timed(setup, every)


def _forward_backward(
    setup: _Setup, model: torch.nn.Module, read: list[dict[str, float]] | None = None
) -> Callable[[MicroBatch], None]:
    """One micro-batch's policy-loss forward and backward, gradients accumulated; the loss
    and its metrics read to the host before the backward, as verl reads them (into ``read``,
    one dict per micro-batch, when given)."""
    mini_batch_size = setup.spec.local_mini_batch_size
    generator = torch.Generator().manual_seed(setup.spec.seed + 2)

    t = setup.spec.train

    def forward_backward(mb: MicroBatch) -> None:
        tensors = setup.tensors(mb)
        if tensors.response_offsets is not None and not t.entropy_coeff:
            # verl's layout and order: the loss's fields per response token (R,)
            assert tensors.response_index is not None
            advantages = torch.randn(tensors.response_index.shape, generator=generator).to(setup.device)
            log_probs = actor.response_log_probs(model, tensors, setup.autocast)
            # The reference's log-probs of the step (use_kl_loss): near the actor's, as at the
            # start of training.
            ref_log_probs = None
            if t.use_ref:
                ref_log_probs = log_probs.detach().index_select(0, tensors.response_index) + 0.01 * advantages
            values: dict[str, float] = {}
            loss = actor.verl_policy_loss(log_probs, tensors, advantages, ref_log_probs, values)
            values.update(actor.read_to_host({"loss": loss}))
            if read is not None:
                read.append(values)
            (loss * (len(mb.indices) / mini_batch_size)).backward()
            return
        advantages = torch.randn(tensors.labels.shape, generator=generator).to(setup.device)
        entropy = None
        if t.entropy_coeff:
            log_probs, entropy = actor.log_probs_and_entropy(
                model, tensors, setup.autocast, _entropy(setup), t.entropy_checkpointing
            )
        else:
            log_probs = actor.response_log_probs(model, tensors, setup.autocast)
        # The reference's log-probs of the step (use_kl_loss): near the actor's, as at the
        # start of training.
        ref_log_probs = log_probs.detach() + 0.01 * advantages if t.use_ref else None
        computed: dict[str, torch.Tensor] = {}
        loss = actor.policy_loss(log_probs, tensors, advantages, ref_log_probs, computed)
        if entropy is not None:
            mask = tensors.response_mask
            entropy_loss = (entropy * mask).sum() / mask.sum().clamp(min=1.0)
            computed["entropy_loss"] = entropy_loss
            loss = loss - t.entropy_coeff * entropy_loss
        values = actor.read_to_host({**computed, "loss": loss})
        if read is not None:
            read.append(values)
        (loss * (len(mb.indices) / mini_batch_size)).backward()

    return forward_backward


def _update_phase(
    setup: _Setup,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    plan: list[MicroBatch],
    clock: _MicroBatchClock | None = None,
) -> tuple[float, float, dict[str, float]]:
    """(seconds of the whole plan with its optimizer steps, an optimizer step's mean seconds,
    the mean over the plan's micro-batches of each loss figure read to the host).
    ``clock``: times each micro-batch, the optimizer steps left out."""
    read: list[dict[str, float]] = []
    forward_backward = _forward_backward(setup, model, read)
    forward_backward(_largest(setup, plan))  # with AdamW's state resident: the peak
    actor.optimizer_step(model, optimizer)
    read.clear()
    means: dict[str, float] = {}
    step_seconds: list[float] = []
    clock = clock or _MicroBatchClock(setup.device)
    out = profiling.folder()
    profiler = profiling.MicroBatchProfiler(out, "trial-update_actor") if out else None

    def every() -> None:
        for index, mb in enumerate(plan):
            if profiler is not None:
                profiler.before(index)
            clock.start(setup.tokens(mb))
            forward_backward(mb)
            if mb.ends_mini_batch:
                clock.stop()
                step_seconds.append(_timed(setup, functools.partial(actor.optimizer_step, model, optimizer)))

    seconds = _timed(setup, every)
    if profiler is not None:
        profiler.finish()
        if profiler.profiled:
            means["profiled"] = 1.0
    means.update({name: sum(r[name] for r in read) / len(read) for name in read[0]} if read else {})
    return seconds, sum(step_seconds) / max(len(step_seconds), 1), means
