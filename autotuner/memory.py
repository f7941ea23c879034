"""The memory model: predicts each phase's peak device memory from the model and the knobs.

Physics first, per data-parallel rank (the actor is FSDP-sharded over ``n_gpus`` ranks;
the trial measures one), in the phases a trial samples (``trials.runner``):

- ``startup``: the actor as verl holds it between steps, fp32 master weights (4 B/param)
  and AdamW's two moments (8 B/param), each unless offloaded; then the engine beside it,
  which takes ``gpu_memory_utilization * capacity`` (weights, activations, KV cache) and,
  with CUDA graphs, their pool outside that budget. vLLM refuses to start when that budget
  does not fit beside what the device holds already. SGLang takes that fraction of the
  memory free when it starts (``engine_budget_gib``), so it always fits beside the actor.
- ``train_probe`` (``TrialSpec.train_probe``): the train sub-phases' largest micro-batches
  run between the actor's build and the engine's start, with nothing else on the device.
- ``rollout``: the same residents (the KV cache is allocated at start-up).
- ``train``: the engine asleep (only its CUDA context and graph pool stay), and the
  largest of the three sub-phases over the micro-batches the rank runs (the largest
  micro-batch the job's length distributions lead to, from their statistics,
  ``autotuner.lengthstats``: the service holds no list per request): the old-log-prob forward (params +
  resident optimizer state + one micro-batch's forward activations, logits and their
  entropy's temporaries, none where it goes through torch.compile as on packed rows on a
  GPU), the reference forward, and the update (params + fp32 grads + AdamW state +
  the saved activations of every layer, or only their inputs under gradient
  checkpointing, + the logits and their gradients). A micro-batch computes what its
  layout computes (``trials.actor``): packed, its real tokens ``T``; padded, rows x its
  longest row; the logits of every such position (``positions x vocab``), once (verl
  0.9.1 divides them by the sampling temperature into a new tensor only where that is not
  the scalar 1.0, and the trials sample at 1.0, verl's default). SDPA (the
  CPU) adds a boolean mask over each row's positions squared; flash-attention (a GPU)
  none.
- the reference model (``use_ref``): on a GPU, in pinned CPU memory (verl v0.9's FSDP
  engine offloads a forward-only module whatever ``ref_param_offload`` says); during its
  forward the units in use come in as float32 shards and their compute-dtype copies. On
  the CPU its compute-dtype shard stays beside the actor.
- ``wake``: the next step's hand-over: the engine's weights wake beside the actor (whose
  parameters stay on the CPU under ``param_offload``: verl's FSDP2 streams them into the
  sync tensor by tensor), then its full budget is back beside it. Trained with
  expandable segments (CUDA, verl's setting) the actor's process emptied its cache as
  training ended; without them that cache still holds what training used while the
  weights wake.

On a CPU 'device' (the trial's RSS over its own baseline, under a real allocation cap)
the same terms apply without CUDA contexts or graphs; only the actor plus the engine's
KV cache at start-up and the train phase are held to the cap there, so only those are
checked.

Calibration: the physics is a prior. Each job fits, per phase, ``measured = scale *
physics + offset`` on its own measured trials (offset only, the median residual, until
three trials span a range of predictions), so after a trial or two the model speaks for
this device, engine version and allocator. The engine's own overhead differs between
CUDA graphs and eager mode, so the engine's phases are fitted per mode once that mode has
been measured. A phase a failure cut short is not a measurement and is not fitted.

Use: ``MemoryModel.predict`` gives the calibrated ``MemoryPrediction``; the study skips
a proposal whose checked phase exceeds the capacity by more than the job's margin
(``predicted_oom``), so a wrong model costs a trial, not the optimum. vLLM's refusal to
start (its budget larger than what is free beside the actor as calibrated) is the engine's
own arithmetic, not an estimate: it skips a proposal at any margin (``engine_refusal``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from autotuner.knobs import KNOBS, SpaceContext, memory_knobs
from autotuner.lengthstats import PromptOrder, StepLengths, VerlOrder
from autotuner.records import TrialRecord
from autotuner.spec import JobSpec, ModelArch
from autotuner.trialspec import batch_draw, build_trial_spec
from trials.types import ENTROPY_CHUNK_ROWS, TrialSpec

GIB = float(1 << 30)
PHASES = ("startup", "train_probe", "rollout", "train", "wake")
# A sampled phase's peak is a measurement only once the phase finished: the metric a trial
# writes when it has (``trials.runner``: its ``<event>_at_s`` marks). A phase cut short by a
# failure measured a lower bound, and a start-up whose engine never started measured the
# actor alone.
FINISHED_BY = {
    "startup": "engine_ready_at_s",
    "train_probe": "train_probe_end_at_s",
    "rollout": "rollout_makespan_s",
    "train": "train_end_at_s",
}
# The phases a trial that took over another's rollout did not measure itself.
ADOPTED_PHASES = ("startup", "rollout", "wake")
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# Phases whose memory depends on the engine's mode (CUDA graphs or eager): fitted per mode.
MODE_PHASES = ("startup", "rollout", "train", "wake")


@dataclass(frozen=True)
class Physics:
    """Constants of the prior (GiB unless named otherwise); calibration corrects them."""

    cuda_context_gib: float = 0.5  # per process that touches a GPU (trial, engine worker)
    cuda_graph_pool_gib: float = 1.0  # the engine's graphs, outside its budget, kept asleep
    engine_asleep_gib: float = 0.0  # what a sleeping engine keeps besides context and graphs
    allocator_slack: float = 0.05  # caching allocator: reserved over allocated, of the transient


class Shape(NamedTuple):
    """A micro-batch as the actor computes it: the positions it computes (padding
    included), its real tokens, and the elements of its attention mask (SDPA only)."""

    positions: float
    real: float
    mask: float


@dataclass
class Correction:
    """``measured = scale * physics + offset`` for one phase, fitted on ``n`` trials."""

    scale: float = 1.0
    offset_gib: float = 0.0
    n: int = 0

    def apply(self, gib: float) -> float:
        return max(0.0, self.scale * gib + self.offset_gib)


@dataclass
class MemoryPrediction:
    """Predicted ``<phase>_peak_memory_gib`` of a trial, and what must fit the device.

    ``checks`` are the amounts the trial holds to the capacity, per phase (on CUDA every
    phase's peak; on a CPU the actor plus the engine's KV cache at start-up, and the train
    phase). ``components`` name the physics' terms (GiB, uncalibrated) for the record.
    """

    phases: dict[str, float]
    checks: dict[str, float]
    capacity_gib: float | None
    components: dict[str, float] = field(default_factory=dict)
    # Why the engine itself would refuse to start (a sentence): its own arithmetic on what
    # the device holds, not an estimate, so no margin applies (``engine_refusal``).
    refusal: str | None = None

    @property
    def peak_gib(self) -> float:
        return max(self.phases.values(), default=0.0)

    def worst_check(self) -> tuple[str, float] | None:
        """The checked phase with the largest need, and that need (GiB)."""
        if not self.checks:
            return None
        phase = max(self.checks, key=lambda p: self.checks[p])
        return phase, self.checks[phase]

    def exceeds(self, margin: float) -> str | None:
        """Why the trial would not fit (a sentence): the engine's refusal to start, or a
        check exceeding the capacity by more than ``margin`` (a fraction); None when it may fit."""
        if self.refusal is not None:
            return self.refusal
        worst = self.worst_check()
        if worst is None or self.capacity_gib is None:
            return None
        phase, need = worst
        if need <= self.capacity_gib * (1.0 + margin):
            return None
        return (
            f"predicted {phase} peak {need:.2f} GiB exceeds the device's "
            f"{self.capacity_gib:.2f} GiB by {100 * (need / self.capacity_gib - 1):.0f}% "
            f"(skip margin {100 * margin:.0f}%)"
        )

    def to_attrs(self) -> dict[str, float]:
        out = {p: round(v, 4) for p, v in self.phases.items()}
        out["peak"] = round(self.peak_gib, 4)
        return out


def measured_phases(record: TrialRecord, engine: bool) -> dict[str, float]:
    """The phase peaks a trial really measured (``engine``: the job's trials start a rollout
    engine): phases a failure cut short excluded; ``actor``: the actor's resident memory
    when the engine started; ``peak``: the trial's peak, when it completed."""
    return measured_phases_of(record.status, record.metrics, engine)


