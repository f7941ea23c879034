"""Parts about the GPU jobs and runs of benchmarks/README.md (``results/``): the jobs' trials,
the noise between runs, the layouts, the engines, the TP sweeps and verl's own runs."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from typing import Any

from autotuner.noise import Verdict, compare, spread_pct
from benchmarks.claims.data import (
    DEFAULTS,
    HERE,
    THROUGHPUT,
    Line,
    baseline,
    f1,
    generated_from,
    job_of,
    load,
    measured,
    median_runs,
    obsolete_line,
    runs,
    src,
    table,
    versus_single_runs,
)
from benchmarks.claims.search import (
    LANDSCAPE,
    landscape_best,
)
from benchmarks.gpu import report

PACKED_JOB = "results/qwen2.5-1.5b-grpo-packed-h200.json"


def packed_job() -> list[Line]:
    """The 2026-11-24 Qwen2.5-1.5B job: its trials and the phases of their step."""
    job = job_of(PACKED_JOB)
    timeout = job["spec"]["budget"]["trial_timeout_s"]
    rows = []
    for t in job_of(PACKED_JOB)["trials"]:
        if t.get("repeat_of") is not None:
            continue
        p, m = t["phase_timings_s"], t["metrics"]
        who = t["baseline"] or "the sampler's"
        ok = t["status"] == "ok"
        rows.append(
            (
                [
                    str(t["number"]),
                    f"{who}: {report.knobs(t['config'])}",
                    median_runs(runs(PACKED_JOB, t["number"])) if ok else t["status"],
                    f1(m.get("step_time_s")) if ok else f">{timeout:g}",
                    f1(p.get("rollout")),
                    f1(p.get("old_log_prob")),
                    f1(p.get("ref_log_prob")),
                    f1(p.get("update_actor")) if ok else f"not finished by {timeout:g} s",
                ],
                src(PACKED_JOB, t["number"]),
            )
        )
    header = ["trial", "config", "tok/s/GPU", "step s", "rollout s", "old-logp s", "ref s", "update s"]
    return table(header, rows) + [Line(""), generated_from(PACKED_JOB)]


def packed_job_software() -> list[Line]:
    """What measured the job (each trial's ``software``), its weight syncs, and the memory
    model's error on its trials (the job summary's ``memory_model_errors``)."""
    trials = measured(PACKED_JOB)
    versions = sorted({json.dumps(t["software"], sort_keys=True) for t in trials if t["software"]})
    out = [
        Line("- " + ", ".join(f"{k} {v}" for k, v in json.loads(v).items()), (PACKED_JOB,)) for v in versions
    ]
    for t in trials:
        m = t["metrics"]
        if "weight_sync_s" in m:
            out.append(
                Line(
                    f"- Trial {t['number']}: weight sync {m['weight_sync_s']:.2f} s for "
                    f"{m['weight_sync_bytes'] / 1e9:.2f} GB in {m['weight_sync_buckets']:.0f} buckets.",
                    src(PACKED_JOB, t["number"]),
                )
            )
    errors = job_of(PACKED_JOB)["summary"]["memory_model_errors"]
    phases = ", ".join(
        f"{phase} {e['mean_abs_error_pct']:.1f}% ({e['trials']} trials)"
        for phase, e in errors.items()
        if e.get("mean_abs_error_pct") is not None
    )
    out.append(Line(f"- The memory model's mean error on the peaks, per phase: {phases}.", (PACKED_JOB,)))
    return out


def packed_job_headline() -> list[Line]:
    """The sampler's first proposal against verl's example, in the same job."""
    example = baseline(PACKED_JOB, "verl-v0.9-example")
    first = next(t for t in measured(PACKED_JOB) if not t["baseline"] and t["status"] == "ok")
    if example is None:
        return []
    a, b = first["metrics"][THROUGHPUT], example["metrics"][THROUGHPUT]
    pa, pb = first["phase_timings_s"]["update_actor"], example["phase_timings_s"]["update_actor"]
    return [
        Line(
            f"- The sampler's first proposal (trial {first['number']}, {a:.0f} tok/s/GPU) against "
            f"verl's example (trial {example['number']}, {b:.0f}): {versus_single_runs(a, b, None)}. "
            f"Its update took {pa:.1f} s against {pb:.1f} s.",
            src(PACKED_JOB, first["number"], example["number"]),
        )
    ]


LAYOUT = "results/layout-h200.json"


def layout() -> list[Line]:
    """Train-only trials in verl's layouts (``gpu/layout_bench.py``), three runs each."""
    doc = load(LAYOUT)
    rows = []
    for name, row in doc["rows"].items():
        # The run's own summary: median and spread over all n runs (``missing`` says which
        # runs the file does not list one by one).
        figure = f"{row['median']:.0f} (n={row['n']}, spread {row['spread_pct']:.1f}%)"
        rows.append(
            (
                [name, figure, f"{row['activations_gib_median']:.1f}"],
                (f"{LAYOUT}#rows.{name}",),
            )
        )
    header = ["layout", "update tokens/s (median of n)", "activations GiB (median)"]
    device = Line(f"{doc['date']}, {doc['device']}: `{doc['command']}`.", (LAYOUT,))
    return [device, Line("")] + table(header, rows) + [Line(""), generated_from(LAYOUT)]


