"""What a job found: the Pareto front, the winner, and its gain over verl's defaults.

The winner is noise-aware once finalists were re-measured (``StudyRunner._remeasure``):
each trial is scored by the median throughput of its runs (a failed re-run counts as 0),
and the re-measured finalists whose median is within the tie band of the best median (the
job's noise, measured on its baselines' repeats, or ``budget.noise_band_pct``, or the best's
own spread, whichever is largest: ``autotuner.noise``) tie. The winner is the best median,
or, among the finalists within ``budget.noise_band_pct`` (or the best's own spread) of it,
the one with the least peak memory: a wide measured noise makes more trials tie, it does
not hand the win to a slower config. Its median, spread and run count go wherever the winner is shown, and its
gain over each baseline is a tie when it is inside the band. A job without re-measurements
picks the fastest trial.
Once verl itself measured trials (``autotuner.verification``) and at least one run
finished, the best verl-measured median wins instead (``pick``), and the summary says so
(``winner_source``).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from autotuner.knobs import R
from autotuner.memory import ADOPTED_PHASES
from autotuner.noise import Noise, Verdict, compare, tie_band_pct, versus
from autotuner.pareto import ObjectiveFn, pareto_front
from autotuner.records import TrialRecord, TrialStatus
from autotuner.spec import JobSpec
from autotuner.verl_results import VerlVerdict, runs_phrase, summary_of, verl_compare, verl_medians
from trials.device import host_kinds
from trials.metrics import PEAK_MEMORY, THROUGHPUT


def front(spec: JobSpec, recs: list[TrialRecord]) -> list[TrialRecord]:
    """Feasible trials no other feasible trial beats on every objective of the job."""
    feasible = [
        r for r in recs if r.feasible and all(r.metric(o.metric) is not None for o in spec.objectives)
    ]
    objectives: list[ObjectiveFn[TrialRecord]] = [
        (_metric_value(o.metric), o.resolved_direction) for o in spec.objectives
    ]
    return pareto_front(feasible, objectives)


def _metric_value(metric: str) -> Callable[[TrialRecord], float]:
    return lambda rec: float(rec.metrics[metric])


@dataclass
class Runs:
    """A trial's throughput over its runs: its own and its re-measurements'."""

    trial: TrialRecord
    throughputs: list[float] = field(default_factory=list)
    peaks_gib: list[float] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.throughputs)

    @property
    def median(self) -> float:
        return statistics.median(self.throughputs) if self.throughputs else 0.0

    @property
    def low(self) -> float:
        return min(self.throughputs, default=0.0)

    @property
    def high(self) -> float:
        return max(self.throughputs, default=0.0)

    @property
    def spread_pct(self) -> float | None:
        """(max - min) / median, in percent; None with a single run."""
        if self.n < 2 or not self.median:
            return None
        return 100.0 * (self.high - self.low) / self.median

    @property
    def peak_gib(self) -> float:
        return statistics.median(self.peaks_gib) if self.peaks_gib else 0.0

    def describe(self) -> str:
        """``7083.0 tok/s/GPU (1 run)`` or ``7083.0 tok/s/GPU (median of 3, spread 1.2%)``."""
        if self.n < 2:
            return f"{self.median:.1f} tok/s/GPU (1 run)"
        return (
            f"{self.median:.1f} tok/s/GPU (median of {self.n} runs, "
            f"{self.low:.1f}-{self.high:.1f}, spread {self.spread_pct or 0:.1f}%)"
        )


def runs_of(recs: list[TrialRecord]) -> dict[int, Runs]:
    """Every feasible trial's runs, by trial number (re-measurements joined to theirs)."""
    out = {r.number: Runs(r) for r in recs if r.feasible and r.metric(THROUGHPUT) is not None}
    for r in sorted(recs, key=lambda r: r.number):
        number = r.number if r.repeat_of is None else r.repeat_of
        if number not in out or not r.ran:
            continue
        ok = r.status == TrialStatus.OK
        out[number].throughputs.append((r.metric(THROUGHPUT) or 0.0) if ok else 0.0)
        if ok and r.metric(PEAK_MEMORY) is not None:
            out[number].peaks_gib.append(float(r.metrics[PEAK_MEMORY]))
    return out


