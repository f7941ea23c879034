"""What verl measured for a trial, over its verification runs, and how far the trial was off.

Each verl run (``trials.verl``) yields verl's own per-step metrics and their medians over the
measured steps (``VerlRunResult.measured``). A trial's ``VerlVerdict`` joins its runs: the
median and spread of ``perf/throughput`` over the runs that finished, the spread of their
measured steps (each step runs the batch the trials ran: ``VerlRunSpec.repeat_batch``, so the
steps are repeats of one measurement), the per-phase medians, the largest peak memory, the
versions. Its noise is the wider of its runs' and its steps' spreads; two verdicts tie when
their medians are inside the wider of their noises or the job's assumed floor
(``budget.noise_band_pct``; ``autotuner.noise``). Its prediction error compares the trial's own figures
with verl's, phase by phase (``PHASE_KEYS``) and for step throughput: ``(trial - verl) /
verl`` in percent, so +10 means the trial predicted 10% more than verl measured.

verl v0.9's trainer (``verl/trainer/ppo/ray_trainer.py``) times the step's parts with
``marked_timer``: ``gen`` (the rollout, its replicas put to sleep at the end), ``old_log_prob``,
``ref`` (``str(Role.RefPolicy)``), ``update_actor`` and ``update_weights`` (after the update,
for the next rollout: the replicas' weights woken, the weight sync into them, their KV cache
woken; the trial's ``weight_sync`` and ``engine_wake``, ``trials.step.VERL_TIMERS``); ``perf/throughput`` is
``sum(global_token_num) / (timing_s/step * n_gpus)`` (``metric_utils.compute_throughout_metrics``):
tokens per second per GPU, the trials' definition too.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from autotuner.noise import Noise, Verdict, compare, spread_pct, tie_band_pct
from autotuner.records import TrialRecord
from trials.metrics import THROUGHPUT
from trials.step import as_verl_timers
from trials.verl.types import VerlRunResult

VERL_THROUGHPUT = "perf/throughput"
VERL_STEP = "timing_s/step"
# A trial's phase (``TrialResult.phase_timings_s``) and the verl timing that measures it: the
# rollout's error is that of the trial's ``gen`` (the rollout, verl's replay-buffer poll and
# the engine's sleep, ``trials.step.VERL_TIMERS``).
PHASE_KEYS: dict[str, str] = {
    "rollout": "timing_s/gen",
    "old_log_prob": "timing_s/old_log_prob",
    "ref_log_prob": "timing_s/ref",
    "update_actor": "timing_s/update_actor",
    "weight_sync": "timing_s/update_weights",
}
PEAK_KEYS = ("perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb")
# verl's figures a verdict keeps (medians over its runs): the step, its phases, throughput.
SHOWN_KEYS = (VERL_THROUGHPUT, VERL_STEP, *PHASE_KEYS.values())


@dataclass
class VerlVerdict:
    """A trial's runs in verl (in the order they ran) and what they add up to."""

    trial: int
    runs: list[VerlRunResult] = field(default_factory=list)

    @property
    def ok_runs(self) -> list[VerlRunResult]:
        return [r for r in self.runs if r.ok and VERL_THROUGHPUT in r.measured]

    @property
    def status(self) -> str:
        """``ok`` when at least one run finished; else the last run's status."""
        if self.ok_runs:
            return "ok"
        return self.runs[-1].status if self.runs else "error"

    @property
    def throughputs(self) -> list[float]:
        return [r.measured[VERL_THROUGHPUT] for r in self.ok_runs]

    @property
    def median(self) -> float | None:
        """The median of the runs' ``perf/throughput`` (each a median over its measured steps)."""
        values = self.throughputs
        return statistics.median(values) if values else None

    @property
    def spread_pct(self) -> float | None:
        """(max - min) / median over the runs, in percent; None with fewer than two."""
        values, median = self.throughputs, self.median
        if len(values) < 2 or not median:
            return None
        return 100.0 * (max(values) - min(values)) / median

    def measured_steps(self, key: str) -> list[float]:
        """``key`` of every measured step (after its run's warm-up) of the runs that
        finished, run after run."""
        return [step[key] for r in self.ok_runs for step in r.steps[r.warmup_steps :] if key in step]

    @property
    def step_throughputs(self) -> list[float]:
        return self.measured_steps(VERL_THROUGHPUT)

    @property
    def steps_spread_pct(self) -> float | None:
        """(max - min) / median over the measured steps, in percent; None below two steps."""
        return spread_pct(self.step_throughputs)

    @property
    def noise_pct(self) -> float | None:
        """The verdict's own noise: the wider of its runs' and its steps' spreads (None when
        neither has two figures)."""
        spreads = [s for s in (self.spread_pct, self.steps_spread_pct) if s is not None]
        return max(spreads) if spreads else None

    def phase_spreads_pct(self) -> dict[str, float]:
        """verl's own spread over its measured steps (the finished runs' pooled), per phase the
        trial's error is given for (``PHASE_KEYS``), for the step and for throughput: how far
        verl moved on one batch, against which a trial's error is read."""
        keys = {**PHASE_KEYS, "step": VERL_STEP, "throughput": VERL_THROUGHPUT}
        out = {}
        for phase, key in keys.items():
            spread = spread_pct(self.measured_steps(key))
            if spread is not None:
                out[phase] = spread
        return out

    def medians(self) -> dict[str, float]:
        """verl's step, phases and throughput: each the median over the finished runs."""
        out = {}
        for key in SHOWN_KEYS:
            values = [r.measured[key] for r in self.ok_runs if key in r.measured]
            if values:
                out[key] = statistics.median(values)
        return out

    def peak_memory_gb(self) -> dict[str, float]:
        """verl's peak memory (allocated, reserved; GB as verl logs it): the largest of the runs."""
        out = {}
        for key in PEAK_KEYS:
            values = [r.measured[key] for r in self.ok_runs if key in r.measured]
            if values:
                out[key] = max(values)
        return out

    def versions(self) -> dict[str, str]:
        return next((r.versions for r in self.ok_runs + self.runs if r.versions), {})

    def device(self) -> str:
        return next((r.device for r in self.ok_runs + self.runs if r.device), "")

    def describe(self) -> str:
        """``4021.7 tok/s/GPU in verl (median of 2 runs, spread 1.2%)``, or the failure."""
        if self.median is None:
            last = self.runs[-1] if self.runs else None
            why = f": {last.error_type}" if last is not None and last.error_type else ""
            return f"not measured in verl ({self.status}{why})"
        return f"{self.median:.1f} tok/s/GPU in verl ({runs_phrase(summary_of(self, None, None))})"


