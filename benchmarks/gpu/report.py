"""Print a job's results (a ``dump_results`` JSON) as the Markdown tables of benchmarks/README.md.

usage: python -m benchmarks.gpu.report RESULTS.json [RESULTS.json ...]
       python -m benchmarks.gpu.report --compare RESULTS.json RESULTS.json ...

For each job: the job's noise (its baselines' spread over their repeats, where it measured
them) and the tie band it sets; the measured trials, best first, each with the median,
spread and n of its runs and the step's composition; the best trial against each named
baseline, a tie when the gap is inside the band (``autotuner.noise``); the best trial per
rollout TP size (when TP was searched); the trials that ran out of memory, by phase, with
the GPU-seconds they cost (a trial's wall time, start-up included, times the GPUs it held);
the trials it ran in verl itself, each against verl's measurement, and who picked the
winner (verl's pick judged inside verl's noise); the GPU-seconds of the whole job, what it
had spent once its winner first ran, once the earliest trial inside the winner's tie band
did and, where that was one of verl's baselines, once the earliest of the search's own
configs inside it did; and its measured trials per hour of wall-clock time.

``--compare``: the jobs side by side, one row per rollout engine (vLLM against SGLang on
the same workload): what each tuning found and cost, then the configs both measured (the
baselines: the same knobs on each engine, verl's defaults among them) phase by phase.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import Counter, defaultdict
from datetime import datetime
from typing import Any

from autotuner.compose import ENGINE_PHASES
from autotuner.noise import Verdict, spread_pct
from autotuner.summary import JobSummary
from autotuner.verl_results import errors_phrase, runs_phrase

TP = "actor_rollout_ref.rollout.tensor_model_parallel_size"
THROUGHPUT = "throughput_tokens_per_s_per_gpu"
SHORT = {
    TP: "tp",
    "actor_rollout_ref.rollout.gpu_memory_utilization": "gmu",
    "actor_rollout_ref.rollout.max_num_batched_tokens": "mnbt",
    "actor_rollout_ref.rollout.engine_kwargs.sglang.chunked_prefill_size": "chunk",
    "actor_rollout_ref.rollout.max_num_seqs": "mns",
    "actor_rollout_ref.rollout.enforce_eager": "eager",
    "actor_rollout_ref.actor.use_dynamic_bsz": "dyn",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "ppo_mb",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "lp_mb",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": "ref_mb",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": "ppo_tok",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": "lp_tok",
    "actor_rollout_ref.model.enable_gradient_checkpointing": "ckpt",
    "actor_rollout_ref.actor.fsdp_config.param_offload": "p_off",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": "o_off",
}
DYNAMIC_ONLY = {"ppo_tok", "lp_tok"}
STATIC_ONLY = {"ppo_mb", "lp_mb", "ref_mb"}


RANK_LAG = 1.2  # train_rank_imbalance above which a multi-GPU trial's ranks are listed
SLOW_START = 2.0  # engine start-ups this many times the job's median are listed


def knobs(config: dict[str, Any]) -> str:
    short = {SHORT[k]: v for k, v in config.items() if k in SHORT}
    drop = STATIC_ONLY if short.get("dyn") else DYNAMIC_ONLY
    parts = []
    for name, value in short.items():
        if name in drop:
            continue
        if isinstance(value, bool):
            if value:
                parts.append(name)
            continue
        parts.append(f"{name} {value}")
    return ", ".join(parts)


def fmt(value: float | None, digits: int = 1) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def gpus(trial: dict[str, Any]) -> int:
    """The GPUs a trial held: as recorded, else its TP size."""
    return int(trial.get("gpus") or trial["config"].get(TP, 1))


# Where a trial that ran to the end spent its wall time, in the order it spent it: the
# metrics that time each part (``trials.runner``); the rest is the interpreter's start,
# the first weight sync and sleep, and what lies between the parts.
TRIAL_PARTS = {
    "actor build": "actor_ready_at_s",
    "train probe": "train_probe_s",
    "engine start-up": "engine_startup_s",
    "measured step": "step_time_s",
    "engine shutdown": "engine_shutdown_s",
}


def gpu_time_parts(trials: list[dict[str, Any]]) -> dict[str, float] | None:
    """A job's GPU-seconds by part: each part of the trials that ran to the end
    (``TRIAL_PARTS``, x their GPUs), the rest of their wall time, and the trials that did
    not (out of memory, failed, cut off). None where a trial's parts outlast its wall time:
    trials measured before 2026-11-24 projected their step from sampled micro-batches."""
    parts = dict.fromkeys([*TRIAL_PARTS, "the rest", "trials that did not finish"], 0.0)
    for t in trials:
        n = gpus(t)
        held = (t["wall_s"] or 0.0) * n
        if t["status"] != "ok":
            parts["trials that did not finish"] += held
            continue
        metrics = t.get("metrics") or {}
        # a trial that took over another's rollout spent none of its engine's phases itself
        adopted = (
            sum((t.get("phase_timings_s") or {}).get(p, 0.0) for p in ENGINE_PHASES)
            if "rollout_reused_from_trial" in metrics
            else 0.0
        )
        timed = 0.0
        for part, metric in TRIAL_PARTS.items():
            own = float(metrics.get(metric, 0.0)) - (adopted if metric == "step_time_s" else 0.0)
            spent = own * n
            parts[part] += spent
            timed += spent
        if timed > held:
            return None
        parts["the rest"] += held - timed
    return parts


def gpu_time_line(trials: list[dict[str, Any]]) -> str:
    """``gpu_time_parts`` as shares of the job's GPU-seconds."""
    parts = gpu_time_parts(trials)
    if parts is None:
        return (
            "GPU time by part: not shown (these trials timed sampled micro-batches and projected "
            "the step from them, so a step outlasts its trial)."
        )
    total = sum(parts.values())
    if not total:
        return ""
    shares = ", ".join(f"{part} {100 * spent / total:.0f}%" for part, spent in parts.items() if spent)
    return f"GPU time by part: {shares}."