# verl's defaults on the Qwen2.5-1.5B GRPO-like job with vLLM, one run in each of these jobs.
DEFAULTS_RUNS = [
    "results/qwen2.5-1.5b-grpo-h200.json",
    "results/qwen2.5-1.5b-grpo-memmodel-h200.json",
    "results/qwen2.5-1.5b-grpo-vllm-twin-h200.json",
]


def defaults_spread_pct() -> float | None:
    """The run-to-run spread of verl's defaults over ``DEFAULTS_RUNS`` (vLLM, H200)."""
    values = [t["metrics"][THROUGHPUT] for rel in DEFAULTS_RUNS if (t := baseline(rel, DEFAULTS))]
    return spread_pct(values)


def defaults_spread() -> list[Line]:
    return [Line(f"{f1(defaults_spread_pct())}%", tuple(DEFAULTS_RUNS))]


def defaults_run_to_run() -> list[Line]:
    """verl's defaults measured once in each of several jobs: the noise between runs."""
    out = []
    values = []
    for rel in DEFAULTS_RUNS:
        t = baseline(rel, DEFAULTS)
        if t is None or t["status"] != "ok":
            continue
        values.append(t["metrics"][THROUGHPUT])
        out.append(
            Line(f"- `{rel}` (trial {t['number']}): {values[-1]:.0f} tok/s/GPU", src(rel, t["number"]))
        )
    spread = spread_pct(values)
    out.append(
        Line(
            f"- Spread (max - min over the median) over these {len(values)} runs: {f1(spread)}%. "
            "This is the band used below to compare single runs of different configs.",
            tuple(DEFAULTS_RUNS),
        )
    )
    return out


def job_report(rel: str) -> Callable[[], list[Line]]:
    """The GPU report of one job file (``gpu/report.py``), every line from that file."""

    def build() -> list[Line]:
        lines = obsolete_line(rel) + [Line(f"Command: `{load(rel)['command']}`", (rel,)), Line("")]
        lines += [Line(text, (rel,) if text else ()) for text in report.job_report(job_of(rel))]
        while lines and not lines[-1].text:
            lines.pop()
        return lines + [Line(""), generated_from(rel)]

    return build


PROBE = "results/engine-train-probe-h200"
PROBE_STAGES = {
    "no_engine": "no engine",
    "engine_asleep": "engine asleep",
    "children_stopped": "engine's processes stopped",
    "engine_gone": "engine shut down",
}


def engine_train_probe(folder: str) -> Callable[[], list[Line]]:
    """Train tokens/s in one trial-like process per engine (``gpu/engine_train_probe.py``),
    per stage; a stage run twice shows both passes (first / second)."""

    def build() -> list[Line]:
        rows = []
        files = sorted(p for p in (HERE / PROBE / folder).glob("*.json") if not p.stem.endswith("-spec"))
        for path in files:
            rel = f"{PROBE}/{folder}/{path.name}"
            stages = load(rel)["stages"]
            for stage, label in PROBE_STAGES.items():
                passes = stages.get(stage) or []
                cells = [path.stem, label]
                for phase in ("old_log_prob", "ref_log_prob", "update_actor"):
                    cells.append(" / ".join(f"{p['tokens_per_s'][phase]:,}" for p in passes))
                rows.append((cells, (f"{rel}#stages.{stage}",)))
        header = ["engine", "stage", "old-logp", "ref", "update"]
        return table(header, rows) + [Line(""), generated_from(f"{PROBE}/{folder}/*.json")]

    return build


TP = report.TP
SWEEP = "results/qwen2-7b-grpo-8gpu-tp-sweep-4gpus-fixed-h200.json"
SWEEP_BEFORE = "results/qwen2-7b-grpo-8gpu-tp-sweep-4gpus-h200.json"


