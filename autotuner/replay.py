"""Recorded landscapes, and an executor that replays them instead of running trials.

A *landscape* is every config of a (small) search space measured as a real trial,
possibly several times, with the job spec, the model and the command that produced it
(``benchmarks/search/record.py`` writes one). ``ReplayExecutor`` has ``RayExecutor``'s
interface (``submit``/``wait``/``cancel_all``) but runs nothing: each submitted trial is
answered at once with the result recorded for its config (the k-th request for a config
gets its k-th recorded run, cycling), so the real ``StudyRunner`` loop can be compared
offline across samplers and seeds on recorded measurements. Replayed results say so:
their ``hostname`` is ``replay:<recording host>``.

A trial's cost is its recorded ``wall_s`` (interpreter and engine start-up included;
less the engine's share, ``engine_seconds``, for a trial that reuses another's rollout)
times the GPUs it reserved (``LandscapePoint.gpus``: its ranks, else its
``tensor_model_parallel_size``; a CPU trial counts as one device): ``ReplayExecutor.cost_s``
adds it up, in the order trials were submitted.

Threading: one executor is driven by one thread (the study loop).
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from autotuner.errors import AutotunerError
from autotuner.executor import GpuCapacity, Resources
from autotuner.knobs import KNOBS, R, SpaceContext
from autotuner.spec import JobSpec, ModelArch
from autotuner.trialspec import build_trial_spec
from trials.metrics import THROUGHPUT
from trials.types import TrialResult, TrialSpec

FORMAT = "autotuner-landscape"
VERSION = 1


class LandscapeError(AutotunerError):
    """A landscape file cannot be read, or a replayed config is not in it."""


@dataclass
class LandscapePoint:
    """One config and every run recorded for it (at least one)."""

    config: dict[str, Any]
    runs: list[TrialResult]

    @property
    def gpus(self) -> int:
        """GPUs a run reserved: its ranks (recorded by a trial over several GPUs), else its
        TP size."""
        ranks = max((run.metrics.get("trial_ranks", 0.0) for run in self.runs), default=0.0)
        return int(ranks) or int(self.config.get(R + "tensor_model_parallel_size", 1))


@dataclass
class Landscape:
    """A job's search space measured point by point (see the module docstring)."""

    spec: JobSpec
    arch: ModelArch
    device: Literal["cuda", "cpu"]
    memory_cap_gib: float | None
    label: str
    command: str
    points: list[LandscapePoint] = field(default_factory=list)
    recorded_at: str = ""
    # How the configs were chosen when not the whole grid (``benchmarks.search.compose``:
    # a cross design's base and held-out configs, or which points were composed); {} for a
    # landscape of every config.
    design: dict[str, Any] = field(default_factory=dict)
    # The order its trials took their train sequences in (``trials.types.BatchDraw``):
    # "prompts" for landscapes recorded before trials took verl's.
    train_order: str = "verl"
    # Its trials divided the logits by the temperature into a new tensor at 1.0 too, as
    # every trial recorded until 2026-11-27 did (``autotuner.memory.MemoryModel``).
    logits_copied: bool = False

    # ---------------------------------------------------------------- files

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "label": self.label,
            "command": self.command,
            "recorded_at": self.recorded_at,
            "device": self.device,
            "memory_cap_gib": self.memory_cap_gib,
            "measured_on": sorted({r.device for p in self.points for r in p.runs if r.device}),
            "spec": json.loads(self.spec.model_dump_json()),
            "arch": {"name": self.arch.name, "config": self.arch.config},
            "design": self.design,
            "train_order": self.train_order,
            "logits_copied": self.logits_copied,
            "points": [
                {"config": p.config, "runs": [dataclasses.asdict(r) for r in p.runs]} for p in self.points
            ],
        }

    def save(self, path: str | Path) -> None:
        """Write atomically (a recorder killed mid-write leaves the previous file)."""
        path = Path(path)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        tmp.replace(path)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Landscape:
        if data.get("format") != FORMAT:
            raise LandscapeError(f"not a landscape (format {data.get('format')!r}, want {FORMAT!r})")
        data = _later_knobs_at_baseline(data)
        return cls(
            spec=JobSpec.model_validate(data["spec"]),
            arch=ModelArch(**data["arch"]),
            device=data["device"],
            memory_cap_gib=data.get("memory_cap_gib"),
            label=data.get("label", ""),
            command=data.get("command", ""),
            recorded_at=data.get("recorded_at", ""),
            design=data.get("design") or {},
            train_order=data.get("train_order", "prompts"),
            logits_copied=data.get("logits_copied", True),
            points=[
                LandscapePoint(p["config"], [TrialResult.from_dict(r) for r in p["runs"]])
                for p in data["points"]
            ],
        )

    @classmethod
    def load(cls, path: str | Path) -> Landscape:
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise LandscapeError(f"cannot read landscape {path}: {exc}") from exc

    # ---------------------------------------------------------------- lookups

    def key_of(self, trial: TrialSpec) -> str:
        """What identifies a config in a ``TrialSpec``: its knobs and phases (not its id)."""
        return json.dumps(
            {
                "phases": trial.phases,
                "rollout": dataclasses.asdict(trial.rollout),
                "train": dataclasses.asdict(trial.train),
            },
            sort_keys=True,
        )

    def index(self) -> dict[str, LandscapePoint]:
        """Points by ``key_of`` the trial spec the tuner builds for their config today."""
        out = {}
        for point in self.points:
            trial = build_trial_spec(
                self.spec, self.arch, point.config, "replay", self.device, self.memory_cap_gib
            )
            out[self.key_of(trial)] = point
        return out