def trials_per_hour(job: dict[str, Any], measured: int) -> float | None:
    if not job.get("started_at") or not job.get("finished_at"):
        return None
    span = (
        datetime.fromisoformat(job["finished_at"]) - datetime.fromisoformat(job["started_at"])
    ).total_seconds()
    return measured / span * 3600 if span > 0 else None


def runs_by_trial(trials: list[dict[str, Any]]) -> dict[int, list[float]]:
    """Each ok trial's throughputs: its own and its re-measurements' (a failed re-run: 0)."""
    out = {
        t["number"]: [t["metrics"][THROUGHPUT]]
        for t in trials
        if t["status"] == "ok" and t.get("repeat_of") is None
    }
    for t in trials:
        if t.get("repeat_of") in out and t["status"] in ("ok", "oom", "error", "timeout"):
            out[t["repeat_of"]].append(t["metrics"].get(THROUGHPUT, 0.0) if t["status"] == "ok" else 0.0)
    return out


def noise_line(summary: dict[str, Any]) -> str:
    """The job's noise as its summary recorded it; older results recorded none."""
    if summary.get("noise_pct") is not None:
        return (
            f"Noise: {summary['noise_pct']:.1f}% (the baselines' spread over {summary.get('noise_runs')} "
            f"runs, pooled); tie band {summary['tie_band_pct']:.1f}%."
        )
    return "Noise: not measured (no baseline ran twice): a gap between single runs is no claim."