def noise_of(spec: JobSpec, recs: list[TrialRecord]) -> Noise:
    """The job's noise: its baselines' spreads over their successful runs, pooled (a failed
    re-run is not a throughput: it counts as 0 in a median, not in the noise)."""
    runs = runs_of(recs)
    groups = [
        [v for v in runs[r.number].throughputs if v > 0] for r in recs if r.baseline and r.number in runs
    ]
    return Noise.of(spec.budget.noise_band_pct, groups)


def choose(
    spec: JobSpec, recs: list[TrialRecord], max_peak_memory_gib: float | None = None
) -> tuple[Runs | None, list[int]]:
    """The winner's runs and the trials it tied with (see the module docstring)."""
    cap = float("inf") if max_peak_memory_gib is None else max_peak_memory_gib
    candidates = [
        runs for runs in runs_of(recs).values() if float(runs.trial.metrics.get(PEAK_MEMORY, 0.0)) <= cap
    ]
    if not candidates:
        return None, []
    top = max(candidates, key=lambda c: (c.median, -c.trial.number))
    if top.n < 2:
        return top, []
    # Memory decides only within the band the user is indifferent to (or the best's own
    # spread): a wide measured noise makes more trials tie, not a slower one the winner.
    pick_band = max(spec.budget.noise_band_pct, top.spread_pct or 0.0) / 100.0
    close = [c for c in candidates if c.n >= 2 and c.median >= top.median * (1.0 - pick_band)]
    winner = min(close, key=lambda c: (c.peak_gib, -c.median, c.trial.number))
    band = finalists_band_pct(spec, recs, top) / 100.0
    tied = [c for c in candidates if c.n >= 2 and c.median >= top.median * (1.0 - band)]
    return winner, sorted(c.trial.number for c in tied if c is not winner)


def finalists_band_pct(spec: JobSpec, recs: list[TrialRecord], top: Runs) -> float:
    """The band (%) the re-measured trials tie with the best median ``top`` within: the
    job's noise, or ``top``'s own spread where wider."""
    return tie_band_pct(noise_of(spec, recs), top.spread_pct)


def pick(
    spec: JobSpec,
    recs: list[TrialRecord],
    max_peak_memory_gib: float | None = None,
    verl: dict[int, VerlVerdict] | None = None,
) -> tuple[Runs | None, list[int], str]:
    """``choose``, unless verl measured a trial: then the trial with the best verl-measured
    median throughput (under the cap) wins; which of the two picked it (``WINNER_SOURCES``)."""
    medians = verl_medians(verl or {})
    cap = float("inf") if max_peak_memory_gib is None else max_peak_memory_gib
    runs = runs_of(recs)
    verified = [n for n in medians if n in runs and float(runs[n].trial.metrics.get(PEAK_MEMORY, 0.0)) <= cap]
    if verified:
        top = max(verified, key=lambda n: (medians[n], -n))
        return runs[top], [], "verl"
    winner, tied = choose(spec, recs, max_peak_memory_gib)
    return winner, tied, "trials"


def best(
    spec: JobSpec,
    recs: list[TrialRecord],
    max_peak_memory_gib: float | None = None,
    verl: dict[int, VerlVerdict] | None = None,
) -> TrialRecord | None:
    """The winner among feasible trials, under a memory cap if one is given (``pick``)."""
    winner, _, _ = pick(spec, recs, max_peak_memory_gib, verl)
    return None if winner is None else winner.trial


def gpu_seconds(recs: list[TrialRecord]) -> float:
    """What the job's trials cost: each run's wall time (start-up included) x its GPUs (as
    reserved; a trial that did not record them: its TP size, one on a CPU)."""
    return sum(
        r.wall_s * (r.gpus or int(r.config.get(R + "tensor_model_parallel_size", 1)))
        for r in recs
        if r.ran or r.status in (TrialStatus.INFRA_ERROR, TrialStatus.CANCELLED)
    )


def gpu_seconds_to(recs: list[TrialRecord], number: int) -> float:
    """What the job had spent by the end of run ``number``: the GPU-seconds of the runs
    numbered up to it. Runs are numbered as they start, so with concurrent trials this counts
    the runs started before it that were still going, and leaves out any started after it."""
    return gpu_seconds([r for r in recs if r.number <= number])