def tp_sweep(rel: str) -> Callable[[], list[Line]]:
    """The TP sweep of the Qwen2-7B job (train knobs fixed): one row per TP size."""

    def build() -> list[Line]:
        rows = []
        for t in sorted(measured(rel), key=lambda t: t["config"][TP]):
            m, p = t["metrics"], t["phase_timings_s"]
            tp = f"{t['config'][TP]}" + (" (verl's defaults)" if t["baseline"] == DEFAULTS else "")
            rows.append(
                (
                    [
                        tp,
                        median_runs(runs(rel, t["number"])) if t["status"] == "ok" else t["status"],
                        f1(m.get("step_time_s")),
                        f1(p.get("rollout")),
                        f1(p.get("old_log_prob")),
                        f1(p.get("ref_log_prob")),
                        f1(p.get("update_actor")),
                        f"{m['train_rank_imbalance']:.2f}x" if "train_rank_imbalance" in m else "",
                        f"{m['engine_startup_s']:.0f}" if "engine_startup_s" in m else "",
                    ],
                    src(rel, t["number"]),
                )
            )
        header = [
            "TP",
            "tok/s/GPU",
            "step s",
            "rollout s",
            "old-logp s",
            "ref s",
            "update s",
            "ranks out of step",
            "engine start-up s",
        ]
        return obsolete_line(rel) + table(header, rows) + [Line(""), generated_from(rel)]

    return build


def tp_sweep_headline() -> list[Line]:
    """TP 1 against TP 2 in the sweep, by step time (their step tokens differ)."""
    by_tp = {t["config"][TP]: t for t in measured(SWEEP) if t["status"] == "ok"}
    if 1 not in by_tp or 2 not in by_tp:
        return []
    one, two = by_tp[1]["metrics"]["step_time_s"], by_tp[2]["metrics"]["step_time_s"]
    band = defaults_spread_pct()
    return [
        Line(
            f"- Step time, TP 1 against TP 2: {one:.1f} s and {two:.1f} s, {100 * (one - two) / two:+.1f}%; "
            f"in throughput {versus_single_runs(1 / one, 1 / two, band)} of verl's defaults.",
            src(SWEEP, by_tp[1]["number"], by_tp[2]["number"]) + tuple(DEFAULTS_RUNS),
        )
    ]


RATE_RUNS = [
    ("one GPU per trial, TP 1", "results/qwen2-7b-grpo-8gpu-h200.json"),
    ("TP 1/2/4 on 2 GPUs", "results/qwen2-7b-grpo-8gpu-tp-2gpus-h200.json"),
    ("TP 1/2/4 on 4 GPUs", "results/qwen2-7b-grpo-8gpu-tp-4gpus-h200.json"),
    ("TP sweep on 4 GPUs", SWEEP),
]


def trials_per_hour() -> list[Line]:
    """Measured trials per hour of wall-clock time and per GPU-hour, each from its own file."""
    rows = []
    for label, rel in RATE_RUNS:
        trials = measured(rel)
        gpu_s = sum((t["wall_s"] or 0.0) * report.gpus(t) for t in job_of(rel)["trials"])
        per_wall = report.trials_per_hour(job_of(rel), len(trials))
        rows.append(
            (
                [
                    f"{label} (`{rel}`)",
                    str(len(trials)),
                    f"{gpu_s:.0f}",
                    f1(per_wall) if per_wall else "not recorded (no start and end times)",
                    f1(len(trials) / gpu_s * 3600) if gpu_s else "",
                    f1(sum(t["status"] == "ok" for t in trials) / gpu_s * 3600) if gpu_s else "",
                ],
                (rel,),
            )
        )
    header = ["run", "measured trials", "GPU-s", "per wall-clock hour", "per GPU-hour", "ok per GPU-hour"]
    return table(header, rows) + [Line(""), generated_from(*(rel for _, rel in RATE_RUNS))]