def versus_baseline(summary: dict[str, Any], b: dict[str, Any]) -> str:
    """The best trial against baseline ``b``: a ratio outside the noise, a tie inside it."""
    best, gain = summary.get("best_throughput"), b.get("gain_of_best")
    if not gain or not best:
        return ""
    verdict, band = b.get("verdict"), b.get("tie_band_pct")
    if verdict is None or band is None or summary.get("noise_pct") is None:
        return f"; best {best:.0f} is {gain:.2f}x (single runs, noise not measured: no claim)"
    if verdict == Verdict.TIE:
        return f"; best {best:.0f} ties it ({gain:.2f}x, inside the {band:.1f}% tie band)"
    return f"; best {best:.0f} is {gain:.2f}x (outside the {band:.1f}% tie band)"


def report(doc: dict[str, Any]) -> str:
    out = [f"Command: `{doc['command']}`", ""]
    for job in doc["jobs"]:
        out += job_report(job)
    return "\n".join(out)


def gpu_seconds_to(trials: list[dict[str, Any]], number: int) -> float:
    """What a job had spent when trial ``number``'s first run ended: runs are numbered as
    they start, so the GPU-seconds of that trial and every earlier one."""
    return sum((t["wall_s"] or 0.0) * gpus(t) for t in trials if t["number"] <= number)


def first_tied(trials: list[dict[str, Any]], summary: dict[str, Any], proposed: bool = False) -> int | None:
    """The earliest trial whose median is inside the tie band of the winner's (the job's band
    or either one's spread: ``autotuner.summary.first_tied``, on the data file's runs); None
    where the data file names no winner or no band. ``proposed``: the earliest of the
    search's own configs, verl's baselines left out (None if the winner is one and none ties it)."""
    best, band = summary.get("best"), summary.get("tie_band_pct")
    runs = runs_by_trial(trials)
    if best not in runs or band is None:
        return None
    baselines = {t["number"] for t in trials if t.get("baseline")} if proposed else set()
    top = statistics.median(runs[best])
    for number in sorted(runs.keys() - baselines):
        spreads = (s for s in (spread_pct(runs[best]), spread_pct(runs[number])) if s is not None)
        if statistics.median(runs[number]) >= top * (1.0 - max([band, *spreads]) / 100.0):
            return number
    return None if best in baselines else best