def measured_phases_of(status: str, metrics: dict[str, float], engine: bool) -> dict[str, float]:
    """``measured_phases`` from a result's status and metrics. A trial that took over another's
    rollout (``reuse_rollouts``) started no engine: its start-up sampled the actor's build
    alone, and its rollout and wake peaks are the other trial's (``trials.runner.ADOPTED``),
    so only its own phases count."""
    out = {}
    adopted = engine and "rollout_reused_from_trial" in metrics
    for name in PHASES:
        value = metrics.get(f"{name}_peak_memory_gib")
        if value is None or (status != "ok" and not _finished(name, metrics, engine)):
            continue
        if adopted and name in ADOPTED_PHASES:
            continue
        out[name] = float(value)
    # What the actor holds as the engine starts: after the train probe where one ran (the
    # build leaves blocks the probe's first step gives back), else as built.
    actor = metrics.get("train_probe_resident_gib", metrics.get("actor_resident_gib"))
    if actor is not None:
        out["actor"] = float(actor)
    if status == "ok" and out and not adopted:
        out["peak"] = max(v for k, v in out.items() if k in PHASES)
    return out


def _mode_key(phase: str, config: dict) -> str:
    """The calibration key of an engine phase in this config's engine mode: the values of
    the knobs whose row says ``memory="mode"`` (CUDA graphs or eager)."""
    modes = memory_knobs("mode")
    values = (f"{path.rsplit('.', 1)[-1]}={config.get(path, KNOBS[path].baseline)!r}" for path in modes)
    return f"{phase}:{','.join(values)}"