def tp_hosts() -> list[Line]:
    """The Qwen2-7B jobs with TP searched, per host, against the one-GPU-per-trial job."""
    rows = []
    for label, rel in RATE_RUNS[:3]:
        trials = measured(rel)
        every = job_of(rel)["trials"]
        ok = [t for t in trials if t["status"] == "ok"]
        best = max(ok, key=lambda t: t["metrics"][THROUGHPUT])
        tp2 = [t["metrics"][THROUGHPUT] for t in ok if t["config"][TP] == 2]
        cells = [
            f"{label} (`{rel}`)",
            " / ".join(
                str(sum(t["status"] == s for t in every if t.get("repeat_of") is None))
                for s in ("ok", "oom", "timeout", "predicted_oom")
            ),
            f"{best['metrics'][THROUGHPUT]:.0f} ({best['number']}, TP {best['config'][TP]})",
            f"{max(tp2):.0f}" if tp2 else "-",
        ]
        for name in (DEFAULTS, "production"):
            b = baseline(rel, name)
            cells.append(
                "-"
                if b is None
                else f"{b['metrics'][THROUGHPUT]:.0f} (TP {b['config'][TP]})"
                if b["status"] == "ok"
                else f"{b['status']} (TP {b['config'][TP]})"
            )
        rows.append((cells, (rel,)))
    header = [
        "run",
        "ok / oom / timeout / predicted OOM",
        "best tok/s/GPU (trial, TP)",
        "best at TP 2",
        "verl's defaults",
        "production",
    ]
    return (
        obsolete_line(*(rel for _, rel in RATE_RUNS[:3]))
        + table(header, rows)
        + [
            Line(""),
            generated_from(*(rel for _, rel in RATE_RUNS[:3])),
        ]
    )


TWIN = "results/qwen2.5-1.5b-grpo-vllm-twin-h200.json"
SGLANG = "results/qwen2.5-1.5b-grpo-sglang-fixed-h200.json"


def engine_pairs() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """The baselines both engine jobs measured ok: (name, vLLM's trial, SGLang's trial)."""
    pairs = []
    for name in (t["baseline"] for t in measured(TWIN) if t["baseline"]):
        v, s = baseline(TWIN, name), baseline(SGLANG, name)
        if v is not None and s is not None and v["status"] == s["status"] == "ok":
            pairs.append((name, v, s))
    return pairs


def engines_same_configs() -> list[Line]:
    """The baselines both engine jobs measured, side by side."""
    rows = []
    band = defaults_spread_pct()
    for name, v, s in engine_pairs():
        a, b = v["metrics"][THROUGHPUT], s["metrics"][THROUGHPUT]
        rows.append(
            (
                [
                    f"{name}: {report.knobs(v['config'])}",
                    median_runs(runs(TWIN, v["number"])),
                    median_runs(runs(SGLANG, s["number"])),
                    versus_single_runs(a, b, band),
                    f"{v['phase_timings_s']['rollout']:.1f} / {s['phase_timings_s']['rollout']:.1f}",
                    " / ".join(
                        f"{t['metrics']['rollout_generated_tokens_per_s'] / 1e3:.1f}k" for t in (v, s)
                    ),
                    " / ".join(f"{t['metrics']['kv_cache_tokens'] / 1e6:.2f}M" for t in (v, s)),
                ],
                src(TWIN, v["number"]) + src(SGLANG, s["number"]) + tuple(DEFAULTS_RUNS),
            )
        )
    header = [
        "config",
        "vLLM tok/s/GPU",
        "SGLang tok/s/GPU",
        "vLLM / SGLang",
        "rollout s (vLLM / SGLang)",
        "generated tok/s (vLLM / SGLang)",
        "KV-cache tokens (vLLM / SGLang)",
    ]
    return obsolete_line(TWIN, SGLANG) + table(header, rows) + [Line(""), generated_from(TWIN, SGLANG)]


def startups(rel: str) -> list[float]:
    return [t["metrics"]["engine_startup_s"] for t in measured(rel) if "engine_startup_s" in t["metrics"]]


def engines_headline() -> list[Line]:
    """Engine start-up medians, and each engine's best on the workload."""
    vs, ss = startups(TWIN), startups(SGLANG)
    top_v, top_i = landscape_best(LANDSCAPE)
    sg = [t for t in measured(SGLANG) if t["status"] == "ok"]
    top_s = max(sg, key=lambda t: t["metrics"][THROUGHPUT])
    band = defaults_spread_pct()
    return [
        Line(
            f"- Engine start-up, median over the measured trials: vLLM {statistics.median(vs):.1f} s "
            f"({len(vs)} trials), SGLang {statistics.median(ss):.1f} s ({len(ss)} trials).",
            (TWIN, SGLANG),
        ),
        Line(
            f"- Best against best: vLLM's landscape best {top_v:.0f} tok/s/GPU (config {top_i} of "
            f"`{LANDSCAPE}`) against SGLang's best found, {top_s['metrics'][THROUGHPUT]:.0f} "
            f"(trial {top_s['number']}): {versus_single_runs(top_v, top_s['metrics'][THROUGHPUT], band)} "
            "of verl's defaults, measured in different runs.",
            (f"{LANDSCAPE}#points.{top_i}",) + src(SGLANG, top_s["number"]) + tuple(DEFAULTS_RUNS),
        ),
    ]