def prediction_error_pct(
    trial: TrialRecord, verdict: VerlVerdict, trial_throughput: float | None = None
) -> dict[str, float]:
    """(trial - verl) / verl in percent, per phase both measured and for step throughput
    (``trial_throughput``: the trial's median over its runs, else its one measurement)."""
    medians = verdict.medians()
    predictions = as_verl_timers(trial.phase_timings_s)
    errors: dict[str, float] = {}
    for phase, key in PHASE_KEYS.items():
        predicted, measured = predictions.get(key), medians.get(key)
        if predicted is not None and measured:
            errors[phase] = 100.0 * (float(predicted) - measured) / measured
    step, verl_step = trial.metric("step_time_s"), medians.get(VERL_STEP)
    if step is not None and verl_step:
        errors["step"] = 100.0 * (step - verl_step) / verl_step
    throughput = trial_throughput if trial_throughput is not None else trial.metric(THROUGHPUT)
    if throughput is not None and verdict.median:
        errors["throughput"] = 100.0 * (throughput - verdict.median) / verdict.median
    return errors


def verdicts_of(runs: list[tuple[int, VerlRunResult]]) -> dict[int, VerlVerdict]:
    """Each verified trial's verdict, from ``(trial number, run)`` pairs in the order they ran."""
    out: dict[int, VerlVerdict] = {}
    for number, run in runs:
        out.setdefault(number, VerlVerdict(number)).runs.append(run)
    return out


def verl_medians(verdicts: dict[int, VerlVerdict]) -> dict[int, float]:
    """The verl-measured median throughput of each trial verl measured (the winner's rule)."""
    return {n: v.median for n, v in verdicts.items() if v.median is not None}


def summary_of(
    verdict: VerlVerdict, trial: TrialRecord | None, trial_throughput: float | None
) -> dict[str, Any]:
    """A verdict as plain data: for the job's summary, the API and the CLI."""
    return {
        "trial": verdict.trial,
        "status": verdict.status,
        "runs": len(verdict.runs),
        "ok_runs": len(verdict.ok_runs),
        "throughput_median": verdict.median,
        "throughput_low": min(verdict.throughputs, default=None),
        "throughput_high": max(verdict.throughputs, default=None),
        "spread_pct": verdict.spread_pct,
        "steps": len(verdict.step_throughputs),
        "steps_spread_pct": verdict.steps_spread_pct,
        "noise_pct": verdict.noise_pct,
        "phase_spread_pct": verdict.phase_spreads_pct(),
        "medians": verdict.medians(),
        "peak_memory_gb": verdict.peak_memory_gb(),
        "versions": verdict.versions(),
        "device": verdict.device(),
        "prediction_error_pct": {}
        if trial is None
        else prediction_error_pct(trial, verdict, trial_throughput),
        "error": next(
            (f"{r.error_type}: {r.error_message}" for r in reversed(verdict.runs) if r.error_type), None
        ),
    }


def runs_phrase(verified: dict[str, Any]) -> str:
    """How a verdict (``summary_of``'s data) was measured, for a person: ``1 run, 3 steps,
    spread 18.1%`` or ``median of 2 runs, spread 1.2%; 6 steps, spread 4.0%``."""
    ok, steps = verified.get("ok_runs", 0), verified.get("steps") or 0
    step_spread = verified.get("steps_spread_pct")
    on_steps = f"{steps} step{'' if steps == 1 else 's'}"
    if step_spread is not None:
        on_steps += f", spread {step_spread:.1f}%"
    runs = f"median of {ok} runs, spread {verified.get('spread_pct') or 0:.1f}%" if ok >= 2 else "1 run"
    return f"{runs}{'; ' if ok >= 2 else ', '}{on_steps}" if steps else runs


def verl_compare(a: VerlVerdict, b: VerlVerdict, floor_pct: float) -> tuple[Verdict, float] | None:
    """How ``a``'s verl-measured median compares with ``b``'s, and the band it was judged in
    (the wider of their noises, at least ``floor_pct``); None when either has no median."""
    if a.median is None or b.median is None:
        return None
    band = tie_band_pct(Noise(floor_pct), a.noise_pct, b.noise_pct)
    return compare(a.median, b.median, band), band


def errors_phrase(verified: dict[str, Any]) -> str:
    """The trial's error per phase (``summary_of``'s data), each inside verl's own spread over
    its steps marked so: ``rollout +92.6% (inside verl's 96%), step +5.5%``."""
    spreads = verified.get("phase_spread_pct") or {}
    out = []
    for phase, error in (verified.get("prediction_error_pct") or {}).items():
        spread = spreads.get(phase)
        inside = f" (inside verl's {spread:.0f}%)" if spread is not None and abs(error) < spread else ""
        out.append(f"{phase} {error:+.1f}%{inside}")
    return ", ".join(out)