def first_tied(
    winner: Runs, runs: dict[int, Runs], noise: Noise, left_out: Collection[int] = ()
) -> int | None:
    """The earliest trial whose median is the winner's or inside the tie band of it (the
    job's noise or either figure's own spread, ``autotuner.noise.tie_band_pct``): where the job first
    ran a config the noise cannot tell from its winner. The winner itself, if none before it.
    ``left_out``: trials not to name (verl's baselines, for the search's own first); None when
    every such trial, the winner included, is left out."""
    for number in sorted(runs):
        c = runs[number]
        band = tie_band_pct(noise, winner.spread_pct, c.spread_pct)
        if number not in left_out and c.n and c.median >= winner.median * (1.0 - band / 100.0):
            return number
    return None if winner.trial.number in left_out else winner.trial.number


def memory_errors(recs: list[TrialRecord]) -> dict[str, Any]:
    """The memory model's error on the trials it predicted before they ran, per phase:
    mean and largest |measured - predicted| (GiB), and the mean relative to measured (%).
    A trial that took over another's rollout measured neither its start-up, rollout and
    wake nor its peak (``memory.ADOPTED_PHASES``): errors it recorded there, as trials did
    before that was known, are left out."""
    per_phase: dict[str, list[tuple[float, float]]] = {}
    for r in recs:
        not_its_own = (*ADOPTED_PHASES, "peak") if "rollout_reused_from_trial" in r.metrics else ()
        for phase, error in r.memory_error_gib.items():
            predicted = r.predicted_memory_gib.get(phase)
            if predicted is not None and phase not in not_its_own:
                per_phase.setdefault(phase, []).append((float(error), predicted + float(error)))
    phases = {}
    for phase, pairs in per_phase.items():
        phases[phase] = {
            "trials": len(pairs),
            "mean_abs_error_gib": statistics.fmean(abs(e) for e, _ in pairs),
            "max_abs_error_gib": max(abs(e) for e, _ in pairs),
            "mean_abs_error_pct": statistics.fmean(100 * abs(e) / m for e, m in pairs if m > 0)
            if any(m > 0 for _, m in pairs)
            else None,
            "mean_error_gib": statistics.fmean(e for e, _ in pairs),
        }
    return phases


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
    # The winner's runs (1 unless re-measured), their range and spread (% of the median),
    # and the finalists it tied with inside the noise band.
    best_runs: int = 0
    best_throughput_range: list[float] | None = None
    best_spread_pct: float | None = None
    tied_with: list[int] = field(default_factory=list)
    tied_band_pct: float | None = None  # the band they tied within (``finalists_band_pct``)
    noise_band_pct: float = 0.0  # the floor the budget assumes
    # The noise measured on the baselines' repeats (pooled spread, %; None: no baseline ran
    # twice), the runs it rests on, and the tie band it sets (``autotuner.noise``).
    noise_pct: float | None = None
    noise_baselines: int = 0
    noise_runs: int = 0
    tie_band_pct: float = 0.0
    # The winner against verl's defaults: faster, slower or a tie inside the band that
    # comparison used (the job's, or either figure's own spread where larger).
    verdict_over_baseline: str | None = None
    band_over_baseline: float | None = None
    # Measured minus predicted peak memory per phase, over the trials predicted before they ran.
    memory_model_errors: dict[str, Any] = field(default_factory=dict)
    gpu_seconds: float = 0.0
    # What the job had spent once the winner's first run was over: the GPU-seconds of the runs
    # numbered up to it (runs are numbered as they start; ``gpu_seconds_to``).
    gpu_seconds_to_best: float | None = None
    # The earliest trial inside the tie band of the winner (``first_tied``; the winner when
    # none ran before it) and what the job had spent once its first run ended: a config the
    # noise cannot tell from the winner had run by then.
    first_tied: int | None = None
    gpu_seconds_to_tie: float | None = None
    # The same among the search's own configs, verl's baselines left out: where first_tied is a
    # baseline (or the winner is), what the job had spent once the search itself had run a
    # config as good as the winner.
    first_tied_proposed: int | None = None
    gpu_seconds_to_tie_proposed: float | None = None
    # Who picked the winner: "verl" (its best verl-measured median) or "trials" (the trials'
    # figures); each trial verified in verl, by number (``verl_results.summary_of``).
    winner_source: str = "trials"
    # budget.verify_in_verl as the job's runner resolved it (its default depends on the host).
    verify_in_verl: int = 0
    # The winner's verl-measured median over verl's defaults' (both verified in verl), faster,
    # slower or a tie inside the band of their verl noises (``verl_results.verl_compare``).
    verl_gain_over_baseline: float | None = None
    verl_gain_verdict: str | None = None
    verl_gain_band_pct: float | None = None
    # Verified trials whose verl median ties the winner's (each pair judged in its own band),
    # and the widest of those bands.
    verl_tied_with: list[int] = field(default_factory=list)
    verl_tie_bands_pct: list[float] = field(default_factory=list)  # each tie's band, in order
    verl_tie_band_pct: float | None = None
    verl: dict[int, dict[str, Any]] = field(default_factory=dict)
    # The runs by the kind of host they ran on (``hosts_of``).
    hosts: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def best_line(self) -> str:
        """The winner in one line with its spread, for the CLI and logs."""
        if self.best is None or self.best_throughput is None:
            return "no feasible trial"
        runs = (
            f" (median of {self.best_runs} runs, spread {self.best_spread_pct or 0:.1f}%)"
            if self.best_runs >= 2
            else " (1 run)"
        )
        tied = f"; tied within the noise band with {self.tied_with}" if self.tied_with else ""
        verified = self.verl.get(self.best) if self.winner_source == "verl" else None
        in_verl = (
            f"; picked in verl: {verified['throughput_median']:.1f} tok/s/GPU measured in verl"
            f" ({runs_phrase(verified)})"
            if verified is not None and verified.get("throughput_median") is not None
            else ""
        )
        if in_verl and self.verl_tied_with:
            in_verl += (
                f", tied in verl with {self.verl_tied_with} inside the "
                f"{self.verl_tie_band_pct or 0:.1f}% noise band"
            )
        return f"trial {self.best}: {self.best_throughput:.1f} tok/s/GPU{runs}{tied}{in_verl}"

    def cost_line(self) -> str:
        """What the job cost in GPU time, and what it had cost when the winner first ran."""
        line = f"cost: {self.gpu_seconds:.0f} GPU-seconds ({self.gpu_seconds / 60:.1f} GPU-minutes) in all"
        if self.best is None or self.gpu_seconds_to_best is None:
            return line
        share = (
            f", {100 * self.gpu_seconds_to_best / self.gpu_seconds:.0f}% of it" if self.gpu_seconds else ""
        )
        line = (
            f"{line}; the winner (trial {self.best}) was found after {self.gpu_seconds_to_best:.0f} "
            f"GPU-seconds ({self.gpu_seconds_to_best / 60:.1f} GPU-minutes{share})"
        )
        if (
            self.first_tied is not None
            and self.first_tied != self.best
            and self.gpu_seconds_to_tie is not None
        ):
            line = (
                f"{line}; a config inside its tie band (trial {self.first_tied}) "
                f"after {self.gpu_seconds_to_tie:.0f} ({self.gpu_seconds_to_tie / 60:.1f} GPU-minutes)"
            )
        own, cost = self.first_tied_proposed, self.gpu_seconds_to_tie_proposed
        if own is not None and own not in (self.first_tied, self.best) and cost is not None:
            line = (
                f"{line}; the search's first config inside the winner's tie band (trial {own}) "
                f"after {cost:.0f} ({cost / 60:.1f} GPU-minutes)"
            )
        return line

    def verl_verdicts(self) -> list[str]:
        """What verl said of the winner it picked, inside verl's noise: against verl's
        defaults, and against the other verified trials it ties (or that it beat them all);
        empty unless verl picked it."""
        if self.winner_source != "verl" or self.best is None:
            return []
        parts = []
        tied = dict(zip(self.verl_tied_with, self.verl_tie_bands_pct, strict=False))
        if self.verl_gain_over_baseline is not None and self.best != self.baseline:
            parts.append(
                versus(
                    self.verl_gain_over_baseline,
                    self.verl_gain_verdict,
                    self.verl_gain_band_pct or 0.0,
                    "verl's defaults",
                )
            )
            if self.baseline is not None:
                tied.pop(self.baseline, None)  # said just now
        if tied:
            names = f"trial {next(iter(tied))}" if len(tied) == 1 else f"trials {', '.join(map(str, tied))}"
            parts.append(f"ties {names} inside the {max(tied.values()):.1f}% noise band")
        elif not self.verl_tied_with and any(
            n != self.best and v.get("throughput_median") for n, v in self.verl.items()
        ):
            parts.append("faster than every other trial verl measured, beyond their noise")
        return parts

    def verl_gain_line(self) -> str | None:
        """``verl_verdicts`` in one line for the CLI; None when there is nothing to say."""
        parts = self.verl_verdicts()
        return f"in verl, trial {self.best}: " + "; ".join(parts) if parts else None

    def noise_line(self) -> str:
        """The job's noise and tie band, for the CLI and logs."""
        return Noise(self.noise_band_pct, self.noise_pct, self.noise_baselines, self.noise_runs).describe()

    def hosts_line(self) -> str | None:
        return hosts_line(self.hosts)

    def versus_lines(self) -> list[str]:
        """The winner against each baseline: a ratio, or a tie inside the band."""
        out = []
        for name, b in self.baselines.items():
            tput, runs, spread = b[THROUGHPUT], b.get("runs") or 0, b.get("spread_pct")
            measured = (
                f"{tput:.1f} tok/s/GPU (median of {runs} runs, spread {spread or 0:.1f}%)"
                if runs >= 2
                else f"{tput:.1f} tok/s/GPU ({runs} run)"
            )
            if not tput or b.get("gain_of_best") is None:
                out.append(f"{name} (trial {b['trial']}, {b['status']}): no throughput")
                continue
            verdict = "ties it" if b["verdict"] == Verdict.TIE else f"{b['gain_of_best']:.2f}x"
            out.append(
                f"{name} (trial {b['trial']}): {measured}; the winner {verdict}"
                f" (tie band {b['tie_band_pct']:.1f}%)"
            )
        return out