def _later_knobs_at_baseline(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with every knob added to the table after the recording (in no point's
    config, absent from its search) at the value the recorded trials ran with
    (``Knob.value_before_table``: verl's default, or how trials behaved before the knob
    existed) where it reaches a point's config; the job's search holds it there."""
    spec = data["spec"]
    search = dict(spec.get("search") or {})
    recorded = {path for p in data["points"] for path in p["config"]}
    later = {
        path: k.value_before_table for path, k in KNOBS.items() if path not in recorded and path not in search
    }
    job = JobSpec.model_validate(spec)
    ctx = SpaceContext(job.workload, job.cluster, ModelArch(**data["arch"]), data["device"])
    points, added = [], set()
    for point in data["points"]:
        extra = {path: v for path, v in later.items() if KNOBS[path].relevant(ctx, point["config"])}
        added |= set(extra)
        points.append({**point, "config": point["config"] | extra})
    search |= {path: {"fixed": later[path]} for path in added}
    return {**data, "spec": {**spec, "search": search}, "points": points}


def throughput(result: TrialResult) -> float | None:
    """The step throughput of an ``ok`` run, else None."""
    value = result.metrics.get(THROUGHPUT) if result.ok else None
    return None if value is None else float(value)


def engine_seconds(run: TrialResult) -> float:
    """What a run spent on its engine (start-up, rollout, sleep: from the engine's start to
    training's), which a trial reusing another's rollout does not spend."""
    m = run.metrics
    if "engine_start_at_s" in m and "train_start_at_s" in m:
        return max(0.0, m["train_start_at_s"] - m["engine_start_at_s"])
    return 0.0


@dataclass
class ReplayExecutor:
    """Answers trials from a ``Landscape`` (``RayExecutor``'s interface; see the module
    docstring). ``history`` lists ``(trial_id, config point, run, cost_s)`` in submit order."""

    landscape: Landscape
    _index: dict[str, LandscapePoint] = field(default_factory=dict)
    _ready: list[TrialResult] = field(default_factory=list)
    _served: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    history: list[tuple[str, LandscapePoint, TrialResult, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._index = self.landscape.index()

    @property
    def cost_s(self) -> float:
        return sum(cost for *_, cost in self.history)

    def gpu_capacity(self) -> GpuCapacity | None:
        """None: a replay reserves nothing; every trial is answered at once."""
        return None

    def submit(self, spec: TrialSpec, resources: Resources, timeout_s: float) -> None:
        key = self.landscape.key_of(spec)
        point = self._index.get(key)
        if point is None:
            raise LandscapeError(
                f"trial {spec.trial_id}: its config is not in the landscape "
                f"({len(self._index)} points); record it, or search only "
                "the recorded values"
            )
        k = self._served[key]
        self._served[key] += 1
        recorded = point.runs[k % len(point.runs)]
        result = TrialResult.from_dict(dataclasses.asdict(recorded))
        result.trial_id = spec.trial_id
        result.hostname = f"replay:{recorded.hostname}"
        wall = recorded.wall_s - (engine_seconds(recorded) if spec.reused_rollout else 0.0)
        if spec.reused_rollout:  # what the trial would have been: the recorded run's train side
            result.metrics["rollout_reused_from_trial"] = float(spec.reused_rollout["trial"])
        self.history.append((spec.trial_id, point, result, wall * max(point.gpus, 1)))
        self._ready.append(result)

    def wait(self, timeout_s: float) -> list[TrialResult]:
        ready, self._ready = self._ready, []
        return ready

    def cancel_all(self) -> list[TrialResult]:
        return self.wait(0.0)