def _finished(phase: str, metrics: dict[str, float], engine: bool) -> bool:
    if phase == "startup" and not engine:  # the actor's build is the whole start-up
        return "actor_ready_at_s" in metrics
    mark = FINISHED_BY.get(phase)
    return mark is not None and mark in metrics


def prediction_errors(predicted: dict[str, float], measured: dict[str, float]) -> dict[str, float]:
    """Measured minus predicted (GiB) for every phase both have (``peak`` included)."""
    return {p: round(measured[p] - predicted[p], 4) for p in predicted if p in measured}


def budget_beside_resident(engine: str) -> bool:
    """Whether the engine's static budget depends on what is resident beside it when it
    starts: SGLang's ``mem_fraction_static`` (verl passes ``gpu_memory_utilization``) is a
    fraction of what is free; vLLM's ``gpu_memory_utilization`` a fraction of the whole device."""
    return engine == "sglang"


def engine_budget_gib(engine: str, fraction: float, capacity_gib: float, held_gib: float) -> float:
    """The rollout engine's static budget (weights + KV cache) on a device of ``capacity_gib``
    holding ``held_gib`` when the engine starts (``budget_beside_resident``)."""
    if budget_beside_resident(engine):
        return fraction * max(0.0, capacity_gib - held_gib)
    return fraction * capacity_gib