def summarize(
    spec: JobSpec, recs: list[TrialRecord], stop_reason: str, verl: dict[int, VerlVerdict] | None = None
) -> JobSummary:
    counts: dict[str, int] = {}
    for r in recs:
        key = str(r.status) if r.repeat_of is None else "remeasured"
        counts[key] = counts.get(key, 0) + 1
    winner, tied, source = pick(spec, recs, verl=verl)
    top_tput = winner.median if winner is not None else None
    runs = runs_of(recs)
    noise = noise_of(spec, recs)
    out_baselines: dict[str, dict[str, Any]] = {}
    for r in recs:
        if (
            r.baseline
            and r.baseline not in out_baselines
            and (r.measured or r.status == TrialStatus.DUPLICATE)
        ):
            measured = runs.get(r.number)
            tput = measured.median if measured is not None else 0.0
            gain = (top_tput or 0.0) / tput if top_tput is not None and tput else None
            band = tie_band_pct(
                noise,
                measured.spread_pct if measured is not None else None,
                winner.spread_pct if winner is not None else None,
            )
            verdict = compare(top_tput, tput, band) if top_tput is not None and tput else None
            out_baselines[r.baseline] = {
                "trial": r.number,
                "status": r.status,
                THROUGHPUT: tput,  # the median of its runs
                "runs": measured.n if measured is not None else 0,
                "spread_pct": measured.spread_pct if measured is not None else None,
                "gain_of_best": gain,
                "verdict": verdict,  # the winner against it
                "tie_band_pct": band,
            }
    base = next((r for r in recs if r.baseline and r.measured), None)
    out = JobSummary(
        stop_reason,
        counts,
        [r.number for r in front(spec, recs)],
        baselines=out_baselines,
        noise_band_pct=spec.budget.noise_band_pct,
        noise_pct=noise.measured_pct,
        noise_baselines=noise.baselines,
        noise_runs=noise.runs,
        tie_band_pct=noise.band_pct,
        memory_model_errors=memory_errors(recs),
        gpu_seconds=gpu_seconds(recs),
        hosts=hosts_of(recs),
    )
    out.winner_source = source
    out.verl = verified_summaries(recs, verl or {})
    if winner is not None:
        out.best, out.best_throughput, out.device = winner.trial.number, top_tput, winner.trial.device
        out.best_runs, out.tied_with = winner.n, tied
        if tied:  # the best median among them set the band
            top = max([winner, *(runs[n] for n in tied)], key=lambda c: (c.median, -c.trial.number))
            out.tied_band_pct = finalists_band_pct(spec, recs, top)
        out.gpu_seconds_to_best = gpu_seconds_to(recs, winner.trial.number)
        out.first_tied = first_tied(winner, runs, noise)
        out.first_tied_proposed = first_tied(winner, runs, noise, {r.number for r in recs if r.baseline})
        if out.first_tied is not None:
            out.gpu_seconds_to_tie = gpu_seconds_to(recs, out.first_tied)
        if out.first_tied_proposed is not None:
            out.gpu_seconds_to_tie_proposed = gpu_seconds_to(recs, out.first_tied_proposed)
        if winner.n >= 2:
            out.best_throughput_range = [winner.low, winner.high]
            out.best_spread_pct = winner.spread_pct
    verdicts = verl or {}
    medians = verl_medians(verdicts)
    floor = spec.budget.noise_band_pct
    if (
        winner is not None
        and base is not None
        and medians.get(base.number)
        and winner.trial.number in medians
    ):
        out.verl_gain_over_baseline = medians[winner.trial.number] / medians[base.number]
        judged = verl_compare(verdicts[winner.trial.number], verdicts[base.number], floor)
        if judged is not None:
            out.verl_gain_verdict, out.verl_gain_band_pct = str(judged[0]), judged[1]
    if winner is not None and source == "verl":
        picked = verdicts[winner.trial.number]
        bands = {}
        for number, other in sorted(verdicts.items()):
            judged = verl_compare(picked, other, floor) if number != winner.trial.number else None
            if judged is not None and judged[0] is Verdict.TIE:
                bands[number] = judged[1]
        out.verl_tied_with, out.verl_tie_bands_pct = list(bands), list(bands.values())
        out.verl_tie_band_pct = max(bands.values()) if bands else None
    if base is not None:
        out.baseline = base.number
        base_runs = runs.get(base.number)
        out.baseline_throughput = base_runs.median if base.feasible and base_runs is not None else 0.0
        if out.best_throughput and out.baseline_throughput:
            out.gain_over_baseline = out.best_throughput / out.baseline_throughput
            compared = next((b for b in out_baselines.values() if b["trial"] == base.number), None)
            if compared is not None:
                out.verdict_over_baseline = compared["verdict"]
                out.band_over_baseline = compared["tie_band_pct"]
    return out


