"""What a job found: the Pareto front, the best trial, and its gain over verl's defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autotuner.pareto import best_under_cap, pareto_front
from autotuner.records import TrialRecord
from autotuner.spec import JobSpec

THROUGHPUT = "throughput_tokens_per_s_per_gpu"


def front(spec: JobSpec, recs: list[TrialRecord]) -> list[TrialRecord]:
    """Feasible trials no other feasible trial beats on every objective of the job."""
    feasible = [r for r in recs if r.feasible and all(r.metric(o.metric) is not None
                                                      for o in spec.objectives)]
    objectives = [((lambda r, m=o.metric: float(r.metrics[m])), o.resolved_direction)
                  for o in spec.objectives]
    return pareto_front(feasible, objectives)


def best(spec: JobSpec, recs: list[TrialRecord], max_peak_memory_gib: float | None = None
         ) -> TrialRecord | None:
    """Highest step throughput among feasible trials, under a memory cap if one is given."""
    feasible = [r for r in recs if r.feasible and r.metric(THROUGHPUT) is not None]
    cap = float("inf") if max_peak_memory_gib is None else max_peak_memory_gib
    return best_under_cap(feasible, lambda r: float(r.metrics[THROUGHPUT]), "maximize",
                          lambda r: float(r.metrics.get("peak_memory_gib", 0.0)), cap)


@dataclass
class JobSummary:
    stop_reason: str
    counts: dict[str, int] = field(default_factory=dict)
    pareto: list[int] = field(default_factory=list)
    best: int | None = None
    baseline: int | None = None
    best_throughput: float | None = None
    baseline_throughput: float | None = None
    gain_over_baseline: float | None = None
    # Every named baseline: its trial, status and throughput, and the best's gain over it.
    baselines: dict[str, dict[str, Any]] = field(default_factory=dict)
    device: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def summarize(spec: JobSpec, recs: list[TrialRecord], stop_reason: str) -> JobSummary:
    counts: dict[str, int] = {}
    for r in recs:
        counts[r.status] = counts.get(r.status, 0) + 1
    top = best(spec, recs)
    out_baselines: dict[str, dict[str, Any]] = {}
    for r in recs:
        if r.baseline and r.baseline not in out_baselines and (r.measured or r.status == "duplicate"):
            tput = r.metric(THROUGHPUT) if r.feasible else 0.0
            gain = (top.metric(THROUGHPUT) or 0.0) / tput if top is not None and tput else None
            out_baselines[r.baseline] = {"trial": r.number, "status": r.status,
                                         "throughput_tokens_per_s_per_gpu": tput,
                                         "gain_of_best": gain}
    base = next((r for r in recs if r.baseline and r.measured), None)
    out = JobSummary(stop_reason, counts, [r.number for r in front(spec, recs)],
                     baselines=out_baselines)
    if top is not None:
        out.best, out.best_throughput, out.device = top.number, top.metric(THROUGHPUT), top.device
    if base is not None:
        out.baseline = base.number
        out.baseline_throughput = base.metric(THROUGHPUT) if base.feasible else 0.0
        if out.best_throughput and out.baseline_throughput:
            out.gain_over_baseline = out.best_throughput / out.baseline_throughput
    return out