def job_report(job: dict[str, Any]) -> list[str]:
    trials = job["trials"]
    summary = job["summary"]
    devices = sorted({t["device"] for t in trials if t["device"]})
    counts = Counter(t["status"] for t in trials)
    gpu_s = sum((t["wall_s"] or 0.0) * gpus(t) for t in trials)
    best = summary.get("best")
    to_best = gpu_seconds_to(trials, best) if best is not None else 0.0
    tied, found = first_tied(trials, summary), first_tied(trials, summary, proposed=True)
    tie = (
        f"; trial {tied}, inside its tie band, after {gpu_seconds_to(trials, tied):.0f}"
        if tied is not None and tied != best
        else ""
    )
    if found is not None and found not in (tied, best):
        band = "it" if tie else "its tie band"
        tie += f"; trial {found}, the search's first inside {band}, after {gpu_seconds_to(trials, found):.0f}"
    measured = sum(counts[s] for s in ("ok", "oom", "error", "timeout"))
    rate = trials_per_hour(job, measured)
    lines = [
        f"### {job['name']} ({', '.join(devices) or 'no device'})",
        "",
        f"{len(trials)} trials: "
        + ", ".join(f"{n} {s}" for s, n in counts.most_common())
        + f"; {gpu_s:.0f} GPU-seconds in all"
        + (
            f" (the winner, trial {best}, found after {to_best:.0f}, {100 * to_best / gpu_s:.0f}%{tie})"
            if best is not None and gpu_s
            else ""
        )
        + (f"; {rate:.1f} measured trials per hour" if rate else "")
        + f"; stopped: {summary.get('stop_reason')}.",
        "",
        gpu_time_line(trials),
        "",
        noise_line(summary),
        "",
        "| trial | tok/s/GPU (median) | n | spread % | step s | rollout s | old-logp s | ref s | "
        "update s | reload s | peak GiB | GPUs | trial wall s | knobs |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    runs = runs_by_trial(trials)
    ok = sorted(
        (t for t in trials if t["number"] in runs), key=lambda t: -statistics.median(runs[t["number"]])
    )
    for t in ok:
        m, p = t["metrics"], t["phase_timings_s"]
        name = f"{t['number']}" + (f" ({t['baseline']})" if t["baseline"] else "")
        values = runs[t["number"]]
        lines.append(
            f"| {name} | {statistics.median(values):.0f} | {len(values)} | {fmt(spread_pct(values))} | "
            f"{fmt(m.get('step_time_s'))} | "
            f"{fmt(p.get('rollout'))} | {fmt(p.get('old_log_prob'))} | {fmt(p.get('ref_log_prob'))} | "
            f"{fmt(p.get('update_actor'))} | {fmt(p.get('actor_reload'))} | "
            f"{fmt(m.get('peak_memory_gib'))} | {gpus(t)} | "
            f"{t['wall_s']:.0f} | {knobs(t['config'])} |"
        )
    lines += ["", "Best against the baselines (step throughput, tokens/s/GPU, median of n runs):", ""]
    for name, b in (summary.get("baselines") or {}).items():
        value = b.get(THROUGHPUT)
        spread = f", spread {b['spread_pct']:.1f}%" if b.get("spread_pct") is not None else ""
        lines.append(
            f"- {name} (trial {b['trial']}, {b['status']}): {fmt(value, 0) if value else 'no measurement'}"
            + (f" (n={b.get('runs', 1)}{spread})" if value else "")
            + versus_baseline(summary, b)
        )
    lines += verl_lines(job)
    per_tp: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for t in trials:
        if t["status"] in ("ok", "oom", "error", "timeout"):
            per_tp[int(t["config"].get(TP, 1))].append(t)
    if len(per_tp) > 1:
        lines += ["", "Per rollout TP size (best step throughput, tokens/s/GPU):", ""]
        for tp, group in sorted(per_tp.items()):
            fits = [t for t in group if t["status"] == "ok"]
            top = max(fits, key=lambda t: t["values"][0], default=None)
            lines.append(
                f"- TP {tp}: {len(group)} trials, {len(fits)} ok"
                + (f"; best {top['values'][0]:.0f} (trial {top['number']})" if top else "")
            )
    lagging = [t for t in trials if (t.get("metrics") or {}).get("train_rank_imbalance", 1.0) > RANK_LAG]
    if lagging:
        lines += [
            "",
            f"Ranks out of step (slowest rank's train time over the fastest's above "
            f"{RANK_LAG}: the trial's step time is its slowest rank's):",
            "",
        ]
        lines += [f"- trial {t['number']}: {t['metrics']['train_rank_imbalance']:.2f}x" for t in lagging]
    lines += slow_starts(trials)
    ooms = [t for t in trials if t["status"] == "oom"]
    by_phase: dict[str, list[float]] = defaultdict(list)
    for t in ooms:
        by_phase[oom_place(t)].append((t["wall_s"] or 0.0) * gpus(t))
    oom_s = sum(map(sum, by_phase.values()))
    lines += ["", f"Out of memory: {len(ooms)} trials, {oom_s:.0f} GPU-seconds.", ""]
    for where, walls in sorted(by_phase.items(), key=lambda kv: -len(kv[1])):
        lines.append(
            f"- {where}: {len(walls)} trial(s), {sum(walls):.0f} GPU-s "
            f"({min(walls):.0f}-{max(walls):.0f} s each)"
        )
    lines.append("")
    return lines


def verl_lines(job: dict[str, Any]) -> list[str]:
    """The trials the job ran in verl itself: verl's median with its runs, steps and spread,
    the trial's error per phase; then who picked the winner and, where verl did, the winner
    against verl's defaults and the other verified trials inside verl's noise."""
    verified = job.get("verl") or {}
    if not verified:
        return []
    baselines = {t["number"]: t["baseline"] for t in job["trials"]}
    lines = ["", "In verl itself (each config's runs in verl's trainer, `budget.verify_in_verl`):", ""]
    for key, v in sorted(verified.items(), key=lambda kv: int(kv[0])):
        number = int(key)
        name = f"trial {number}" + (f" ({baselines[number]})" if baselines.get(number) else "")
        if v.get("throughput_median") is None:
            lines.append(f"- {name}: not measured in verl ({v['status']}): {v.get('error') or ''}")
            continue
        errors = errors_phrase(v)
        lines.append(
            f"- {name}: {v['throughput_median']:.0f} tok/s/GPU ({runs_phrase(v)}); "
            f"the trial off by: {errors or 'n/a'}"
        )
    summary = JobSummary(**job["summary"])
    lines += ["", f"Winner picked by {summary.winner_source}."]
    said = summary.verl_gain_line()
    if said:
        lines[-1] += f" {said[0].upper()}{said[1:]}."
    return lines


def slow_starts(trials: list[dict[str, Any]]) -> list[str]:
    """Trials whose engine took over ``SLOW_START`` times the job's median to start, with the
    engine's own timing lines from their logs (``timing_lines``, where recorded)."""
    starts = {
        t["number"]: t["metrics"]["engine_startup_s"]
        for t in trials
        if (t.get("metrics") or {}).get("engine_startup_s")
    }
    if len(starts) < 2:
        return []
    median = statistics.median(starts.values())
    slow = [t for t in trials if starts.get(t["number"], 0.0) > SLOW_START * median]
    if not slow:
        return []
    lines = ["", f"Slow engine start-ups (over {SLOW_START:g}x the job's median of {median:.0f} s):", ""]
    for t in slow:
        lines.append(f"- trial {t['number']}: {starts[t['number']]:.0f} s, {knobs(t['config'])}")
        timed = t.get("timing_lines") or []
        lines += [f"    {line}" for line in timed] or ["    (no timing lines recorded)"]
    return lines


def oom_place(trial: dict[str, Any]) -> str:
    """Where a trial ran out of memory: its phase, and for ``startup`` and the train
    sub-phases, which part (the actor's build, the engine's start, the train probe)."""
    m, phase = trial["metrics"], trial["phase"]
    if phase == "startup":
        if "actor_ready_at_s" not in m:
            return "startup: building the actor"
        said = f"{trial.get('error_message') or ''} {trial.get('error_cause') or ''}"
        if "less than desired" in said:  # vLLM's own check (vllm/v1/worker/utils.py)
            return "startup: the engine refused gpu_memory_utilization beside the actor"
        if "warming up sampler" in said:
            return "startup: the engine's sampler warm-up (max_num_seqs dummy requests)"
        if trial.get("error_cause") or "engine's log:" in said:
            return "startup: the engine, after accepting its budget"
        return "startup: the engine's start (its log's cause not recorded)"
    if "engine_start_at_s" not in m and "actor_ready_at_s" in m:
        return f"{phase} (train probe, before the engine started)"
    if phase == "weight_sync":  # the engine woken and the actor's weights written into it
        return f"{phase} (waking the engine before the rollout)"
    if phase == "rollout":
        return f"{phase} (the rollout)"
    return f"{phase} (after the rollout)"


def compare(docs: list[dict[str, Any]]) -> str:
    """The jobs of ``docs`` side by side, by rollout engine (see the module docstring)."""
    jobs = [job for doc in docs for job in doc["jobs"]]
    lines = [
        "| engine | job | device | measured: ok / oom / other | GPU-s | best tok/s/GPU (trial) | "
        "verl defaults | production | best / defaults | against the defaults | fastest rollout, "
        "generated tok/s (trial) | median engine start-up s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for job in jobs:
        trials, summary = job["trials"], job["summary"]
        measured = [t for t in trials if t["status"] in ("ok", "oom", "error", "timeout")]
        counts = Counter(t["status"] for t in measured)
        ok = [t for t in measured if t["status"] == "ok"]
        fastest = max(ok, key=lambda t: t["metrics"].get("rollout_generated_tokens_per_s", 0), default=None)
        base = summary.get("baselines") or {}
        defaults = (base.get("verl-v0.9-defaults") or {}).get("throughput_tokens_per_s_per_gpu")
        production = (base.get("production") or {}).get("throughput_tokens_per_s_per_gpu")
        best = summary.get("best_throughput")
        startups = sorted(
            t["metrics"]["engine_startup_s"] for t in measured if "engine_startup_s" in t["metrics"]
        )
        other = len(measured) - counts["ok"] - counts["oom"]
        lines.append(
            f"| {engine_of(job)} | {job['name']} | {summary.get('device') or ''} | "
            f"{counts['ok']} / {counts['oom']} / {other} | "
            f"{sum((t['wall_s'] or 0.0) * gpus(t) for t in trials):.0f} | "
            f"{fmt(best, 0)} ({summary.get('best')}) | {fmt(defaults, 0)} | {fmt(production, 0)} | "
            f"{fmt(best / defaults if best and defaults else None, 2)} | "
            f"{versus_defaults(summary)} | "
            + (
                f"{fastest['metrics']['rollout_generated_tokens_per_s']:.0f} ({fastest['number']})"
                if fastest
                else ""
            )
            + f" | {fmt(startups[len(startups) // 2] if startups else None)} |"
        )
    lines += [
        "",
        "The same configs on each engine (the baselines):",
        "",
        "| baseline | engine | status | tok/s/GPU | step s | rollout s | generated tok/s | "
        "KV cache tokens | preemptions | start-up s | sleep s | wake s | peak GiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in sorted({t["baseline"] for job in jobs for t in job["trials"] if t["baseline"]}):
        for job in jobs:
            t = next((t for t in job["trials"] if t["baseline"] == name and t.get("repeat_of") is None), None)
            if t is None:
                continue
            m, p = t["metrics"], t["phase_timings_s"]
            lines.append(
                f"| {name} | {engine_of(job)} | {t['status']} | "
                f"{fmt(m.get('throughput_tokens_per_s_per_gpu'), 0)} | {fmt(m.get('step_time_s'))} | "
                f"{fmt(p.get('rollout'))} | {fmt(m.get('rollout_generated_tokens_per_s'), 0)} | "
                f"{fmt(m.get('kv_cache_tokens'), 0)} | {fmt(m.get('rollout_preemptions'), 0)} | "
                f"{fmt(m.get('engine_startup_s'))} | {fmt(m.get('engine_sleep_s'))} | "
                f"{fmt(m.get('engine_wake_s'))} | {fmt(m.get('peak_memory_gib'))} |"
            )
    return "\n".join(lines)


def versus_defaults(summary: dict[str, Any]) -> str:
    """The best against verl's defaults in words: faster, slower, tie, or no claim."""
    b = (summary.get("baselines") or {}).get("verl-v0.9-defaults") or {}
    if not b.get("gain_of_best"):
        return ""
    if b.get("verdict") is None or summary.get("noise_pct") is None:
        return "no claim (single runs)"
    return str(b["verdict"])


def engine_of(job: dict[str, Any]) -> str:
    return str(job["spec"].get("workload", {}).get("engine", "vllm"))


def main(args: list[str]) -> None:
    if args[:1] == ["--compare"]:
        docs = []
        for path in args[1:]:
            with open(path) as f:
                docs.append(json.load(f))
        print(compare(docs))
        return
    for path in args:
        with open(path) as f:
            print(f"## {path}\n")
            print(report(json.load(f)))


if __name__ == "__main__":
    main(sys.argv[1:])