def engine_refusal(
    engine: str, fraction: float, capacity_gib: float, held_gib: float, contexts_gib: float
) -> str | None:
    """Why the engine refuses to start beside ``held_gib`` (the actor's process) and the
    CUDA contexts (``contexts_gib``: the trial's and the engine's own), or None. vLLM takes a
    snapshot of the device's free memory as it starts and refuses when that is less than
    ``gpu_memory_utilization`` of the whole device (``vllm/v1/worker/utils.py``,
    ``request_memory``); SGLang takes a fraction of what is free and never refuses."""
    if engine == "sglang":
        return None
    asked = fraction * capacity_gib
    free = capacity_gib - held_gib - contexts_gib
    if asked <= free:
        return None
    return (
        f"vLLM refuses to start: gpu_memory_utilization {fraction:g} asks {asked:.2f} GiB of the "
        f"device's {capacity_gib:.2f} GiB, and {max(free, 0.0):.2f} GiB are free beside the actor "
        f"({held_gib:.2f} GiB) and the CUDA contexts ({contexts_gib:.2f} GiB); lower "
        "gpu_memory_utilization or offload the actor (param_offload, optimizer_offload)"
    )


def fit(pairs: list[tuple[float, float]]) -> Correction:
    """A correction from (physics, measured) pairs: the median offset, or a least-squares
    line once three points span at least 1.3x in physics (its slope kept in [0.5, 2])."""
    if not pairs:
        return Correction()
    xs = [x for x, _ in pairs]
    if len(pairs) >= 3 and min(xs) > 0 and max(xs) / min(xs) >= 1.3:
        mean_x, mean_y = statistics.fmean(xs), statistics.fmean(y for _, y in pairs)
        var = sum((x - mean_x) ** 2 for x in xs)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in pairs) / var
        slope = min(2.0, max(0.5, slope))
        offset = statistics.median(y - slope * x for x, y in pairs)
        return Correction(slope, offset, len(pairs))
    return Correction(1.0, statistics.median(y - x for x, y in pairs), len(pairs))


