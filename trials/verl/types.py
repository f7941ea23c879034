"""The contract between the control plane and the verl step runner: plain, JSON-serialisable.

A ``VerlRunSpec`` says everything the runner needs to run verl's own trainer on one
config: the trial's exported Hydra overrides (``autotuner.export``), the model's
``config.json``, and the workload's lengths, drawn by the control plane (seeded) so every
config verl measures sees the same requests. A ``VerlRunResult`` is what verl logged,
step by step, with the versions it ran with. Neither imports verl, torch or an engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from trials.types import BatchDraw, JsonData

VerlRunStatus = Literal["ok", "oom", "error", "timeout"]
# The name the runner's agent loop (``trials.verl.agent_loop``) is registered under in verl.
AGENT_NAME = "autotuner_workload"

# verl's per-step metrics the runner keeps (``verl/trainer/ppo/metric_utils.py``,
# ``verl/workers/engine_workers.py``): step throughput per GPU, the step and its phases,
# the weight sync before each rollout (``update_weights``), and the actor's peak memory.
STEP_METRICS: tuple[str, ...] = (
    "perf/throughput",
    "perf/total_num_tokens",
    "perf/time_per_step",
    "timing_s/step",
    "timing_s/gen",
    "timing_s/reward",
    "timing_s/old_log_prob",
    "timing_s/ref",
    "timing_s/adv",
    "timing_s/update_actor",
    "timing_s/update_weights",
    # The actor worker's peak memory, logged after its update: ``actor/perf/...`` by verl
    # v0.9's v1 trainer (its update metrics renamed under ``actor/``), ``perf/...`` by the
    # legacy one.
    "actor/perf/max_memory_allocated_gb",
    "actor/perf/max_memory_reserved_gb",
    "perf/max_memory_allocated_gb",
    "perf/max_memory_reserved_gb",
    "response_length/mean",
    "response_length/max",
    "prompt_length/mean",
)
# Kept in each step's record too (not summarized): the phases' timings verl logs beyond the
# above (its agent loop's among them) and its performance figures (``perf/mfu/...``).
KEPT_PREFIXES: tuple[str, ...] = ("timing_s/", "timing_per_token_ms/", "perf/", "actor/perf/")


@dataclass
class VerlRunSpec(JsonData):
    """One config to run in verl for ``steps`` steps (the first ``warmup_steps`` excluded).

    ``overrides`` are the trial's Hydra override lines as ``autotuner.export.to_overrides``
    writes them (``key=value``, ``+key=value`` for keys verl's YAML lacks); the keys the
    runner owns (model path, data files, reward, trainer, agent loop) must not be among
    them. ``prompt_lengths`` has one entry per prompt of every step (``train_batch_size *
    steps``, in step order); ``response_lengths[i]`` the ``n`` response lengths of prompt
    ``i``, each request's ``max_tokens`` (generated with ``ignore_eos``). The control plane
    sends ``batch`` instead of the lists, so it never holds a list per request.
    """

    run_id: str
    model_name: str
    model_config: dict[str, Any]
    overrides: list[str]
    prompt_lengths: list[int]
    response_lengths: list[list[int]]
    train_batch_size: int
    n: int
    # The job's distributions, caps and seed: with it, the runner draws the lengths of every
    # step itself (``trials.verl.lengths``) and the lists above stay empty.
    batch: BatchDraw | None = None
    # With ``batch``: every step runs the job's first batch, the one its trials were measured
    # on (the token ids of each step's prompts still differ), so verl's measured steps and a
    # trial time the same sequences and their spread is the run's own. Off: each step draws
    # the next batch from the job's seed, as a training run meets new data.
    repeat_batch: bool = False
    dtype: str = "bfloat16"
    device: Literal["cuda", "cpu"] = "cuda"
    steps: int = 4
    warmup_steps: int = 1
    # verl's advantage estimator; GRPO needs no critic, which the tuner's trials do not model.
    adv_estimator: str = "grpo"
    seed: int = 0
    # Record where the worker's training phases spend their time (``trials.verl.trace``).
    trace: bool = False
    # With ``trace``: a folder for a profile of a few micro-batches of one update pass of each
    # worker (``trials.profiling``).
    profile: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VerlRunSpec:
        batch = data.get("batch")
        return cls(**(data | {"batch": BatchDraw(**batch) if isinstance(batch, dict) else batch}))


@dataclass
class VerlRunResult(JsonData):
    """What verl logged, or how the run failed.

    ``steps`` holds one dict per step verl finished, in order (step 1 first, a warm-up): its
    ``STEP_METRICS`` and the metrics under ``KEPT_PREFIXES``; ``measured`` is the median of
    each of ``STEP_METRICS`` over the steps after the warm-up. ``versions`` names verl,
    vLLM or SGLang, torch and transformers as the run imported them. ``trace``: the
    workers' records of a traced run (``trials.verl.trace``), in the order the calls ended.
    ``step_logged_at_s``: when each step's metrics reached verl's file logger, in seconds
    since the runner started (``startup_s`` follows from the first). ``checkpoint_s``: the
    seconds spent writing the run's random checkpoint before the runner started (0 when it
    was cached), part of ``wall_s``.
    """

    run_id: str
    status: VerlRunStatus
    steps: list[dict[str, float]] = field(default_factory=list)
    measured: dict[str, float] = field(default_factory=dict)
    warmup_steps: int = 1
    versions: dict[str, str] = field(default_factory=dict)
    device: str = ""
    hostname: str = ""
    error_type: str | None = None
    error_message: str | None = None
    wall_s: float = 0.0
    log_tail: str = ""
    trace: list[dict[str, Any]] = field(default_factory=list)
    step_logged_at_s: list[float] = field(default_factory=list)
    checkpoint_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def startup_s(self) -> float | None:
        """Seconds from the runner's start to verl's first step beginning: the run's set-up
        (checks, dataset, Ray, workers, the engine), or None before a step was logged."""
        if not self.step_logged_at_s or not self.steps or "timing_s/step" not in self.steps[0]:
            return None
        return max(0.0, self.step_logged_at_s[0] - self.steps[0]["timing_s/step"])