VERL_COMPARE = "results/verl-qwen2.5-1.5b-h200.json"
# The trial's phase each of verl's timings corresponds to (benchmarks/gpu/verl_compare.py).
VERL_PHASES = (
    ("rollout", "timing_s/gen"),
    ("old_log_prob", "timing_s/old_log_prob"),
    ("ref_log_prob", "timing_s/ref"),
    ("update_actor", "timing_s/update_actor"),
)


def verl_runs(config: str, kind: str, run: str = "run_b") -> list[dict[str, Any]]:
    """The ok runs of ``config`` of one kind (``trial``/``verl``); verl's defaults ran in
    ``run_a`` only."""
    doc = load(VERL_COMPARE)
    found = [
        r for r in doc[run]["runs"] if r["config"] == config and r["kind"] == kind and r["status"] == "ok"
    ]
    if not found and kind == "verl" and run == "run_b":
        return verl_runs(config, kind, "run_a")
    return found


def verl_steps(config: str) -> list[dict[str, float]]:
    """verl's measured steps of ``config`` (after each run's warm-up)."""
    return [s for r in verl_runs(config, "verl") for s in r["steps"][r.get("warmup_steps", 1) :]]


def pct(predicted: float | None, measured: float | None) -> str:
    if not predicted or not measured:
        return "-"
    return f"{100 * (predicted / measured - 1):+.0f}%"


def verl_compare() -> list[Line]:
    """Trial against verl itself, per config: step throughput and the phases' times."""
    rows = []
    for config in ("defaults", "example", "winner"):
        (trial_run,) = verl_runs(config, "trial")
        steps = verl_steps(config)
        throughputs = [s["perf/throughput"] for s in steps]
        verl_median = statistics.median(throughputs)
        cells = [
            config,
            f"{trial_run['throughput']:.0f}",
            median_runs(throughputs),
            pct(trial_run["throughput"], verl_median),
        ]
        for phase, key in VERL_PHASES:
            t = trial_run["phase_timings_s"].get(phase)
            v = statistics.median(s[key] for s in steps)
            cells.append(f"{t:.1f} / {v:.1f} ({pct(t, v)})")
        rows.append((cells, (VERL_COMPARE,)))
    header = ["config", "trial tok/s/GPU", "verl tok/s/GPU (median of steps)", "trial error"]
    header += [f"{phase} s, trial / verl" for phase, _ in VERL_PHASES]
    return [generated_from(VERL_COMPARE), Line(""), *table(header, rows)]


def verl_compare_headline() -> list[Line]:
    """What verl measured, and whether the trial ranks the configs as verl does."""
    medians = {
        c: statistics.median(s["perf/throughput"] for s in verl_steps(c))
        for c in ("defaults", "example", "winner")
    }
    spreads = [spread_pct([s["perf/throughput"] for s in verl_steps(c)]) or 0.0 for c in medians]
    band = max(spreads)
    trial = {c: verl_runs(c, "trial")[0]["throughput"] for c in medians}
    verdict = compare(medians["winner"], medians["example"], band)
    word = "ties" if verdict is Verdict.TIE else f"is {verdict} than"
    verl_order = sorted(medians, key=lambda c: -medians[c])
    trial_order = sorted(trial, key=lambda c: -trial[c])
    before = next(r for r in load(VERL_COMPARE)["run_a_first_try"]["runs"] if r["kind"] == "trial")
    return [
        Line(
            f"In verl, the winner {word} verl's example ({medians['winner']:.0f} against "
            f"{medians['example']:.0f} tokens/s/GPU, inside the {band:.1f}% step-to-step spread), "
            f"and both are {medians['winner'] / medians['defaults']:.2f}x and "
            f"{medians['example'] / medians['defaults']:.2f}x verl's defaults ({medians['defaults']:.0f}).",
            (VERL_COMPARE,),
        ),
        Line(""),
        Line(
            f"The trial's order is {', '.join(trial_order)}; verl's is {', '.join(verl_order)} "
            f"({'the same' if trial_order == verl_order else 'not the same'}). The trial over-predicts "
            f"every config ({', '.join(f'{c} {pct(trial[c], medians[c])}' for c in medians)}), "
            "most where it under-predicts verl's log-prob passes.",
            (VERL_COMPARE,),
        ),
        Line(""),
        Line(
            f"Before the trial offloaded the reference model as verl does, its ref pass of verl's "
            f"defaults took {before['phase_timings_s']['ref_log_prob']:.1f} s and its step "
            f"{before['throughput']:.0f} tokens/s/GPU (run_a_first_try).",
            (VERL_COMPARE,),
        ),
    ]