class MemoryModel:
    """Predicts a job's trials' memory (see the module docstring). Not thread-safe."""

    def __init__(
        self,
        spec: JobSpec,
        arch: ModelArch,
        device: Literal["cuda", "cpu"],
        capacity_gib: float | None,
        physics: Physics | None = None,
        train_order: str = "verl",
        logits_copied: bool = False,
    ) -> None:
        """``train_order``: the order the trials take their train sequences in
        (``trials.types.BatchDraw.train_order``); "prompts" for trials recorded before
        they took verl's. ``logits_copied``: the trials divided the logits by the sampling
        temperature into a new tensor at 1.0 too, as every trial recorded until 2026-11-27
        did (``_logit_bytes``)."""
        self.spec, self.arch, self.device = spec, arch, device
        self.logits_copied = logits_copied
        self.capacity_gib = capacity_gib
        self.k = physics or Physics()
        self.corrections: dict[str, Correction] = {}
        self._cache: dict[str, tuple[TrialSpec, MemoryPrediction]] = {}
        self._order: VerlOrder | PromptOrder | None = None
        self._batch = dataclasses.replace(batch_draw(spec), train_order=train_order)

    # ---------------------------------------------------------------- calibration

    def calibrate(self, records: Iterable[TrialRecord]) -> dict[str, Correction]:
        """Fit the corrections on the trials that ran (replacing earlier fits): one per phase,
        and one per phase and engine mode for the phases the engine (or its graphs) is in."""
        pairs: dict[str, list[tuple[float, float]]] = {}
        for rec in records:
            if not rec.config or not rec.ran:
                continue
            measured = measured_phases(rec, self.spec.workload.measures_rollout)
            if not measured:
                continue
            prior = self.physics_of(rec.config)
            for phase, value in measured.items():
                if phase == "peak":
                    continue
                x = prior.components["actor_gib"] if phase == "actor" else prior.phases.get(phase)
                if x is None:
                    continue
                pairs.setdefault(phase, []).append((x, value))
                if phase in MODE_PHASES:
                    pairs.setdefault(_mode_key(phase, rec.config), []).append((x, value))
        self.corrections = {key: fit(p) for key, p in pairs.items()}
        return self.corrections

    def errors(self, predicted: dict[str, float], status: str, metrics: dict[str, float]) -> dict[str, float]:
        """Measured minus predicted (GiB) for each phase a finished trial measured."""
        measured = measured_phases_of(status, metrics, self.spec.workload.measures_rollout)
        return prediction_errors(predicted, measured)

    # ---------------------------------------------------------------- predictions

    def trial_spec(self, config: dict) -> TrialSpec:
        """The trial ``config`` ran as: a knob its config does not name (a trial recorded
        before the knob was in the table) at what trials did then (``Knob.value_before_table``)."""
        ctx = SpaceContext(self.spec.workload, self.spec.cluster, self.arch, self.device)
        before = {
            path: k.value_before_table
            for path, k in KNOBS.items()
            if path not in config and k.relevant(ctx, config)
        }
        return build_trial_spec(
            self.spec, self.arch, before | config, "memory-model", self.device, self.capacity_gib, self._batch
        )

    @property
    def lengths(self) -> StepLengths:
        """The job's sequence-length statistics (computed once)."""
        return self.order.whole

    @property
    def order(self) -> VerlOrder | PromptOrder:
        """The statistics of a rank's sequences in the trials' order (computed once)."""
        if self._order is None:
            w = self.spec.workload
            self._order = VerlOrder.of(w) if self._batch.train_order == "verl" else PromptOrder.of(w)
        return self._order

    def physics_of(self, config: dict) -> MemoryPrediction:
        return self._trial_and_physics(config)[1]

    def _trial_and_physics(self, config: dict) -> tuple[TrialSpec, MemoryPrediction]:
        key = json.dumps(config, sort_keys=True, default=str)
        if key not in self._cache:
            trial = self.trial_spec(config)
            self._cache[key] = (trial, self.physics(trial))
        return self._cache[key]

    def predict(self, config: dict) -> MemoryPrediction:
        """The calibrated prediction for a config (flat, keyed by verl paths)."""
        trial, prior = self._trial_and_physics(config)
        phases = {p: self._corrected(p, v, config) for p, v in prior.phases.items()}
        checks = dict(phases) if self.device == "cuda" else {}
        if self.device != "cpu":
            refusal = self._refusal(trial, prior, config)
            return MemoryPrediction(phases, checks, self.capacity_gib, dict(prior.components), refusal)
        actor = self._corrected("actor", prior.components["actor_gib"], config)
        if "engine_budget_gib" in prior.components:
            checks["startup"] = actor + prior.components["engine_budget_gib"]
        else:
            checks["startup"] = actor
        if "train" in phases:
            checks["train"] = phases["train"]
        return MemoryPrediction(phases, checks, self.capacity_gib, dict(prior.components))

    def _refusal(self, trial: TrialSpec, prior: MemoryPrediction, config: dict) -> str | None:
        """The engine's refusal to start beside the actor as calibrated (its resident memory
        measured when engines started, the allocator's cached blocks included), on CUDA."""
        if "engine_budget_gib" not in prior.components or not self.capacity_gib:
            return None
        held = self._corrected("actor", prior.components["actor_gib"], config)
        return engine_refusal(
            trial.rollout.engine,
            trial.rollout.gpu_memory_utilization,
            self.capacity_gib,
            held,
            prior.components["cuda_context_gib"],
        )

    def _corrected(self, phase: str, gib: float, config: dict) -> float:
        correction = self.corrections.get(_mode_key(phase, config)) or self.corrections.get(phase)
        return correction.apply(gib) if correction is not None else gib

    # ---------------------------------------------------------------- physics

    def physics(self, trial: TrialSpec) -> MemoryPrediction:
        """The uncalibrated prediction for a trial spec (GiB per sampled phase)."""
        a, k, cuda = self.arch, self.k, self.device == "cuda"
        r, t = trial.rollout, trial.train
        world = max(trial.n_gpus, 1)
        shard = a.num_parameters / world
        params = 4 * shard / GIB
        grads = 4 * shard / GIB
        optimizer = 8 * shard / GIB
        rollout, train = "rollout" in trial.phases, "train" in trial.phases
        ref = self._compute_bytes(trial) * shard / GIB if train and t.use_ref else 0.0
        ref_resident = 0.0 if cuda else ref
        actor = (
            (0.0 if t.param_offload else params) + (0.0 if t.optimizer_offload else optimizer) + ref_resident
            if train
            else 0.0
        )
        context = k.cuda_context_gib if cuda else 0.0
        graphs = k.cuda_graph_pool_gib if cuda and rollout and not r.enforce_eager else 0.0
        capacity = self.capacity_gib or 0.0
        engine_context = context if rollout else 0.0
        budget = (
            engine_budget_gib(r.engine, r.gpu_memory_utilization, capacity, context + actor + engine_context)
            if rollout
            else 0.0
        )
        components = {
            "params_gib": params,
            "grads_gib": grads,
            "optimizer_gib": optimizer,
            "actor_gib": actor,
            "cuda_context_gib": context + engine_context,
            "cuda_graph_pool_gib": graphs,
        }
        phases: dict[str, float] = {}
        base = context + actor
        if rollout:
            components["engine_budget_gib"] = budget
            phases["startup"] = base + engine_context + budget + graphs
            phases["rollout"] = phases["startup"]
        else:
            phases["startup"] = base
        if train:
            asleep = engine_context + graphs + k.engine_asleep_gib if rollout else 0.0
            if rollout and not r.free_cache_engine:
                asleep += budget
            sub = self._train_sub_phases(trial, params, grads, optimizer)
            components.update({f"{name}_gib": v for name, v in sub.items()})
            phases["train"] = context + asleep + max(sub.values())
            if rollout and trial.train_probe:  # the same micro-batches before the engine starts
                phases["train_probe"] = context + max(sub.values())
            if rollout:
                # The hand-over: the engine's weights wake beside the actor as training left
                # it (under param_offload its parameters stay on the CPU), then the KV cache
                # wakes (the start-up's level). Trained with expandable segments on CUDA (verl's setting,
                # ``TrainKnobs.expandable_segments``), the actor's process emptied its cache
                # as training ended (``trials.actor_state.train_allocator``); otherwise that
                # cache still holds what training used while the weights wake.
                tp = max(r.tensor_model_parallel_size, 1)
                weights = self._compute_bytes(trial) * a.num_parameters / tp / GIB
                if cuda and t.expandable_segments:
                    phases["wake"] = max(phases["startup"], base + asleep + weights)
                else:
                    phases["wake"] = max(phases["startup"], phases["train"] + weights)
        return MemoryPrediction(phases, {}, self.capacity_gib, components)

    def _train_sub_phases(
        self, trial: TrialSpec, params: float, grads: float, optimizer: float
    ) -> dict[str, float]:
        """Each train sub-phase's peak, without the contexts and the sleeping engine."""
        t = trial.train
        count = self._rank_sequences(trial)
        mini = min(trial.local_mini_batch_size, count)
        minis = -(-count // max(mini, 1))
        worst = functools.partial(self._worst, dynamic=t.use_dynamic_bsz, packed=t.use_remove_padding)
        log_prob_budget = t.log_prob_max_token_len_per_gpu
        planned = {
            "old_log_prob": worst(count, 1, t.log_prob_micro_batch_size_per_gpu, log_prob_budget),
            "ref_log_prob": worst(count, 1, t.ref_log_prob_micro_batch_size_per_gpu, log_prob_budget),
            "update_actor": worst(mini, minis, t.ppo_micro_batch_size_per_gpu, t.ppo_max_token_len_per_gpu),
        }
        shapes = {name: shape for name, shape in planned.items() if shape is not None}
        if len(shapes) < len(planned):  # a plan verl rejects (trials.batching)
            return {"update_actor": params + grads + optimizer}
        cb = self._compute_bytes(trial)
        resident_opt = 0.0 if t.optimizer_offload else optimizer
        layer_copy = self._unit_bytes(cb) / GIB  # FSDP's compute-dtype copy of the units in use
        slack = 1.0 + self.k.allocator_slack
        ref = cb * self.arch.num_parameters / max(trial.n_gpus, 1) / GIB if t.use_ref else 0.0
        cuda = self.device == "cuda"
        ref_resident = 0.0 if cuda else ref
        old = shapes["old_log_prob"]
        fwd = self._forward_bytes(old, cb, self._entropy_bytes(trial, old.positions, cb))
        out = {"old_log_prob": params + resident_opt + ref_resident + layer_copy + slack * fwd / GIB}
        if t.use_ref:
            ref_fwd = self._forward_bytes(shapes["ref_log_prob"], cb)
            actor_params = 0.0 if t.param_offload else params
            streamed = self._unit_bytes(4) / GIB if cuda else 0.0  # the float32 units copied in
            out["ref_log_prob"] = (
                actor_params + resident_opt + ref_resident + streamed + layer_copy + slack * ref_fwd / GIB
            )
        upd = self._update_bytes(shapes["update_actor"], cb, t.enable_gradient_checkpointing)
        out["update_actor"] = params + grads + optimizer + ref_resident + layer_copy + slack * upd / GIB
        return out

    def _rank_sequences(self, trial: TrialSpec) -> int:
        """The sequences one rank trains on in a step (its share of ``train_batch_size * n``)."""
        w = self.spec.workload
        return max(1, w.train_batch_size * w.n // max(trial.n_gpus, 1))

    def _worst(
        self, count: int, sets: int, micro: int, budget: int, dynamic: bool, packed: bool
    ) -> Shape | None:
        """The largest micro-batch of ``sets`` sets of ``count`` sequences, each set cut into
        micro-batches as ``trials.batching`` cuts it (``micro`` sequences, or balanced by
        ``budget`` tokens), the sequences in the trials' order; None where verl rejects the plan.
        From the job's length statistics (``autotuner.lengthstats``), never a list per
        request."""
        if micro < 1 or count < 1:
            return None
        stats, order = self.lengths, self.order
        longest = stats.longest(count * sets)
        if dynamic:
            if longest > budget:  # verl rejects a sequence longer than the token budget
                return None
            heaviest = order.largest_run(count, sets)
            groups = min(count, max(1, math.ceil(heaviest / budget)))
            # Balanced (verl's largest differencing over its workload): every group within
            # about one short sequence of the mean, and within the budget (verl adds a group
            # until each fits).
            shortest = order.shortest_in_largest_run(count, sets)
            real = min(heaviest, heaviest / groups + shortest, budget)
            rows = math.ceil(count / groups)
        else:
            rows = min(micro, count)
            real = order.largest_run(rows, math.ceil(count / rows) * sets)
        sdpa = self.device != "cuda"  # flash-attention on a GPU takes no mask
        if packed:  # one row of the micro-batch's real tokens
            return Shape(real, real, real * real if sdpa else 0.0)
        if not dynamic:  # the micro-batch holding the longest sequence: rows x its length
            real = (rows - 1) * stats.mean + longest
        positions = rows * longest
        return Shape(positions, min(real, positions), rows * longest * longest if sdpa else 0.0)

    def _compute_bytes(self, trial: TrialSpec) -> int:
        requested = DTYPE_BYTES.get(trial.dtype, 2)
        # A CPU without native bfloat16 computes in float32 (trials.device.compute_dtype).
        return 4 if self.device == "cpu" else requested

    def _unit_bytes(self, cb: int) -> float:
        """The largest FSDP units held unsharded in the compute dtype at once: the root
        (embeddings, final norm, untied head) and the two layers in flight."""
        a = self.arch
        embed = a.vocab_size * a.hidden_size
        root = embed * (1 if a.config.get("tie_word_embeddings") else 2)
        layer = (a.num_parameters - root) / max(a.num_layers, 1)
        return cb * (root + 2 * layer)

    def _per_token_layer_bytes(self, cb: int) -> float:
        """Activations one decoder layer saves for backward, per token: projections, rotary
        q/k, attention output and the gated MLP in the compute dtype, RMSNorm's fp32 copies."""
        a = self.arch
        h, kv = a.hidden_size, 2 * a.num_key_value_heads * a.head_dim
        inter = int(a.config["intermediate_size"])
        return cb * (11 * h + 2 * kv + 4 * inter) + 4 * 4 * h

    def _logit_bytes(self, positions: float, real: float, cb: int, grad: bool) -> float:
        """The logits of every computed position in the compute dtype (at temperature 1.0
        verl keeps them undivided, ``trials.actor.scaled_logits``), the real rows' gather
        (padded; with ``grad`` the padded logits are kept to the backward and their gradient
        is built beside them), and the log-probability's working copies; with ``grad``, their
        gradients.

        On a GPU flash-attn's fused cross-entropy keeps a float32 number per row and writes
        its gradient into the logits it was given (``inplace_backward``, as verl calls it):
        nothing beside the logits. Trials that divided the logits by the temperature
        (``logits_copied``) held the quotient too and, with ``grad``, the gradient back
        through the division. On a CPU a float32 log-softmax (after a float32 copy of the
        logits unless they are float32) and, with ``grad``, its gradient."""
        v = float(self.arch.vocab_size)
        padded = positions != real
        logits = positions * v * cb + (real * v * cb if padded else 0.0)
        if self.device == "cuda":
            work = real * v * cb if self.logits_copied else 0.0
        else:
            work = real * v * (4 if cb == 4 else cb + 4)
        if grad and padded and not self.logits_copied:
            # verl's gather keeps the padded logits to the backward, which then builds their
            # gradient beside them (``trials.actor.real_positions``).
            logits += positions * v * cb
        return logits + work * (2 if grad else 1)

    def _entropy_bytes(self, trial: TrialSpec, positions: float, cb: int) -> float:
        """The old-log-prob forward's entropy temporaries beside the logits, as the trial's
        kernel holds them (``trials.actor.EntropyKernel``): none through torch.compile (packed
        rows on a GPU, unchunked, ``use_torch_compile``: the softmax fused into its
        reductions); chunked on packed rows, float32 copies of one chunk of rows (the chunk,
        its softmax, their product); else eager over every computed position, a softmax and
        its product with the logits in the compute dtype."""
        t = trial.train
        v = float(self.arch.vocab_size)
        if t.use_remove_padding and t.entropy_from_logits_with_chunking:
            return 3 * min(positions, ENTROPY_CHUNK_ROWS) * v * 4
        if t.use_remove_padding and t.use_torch_compile and self.device == "cuda":
            return 0.0
        return 2 * positions * v * cb

    def _forward_bytes(self, shape: Shape, cb: int, entropy: float = 0.0) -> float:
        """A forward without grad: one layer's transient, the attention mask, the logits and
        ``entropy``, the bytes of the entropy's temporaries (``_entropy_bytes``)."""
        positions, real, mask = shape
        a = self.arch
        inter = int(a.config["intermediate_size"])
        layer = positions * (cb * (3 * inter + 4 * a.hidden_size))
        return layer + mask + self._logit_bytes(positions, real, cb, grad=False) + entropy

    def _update_bytes(self, shape: Shape, cb: int, checkpointing: bool) -> float:
        """A forward + backward: saved activations (all layers', or their inputs plus one
        layer recomputed), the mask, and the logits with their gradients."""
        positions, real, mask = shape
        a = self.arch
        per_layer = self._per_token_layer_bytes(cb) * positions
        if checkpointing:
            saved = a.num_layers * cb * a.hidden_size * positions + 2 * per_layer
        else:
            saved = a.num_layers * per_layer
        return saved + mask + self._logit_bytes(positions, real, cb, grad=True)