def hosts_line(hosts: dict[str, int]) -> str | None:
    """Where a job's runs came from more than one kind of host (``hosts_of``), which; None
    otherwise."""
    if len(hosts) < 2:
        return None
    kinds = "; ".join(f"{kind}: {n} runs" for kind, n in hosts.items())
    return (
        f"hosts: the runs came from {len(hosts)} kinds of host ({kinds}); a config's throughput "
        "moves with its host, so configs measured on different kinds compare only as well as "
        "those hosts agree"
    )


def hosts_of(recs: list[TrialRecord]) -> dict[str, int]:
    """The runs (trials and re-measurements) by the kind of host they ran on
    (``trials.device.host_kind``: the processor model and CPU counts; runs that recorded
    none left out). A small model's rollout and micro-batches are paced by the host as much
    as by the GPU, so a job whose trials ran on several kinds of host compares configs
    across them."""
    return host_kinds(r.software for r in recs if r.ran)


def verified_summaries(recs: list[TrialRecord], verl: dict[int, VerlVerdict]) -> dict[int, dict[str, Any]]:
    """Each verl-verified trial's verdict as plain data, with the trial's prediction error."""
    by_number = {r.number: r for r in recs}
    runs = runs_of(recs)
    return {
        n: summary_of(v, by_number.get(n), runs[n].median if n in runs else None)
        for n, v in sorted(verl.items())
    }
