"""The measured figures of the project's documents, generated from the data files they come from.

usage: python -m benchmarks.claims            # rewrite the documents' generated parts
       python -m benchmarks.claims --check    # exit 1, naming the document and parts that differ
       python -m benchmarks.claims --sources  # every generated line with its document(s) and data file(s)

The documents are ``DOCUMENTS``: the top README.md, benchmarks/README.md and
benchmarks/search/README.md. A generated part sits between ``<!-- claims:NAME -->`` and
``<!-- /claims:NAME -->`` in any of them (the same part may sit in several); the text outside
the markers is written by hand and kept as it is, and carries no measured figure. Each part is
one function below that returns its lines, each line with the data files (and trials) its
figures come from, paths under benchmarks/; ``CLAIMS`` lists them. A new figure is one more
function and one more row of ``CLAIMS``, then its markers in a document and a run of this script.

Comparisons follow ``autotuner.noise``: a difference inside the noise is a tie, and a gap
between single runs of a job that measured no noise is no claim. Figures measured before the
packed-sequence layout (2026-11-24: trials without ``use_remove_padding``) are marked obsolete.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

from autotuner.noise import Verdict, compare, spread_pct
from benchmarks.gpu import report

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
README = HERE / "README.md"
# The documents whose generated parts this script writes; a part may sit in any of them.
DOCUMENTS = (ROOT / "README.md", README, HERE / "search" / "README.md")
THROUGHPUT = "throughput_tokens_per_s_per_gpu"
PACKED = "actor_rollout_ref.model.use_remove_padding"
PACKED_SINCE = "2026-11-24"
MEASURED = ("ok", "oom", "error", "timeout")
DEFAULTS = "verl-v0.9-defaults"
MARK = re.compile(r"(<!-- claims:(?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /claims:(?P=name) -->)", re.S)


@dataclass(frozen=True)
class Line:
    """One generated line and where its figures come from (paths under benchmarks/, with
    ``#N`` for trial N)."""

    text: str
    sources: tuple[str, ...] = ()


class Claim(NamedTuple):
    name: str
    build: Callable[[], list[Line]]


# ----------------------------------------------------------------------------- data


@cache
def load(rel: str) -> dict[str, Any]:
    """A data file under benchmarks/, parsed."""
    return json.loads((HERE / rel).read_text())


def job_of(rel: str) -> dict[str, Any]:
    """The one job of a ``dump_results`` file."""
    (job,) = load(rel)["jobs"]
    return job


def trial(rel: str, number: int) -> dict[str, Any]:
    return next(t for t in job_of(rel)["trials"] if t["number"] == number)


def baseline(rel: str, name: str) -> dict[str, Any] | None:
    """A job's first run of the baseline ``name``."""
    trials = job_of(rel)["trials"]
    return next((t for t in trials if t["baseline"] == name and t.get("repeat_of") is None), None)


def runs(rel: str, number: int) -> list[float]:
    """Trial ``number``'s throughputs: its own run and its re-measurements."""
    return report.runs_by_trial(job_of(rel)["trials"]).get(number, [])


def src(rel: str, *numbers: int) -> tuple[str, ...]:
    return tuple(f"{rel}#{n}" for n in numbers) or (rel,)


def obsolete(rel: str) -> bool:
    """Whether the job's trials predate the packed-sequence layout."""
    return not any(t["config"].get(PACKED) for t in job_of(rel)["trials"])


def obsolete_line(*rels: str) -> list[Line]:
    if not any(obsolete(rel) for rel in rels):
        return []
    return [
        Line(
            f"*Obsolete: measured before the packed-sequence layout ({PACKED_SINCE}); "
            "kept as measured, not a prediction of verl.*",
            rels,
        ),
        Line(""),
    ]


def measured(rel: str) -> list[dict[str, Any]]:
    return [t for t in job_of(rel)["trials"] if t["status"] in MEASURED and t.get("repeat_of") is None]


def median_runs(values: list[float]) -> str:
    """``6952 (n=1)`` or ``6952 (n=3, spread 2.1%)``."""
    if not values:
        return "-"
    spread = spread_pct(values)
    tail = f", spread {spread:.1f}%" if spread is not None else ""
    return f"{statistics.median(values):.0f} (n={len(values)}{tail})"


def f1(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def table(header: list[str], rows: Sequence[tuple[list[str], tuple[str, ...]]]) -> list[Line]:
    """A Markdown table, each row with its sources (the header with all of them)."""
    every = tuple(dict.fromkeys(source for _, sources in rows for source in sources))
    out = [Line("| " + " | ".join(header) + " |", every), Line("|" + "---|" * len(header))]
    out += [Line("| " + " | ".join(cells) + " |", sources) for cells, sources in rows]
    return out


def generated_from(*rels: str) -> Line:
    files = ", ".join(f"`{rel}`" for rel in rels)
    return Line(f"Generated by `python -m benchmarks.claims` from {files}.", rels)


def versus_single_runs(a: float, b: float, band_pct: float | None) -> str:
    """Two single-run figures: a tie or a gap within a measured band, else no claim."""
    ratio = a / b if b else float("inf")
    if band_pct is None:
        return f"{ratio:.3f}x, single runs: no claim"
    verdict = compare(a, b, band_pct)
    word = "a tie" if verdict is Verdict.TIE else str(verdict)
    return f"{ratio:.3f}x, {word} within the {band_pct:.1f}% run-to-run spread"


# ----------------------------------------------------------------------------- parts

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
LANDSCAPE = "search/landscapes/qwen2.5-1.5b-h200.json"


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


SEARCH = "search/results/qwen2.5-1.5b-h200.json"
STRATEGIES = {"grid": "grid (shuffled)", "random": "random", "tpe": "Optuna TPE", "nsga2": "Optuna NSGA-II"}


def search_compare() -> list[Line]:
    """The search strategies on the H200 landscape, median [min-max] over the seeds."""
    doc = load(SEARCH)
    rows = []
    for key, s in doc["strategies"].items():
        to97, early = s["gpu_s_to_97pct"], s["best_at_25pct_cost_pct"]
        rows.append(
            (
                [
                    STRATEGIES.get(key, key),
                    f"{s['gpu_s_to_97pct_median']:.0f} [{min(to97):.0f}-{max(to97):.0f}]",
                    f"{s['best_at_25pct_cost_pct_median']:.0f}% [{min(early):.0f}-{max(early):.0f}]",
                    f"{s['gpu_s_total_median']:.0f}",
                ],
                (f"{SEARCH}#strategies.{key}",),
            )
        )
    grid = doc["landscape"]["grid_cost_s"]
    ours = doc["strategies"]["ours"]["gpu_s_to_97pct_median"]
    header = [
        "strategy",
        "GPU-s to 97% of the best",
        "best found at 25% of the grid's cost",
        "GPU-s in all",
    ]
    stale = (
        []
        if packed_landscape(LANDSCAPE)
        else [
            Line(
                f"*Obsolete: the landscape was measured before the packed-sequence layout ({PACKED_SINCE}); "
                "kept as measured.*",
                (LANDSCAPE,),
            ),
            Line(""),
        ]
    )
    return (
        stale
        + [Line(f"`{doc['command']}`, {doc['seeds']} seeds, median [min-max]:", (SEARCH,)), Line("")]
        + table(header, rows)
        + [
            Line(""),
            Line(
                f"Ours reaches 97% of the best in {100 * ours / grid:.0f}% of the grid's GPU-seconds "
                "(median).",
                (SEARCH,),
            ),
            Line(""),
            generated_from(SEARCH),
        ]
    )


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


# ----------------------------------------------------------------------------- the top README

JOB_7B = "results/qwen2-7b-grpo-8gpu-h200.json"
DYNAMIC = "actor_rollout_ref.actor.use_dynamic_bsz"
MICRO_BATCH = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"


def packed_job_top() -> list[Line]:
    """The packed-layout job in the top README: verl's two baselines and the first proposal."""
    job = job_of(PACKED_JOB)
    example, defaults = baseline(PACKED_JOB, "verl-v0.9-example"), baseline(PACKED_JOB, DEFAULTS)
    first = next(t for t in measured(PACKED_JOB) if not t["baseline"] and t["status"] == "ok")
    if example is None or defaults is None:
        return []
    a, b = first["metrics"][THROUGHPUT], example["metrics"][THROUGHPUT]
    timeout = job["spec"]["budget"]["trial_timeout_s"]
    did = (
        f"did not finish one step within the {timeout:g} s trial deadline ({defaults['status']} in "
        f"{defaults['phase']})"
        if defaults["status"] != "ok"
        else f"ran at {defaults['metrics'][THROUGHPUT]:.0f} (one run)"
    )
    layout = (
        "dynamic batches"
        if defaults["config"].get(DYNAMIC)
        else f"static micro-batches of {defaults['config'].get(MICRO_BATCH)}"
    )
    return [
        Line(
            f"Measured on one {first['device']} on {job['started_at'][:10]} with packed micro-batches, "
            "flash-attention and the weight sync (`benchmarks/README.md`, data in "
            f"`benchmarks/{PACKED_JOB}`): for Qwen2.5-1.5B, verl's example command's knobs ran at "
            f"{b:.0f} tokens/s/GPU (one run); verl's defaults ({layout}) {did}; the tuner's first "
            f"proposal reached {a:.0f} (one run): {versus_single_runs(a, b, None)}.",
            src(PACKED_JOB, example["number"], defaults["number"], first["number"]),
        )
    ]


def padded_figures() -> list[Line]:
    """What the top README says of the figures measured before the packed layout."""
    b = baseline(JOB_7B, DEFAULTS)
    ok = [t for t in measured(JOB_7B) if t["status"] == "ok"]
    if b is None or b["status"] != "ok" or not ok or not obsolete(JOB_7B):
        return []
    top = max(ok, key=lambda t: t["metrics"][THROUGHPUT])
    a = top["metrics"][THROUGHPUT]
    return [
        Line(
            f"Figures measured before {PACKED_SINCE} (the Qwen2-7B job's best config against verl's "
            f"defaults, {versus_single_runs(a, b['metrics'][THROUGHPUT], None)}; the rollout TP "
            "comparison) used padded micro-batches, SDPA and sampled micro-batch "
            "timing, and are kept in `benchmarks/README.md` as such.",
            src(JOB_7B, top["number"], b["number"]),
        )
    ]


PROBE_BEFORE = f"{PROBE}/before-fix"


def first_pass_slowdown() -> list[Line]:
    """How much slower the first train pass was than the second with cuDNN attention on (each
    engine's environment, before any engine started)."""
    ratios: dict[str, list[float]] = {}
    rels = []
    for path in sorted((HERE / PROBE_BEFORE).glob("*.json")):
        if path.stem.endswith("-spec"):
            continue
        rel = f"{PROBE_BEFORE}/{path.name}"
        first, second = load(rel)["stages"]["no_engine"][:2]
        rels.append(f"{rel}#stages.no_engine")
        for phase in ("old_log_prob", "ref_log_prob", "update_actor"):
            ratios.setdefault(phase, []).append(second["tokens_per_s"][phase] / first["tokens_per_s"][phase])
    slow = ratios["old_log_prob"] + ratios["update_actor"]
    return [
        Line(
            f"On an H200, with it on, the first train pass's old-log-prob and update ran "
            f"{span(slow, '.1f')}x slower than the second (the reference pass, which reuses the "
            f"old-log-prob pass's shapes, {span(ratios['ref_log_prob'], '.1f')}x), in each engine's "
            f"environment before any engine started (`benchmarks/{PROBE_BEFORE}/`).",
            tuple(rels),
        )
    ]


def engines_top() -> list[Line]:
    """vLLM against SGLang on the same job: equal configs, KV cache at equal gmu, best found."""
    v0, s0 = baseline(TWIN, DEFAULTS), baseline(SGLANG, DEFAULTS)
    if not engine_pairs() or v0 is None or s0 is None:
        return []
    return obsolete_line(TWIN, SGLANG) + [engines_equal_configs(), engines_kv_cache(v0, s0), engines_best(s0)]


def engines_equal_configs() -> Line:
    band = defaults_spread_pct()
    pairs = [(v, s) for _, v, s in engine_pairs()]
    ratios = [v["metrics"][THROUGHPUT] / s["metrics"][THROUGHPUT] for v, s in pairs]
    verdicts = {compare(v["metrics"][THROUGHPUT], s["metrics"][THROUGHPUT], band or 0.0) for v, s in pairs}
    word = "all ties" if verdicts == {Verdict.TIE} else "not all ties"
    rollout = [s["phase_timings_s"]["rollout"] - v["phase_timings_s"]["rollout"] for v, s in pairs]
    return Line(
        f"- At equal configs (the {len(pairs)} baselines both jobs ran, one run each), vLLM / SGLang is "
        f"{span(ratios, '.3f')}x, {word} within the {f1(band)}% run-to-run spread of verl's defaults; "
        f"SGLang's rollout took {span(rollout, '.1f')} s longer.",
        tuple(x for v, s in pairs for x in src(TWIN, v["number"]) + src(SGLANG, s["number"]))
        + tuple(DEFAULTS_RUNS),
    )


def engines_kv_cache(v0: dict[str, Any], s0: dict[str, Any]) -> Line:
    """The KV cache each engine gets from verl's defaults' gmu."""
    kv_v, kv_s = v0["metrics"]["kv_cache_tokens"], s0["metrics"]["kv_cache_tokens"]
    gmu = v0["config"]["actor_rollout_ref.rollout.gpu_memory_utilization"]
    return Line(
        f"- At gmu {gmu:g} (verl's defaults), SGLang's `mem_fraction_static` leaves "
        f"{100 * (1 - kv_s / kv_v):.0f}% fewer KV-cache tokens ({kv_s / 1e6:.2f}M against "
        f"{kv_v / 1e6:.2f}M).",
        src(TWIN, v0["number"]) + src(SGLANG, s0["number"]),
    )


def engines_best(s0: dict[str, Any]) -> Line:
    """SGLang's best against its defaults, and vLLM's best (the landscape's) against it."""
    band = defaults_spread_pct()
    top_s = max((t for t in measured(SGLANG) if t["status"] == "ok"), key=lambda t: t["metrics"][THROUGHPUT])
    best_s, defaults_s = top_s["metrics"][THROUGHPUT], s0["metrics"][THROUGHPUT]
    top_v, top_i = landscape_best(LANDSCAPE)
    return Line(
        f"- SGLang's best found is {best_s:.0f} tok/s/GPU (trial {top_s['number']}, one run); against "
        f"its verl defaults' {defaults_s:.0f}: {versus_single_runs(best_s, defaults_s, band)}. vLLM's "
        f"best on the same workload, from the H200 landscape and so from another run, is {top_v:.0f}; "
        f"against SGLang's best: {versus_single_runs(top_v, best_s, band)}.",
        src(SGLANG, top_s["number"], s0["number"]) + (f"{LANDSCAPE}#points.{top_i}",) + tuple(DEFAULTS_RUNS),
    )


def verl_compare_top() -> list[Line]:
    """What verl measured, for the top README: the runs, and verl's verdict on the configs."""
    doc = load(VERL_COMPARE)
    configs = sorted(
        {r["config"] for run in ("run_a", "run_b") for r in doc[run]["runs"] if r["kind"] == "verl"}
    )
    steps = {len(r["steps"]) for c in configs for r in verl_runs(c, "verl")}
    warmups = {r.get("warmup_steps", 1) for c in configs for r in verl_runs(c, "verl")}
    versions = {r["versions"]["verl"] for c in configs for r in verl_runs(c, "verl") if r.get("versions")}
    return [
        Line(
            f"On {doc['date']} it ran verl {', '.join(sorted(versions))}'s trainer for "
            f"{'/'.join(map(str, sorted(steps)))} steps ({'/'.join(map(str, sorted(warmups)))} of them a "
            f"warm-up) of the Qwen2.5-1.5B job for {len(configs)} configs ({doc['device']}), beside the "
            "tuner's trials of the same configs (`benchmarks/gpu/verl_compare.py`; the table of "
            "predicted against verl-measured throughput and phase times is in `benchmarks/README.md`, "
            f"data in `benchmarks/{VERL_COMPARE}`).",
            (VERL_COMPARE,),
        ),
        Line(""),
        verl_compare_headline()[0],
    ]


LOAD = "load/results/load-vm.json"


def load_test() -> list[Line]:
    """The service under concurrent clients (``load/run.py``)."""
    doc = load(LOAD)
    m, jobs = doc["machine"], doc["jobs"]
    return [
        Line(
            f"The service's load on a {m['cpu_count']}-core VM ({m['cpu']}; database: {doc['database']}; "
            f"{doc['date'][:10]}): {doc['clients']} clients submitting and polling for "
            f"{doc['duration_s']:.0f} s sent {doc['requests']} requests ({doc['requests_per_s']:.0f}/s) "
            f"with {doc['errors']} errors, and {doc['lost_jobs']} of the {jobs['submitted']} jobs they "
            f"submitted were lost (`benchmarks/load/README.md`, data in `benchmarks/{LOAD}`).",
            (LOAD,),
        )
    ]


# ----------------------------------------------------------------------------- search/README.md

CPU_LANDSCAPE = "search/landscapes/cpu-train-mid.json"
CPU_SEARCH = "search/results/cpu-train-mid.json"
PLAIN = ("grid", "random", "tpe", "nsga2")


def span(values: list[float], spec: str) -> str:
    """``4.2-6.2``, or ``1.0`` where the values round alike."""
    lo, hi = format(min(values), spec), format(max(values), spec)
    return lo if lo == hi else f"{lo}-{hi}"


def times(counts: list[int]) -> str:
    words = {1: "once", 2: "twice"}
    return " or ".join(words.get(n, f"{n} times") for n in counts)


def landscape_best(rel: str) -> tuple[float, int]:
    """The landscape's best first-run throughput and its point's index."""
    points = load(rel)["points"]
    return max(
        (run["metrics"][THROUGHPUT], i)
        for i, point in enumerate(points)
        for run in point["runs"][:1]
        if run["status"] == "ok"
    )


def point_value(point: dict[str, Any]) -> float:
    """A config's true value as ``search/compare.py`` scores it: the median of its runs, a
    failed run counting as 0."""
    return statistics.median(
        (run["metrics"].get(THROUGHPUT) or 0.0) if run["status"] == "ok" else 0.0 for run in point["runs"]
    )


def next_best_pct(rel: str) -> float:
    """The landscape's second-best config as a percentage of its best."""
    values = sorted((point_value(p) for p in load(rel)["points"]), reverse=True)
    return 100 * values[1] / values[0]


def packed_landscape(rel: str) -> bool:
    """Whether the landscape was measured with the packed-sequence layout."""
    return any(p["config"].get(PACKED) for p in load(rel)["points"])


def landscape_facts(rel: str) -> list[Line]:
    """What a landscape file holds: when and where it was recorded, its configs and runs."""
    doc = load(rel)
    points = doc["points"]
    runs = [run for point in points for run in point["runs"]]
    statuses = {s: sum(run["status"] == s for run in runs) for s in dict.fromkeys(r["status"] for r in runs)}
    repeats = sorted({len(point["runs"]) for point in points})
    fit = sum(point_value(point) > 0 for point in points)
    walls = [run["wall_s"] for run in runs if run["status"] == "ok"]
    top_value, top_i = max((point_value(p), i) for i, p in enumerate(points))
    cap = f", under a {doc['memory_cap_gib']:g} GiB allocation cap" if doc["device"] == "cpu" else ""
    return [
        Line(
            f"Recorded {doc['recorded_at'][:10]} on {', '.join(doc['measured_on'])}{cap}: "
            f"{len(points)} configs, each run {times(repeats)}; {fit} fit, {len(points) - fit} did not "
            f"({', '.join(f'{n} runs {s}' for s, n in statuses.items())}). A run that fit took "
            f"{statistics.median(walls):.0f} s in the median ({span(walls, '.0f')} s, start-up included).",
            (rel,),
        ),
        Line(
            f"Best: {top_value:.1f} tok/s/GPU ({report.knobs(points[top_i]['config'])}); the next best is "
            f"{next_best_pct(rel):.1f}% of it.",
            (f"{rel}#points.{top_i}",),
        ),
    ]


def compare_table(rel: str) -> list[Line]:
    """A stored comparison as ``search/compare.py`` prints it."""
    from benchmarks.search.compare import table as printed  # optuna and the study loop: import on use

    return [Line("```"), *(Line(text, (rel,)) for text in printed(load(rel)).splitlines()), Line("```")]


def search_shows(rel: str, landscape: str) -> list[Line]:
    """Ours against the plain strategies on one stored comparison."""
    doc = load(rel)
    s = doc["strategies"]
    ours = s["ours"]
    plain = {k: s[k]["gpu_s_to_97pct_median"] for k in PLAIN if k in s}
    lo, hi = min(plain.values()), max(plain.values())
    median = ours["gpu_s_to_97pct_median"]
    place = (
        "below every plain strategy's median"
        if median < lo
        else "above every plain strategy's median"
        if median > hi
        else "within the plain strategies' medians"
    )
    missed = ours["seeds"] - ours["reached_97pct"]
    stops = "; ".join(ours["stop_reasons"])
    grid = doc["landscape"]["grid_cost_s"]
    return [
        Line(
            f"Over {doc['seeds']} seeds ours needs {median:.0f} GPU-s to 97% of the best in the median "
            f"seed that reached it ({100 * median / grid:.0f}% of the full grid's {grid:.0f}), "
            f"{place}: {', '.join(f'{STRATEGIES[k]} {v:.0f}' for k, v in plain.items())}. "
            + (
                f"In {missed} of {ours['seeds']} seeds it ended before reaching 97% (the seeds' stop "
                f"reasons: {stops}). "
                if missed
                else "Every seed reached it. "
            )
            + f"It skipped a median of {ours['skipped_median']:g} proposals (predicted or inferred not to "
            f"fit, at no cost) and ran {ours['runs_median']:g} trials.",
            (rel, landscape),
        )
    ]


def search_cpu_shows() -> list[Line]:
    return search_shows(CPU_SEARCH, CPU_LANDSCAPE)


def search_h200_shows() -> list[Line]:
    return search_shows(SEARCH, LANDSCAPE)


def search_h200_headline() -> list[Line]:
    """The H200 landscape's result in a sentence, for the top README."""
    doc = load(SEARCH)
    ls, ours = doc["landscape"], doc["strategies"]["ours"]
    median, grid = ours["gpu_s_to_97pct_median"], ls["grid_cost_s"]
    plain = ", ".join(
        f"{STRATEGIES[k]}: {doc['strategies'][k]['gpu_s_to_97pct_median']:.0f}"
        for k in PLAIN
        if k in doc["strategies"]
    )
    to97 = [x for x in ours["gpu_s_to_97pct"] if x is not None]
    when = (
        ""
        if packed_landscape(LANDSCAPE)
        else f", measured before the packed-sequence layout of {PACKED_SINCE}"
    )
    return [
        Line(
            f"On a real H200 landscape of {ls['configs']} configs (`benchmarks/{LANDSCAPE}`, "
            f"{ls['feasible_configs']} feasible{when}) the tuner reached 97% of the best config in a "
            f"median {median:.0f} GPU-seconds over {doc['seeds']} seeds ({span(to97, '.0f')}), "
            f"{100 * median / grid:.0f}% of the grid's {grid:.0f} ({plain}). Only the best config is "
            f"within 97% of the best (the next is {next_best_pct(LANDSCAPE):.1f}%), so reaching 97% is "
            "finding the best.",
            (SEARCH, LANDSCAPE),
        )
    ]


CLAIMS: list[Claim] = [
    Claim("defaults-spread", defaults_spread),
    Claim("defaults-run-to-run", defaults_run_to_run),
    Claim("packed-job-software", packed_job_software),
    Claim("packed-job", packed_job),
    Claim("packed-job-headline", packed_job_headline),
    Claim("layout", layout),
    Claim("report-1.5b", job_report("results/qwen2.5-1.5b-grpo-h200.json")),
    Claim("report-7b-8gpu", job_report("results/qwen2-7b-grpo-8gpu-h200.json")),
    Claim("report-7b-1gpu", job_report("results/qwen2-7b-grpo-1gpu-h200.json")),
    Claim("report-memmodel", job_report("results/qwen2.5-1.5b-grpo-memmodel-h200.json")),
    Claim("tp-hosts", tp_hosts),
    Claim("engine-train-probe-before-fix", engine_train_probe("before-fix")),
    Claim("engine-train-probe-after-fix", engine_train_probe("after-fix")),
    Claim("search-compare", search_compare),
    Claim("tp-sweep-before-fix", tp_sweep(SWEEP_BEFORE)),
    Claim("tp-sweep", tp_sweep(SWEEP)),
    Claim("tp-sweep-headline", tp_sweep_headline),
    Claim("trials-per-hour", trials_per_hour),
    Claim("engines-same-configs", engines_same_configs),
    Claim("engines-headline", engines_headline),
    Claim("verl-compare", verl_compare),
    Claim("verl-compare-headline", verl_compare_headline),
    # README.md
    Claim("search-h200-headline", search_h200_headline),
    Claim("packed-job-top", packed_job_top),
    Claim("padded-figures", padded_figures),
    Claim("first-pass-slowdown", first_pass_slowdown),
    Claim("engines-top", engines_top),
    Claim("verl-compare-top", verl_compare_top),
    Claim("load-test", load_test),
    # search/README.md
    Claim("search-cpu-landscape", lambda: landscape_facts(CPU_LANDSCAPE)),
    Claim("search-cpu-compare", lambda: compare_table(CPU_SEARCH)),
    Claim("search-cpu-shows", search_cpu_shows),
    Claim("search-h200-landscape", lambda: landscape_facts(LANDSCAPE)),
    Claim("search-h200-compare", lambda: compare_table(SEARCH)),
    Claim("search-h200-shows", search_h200_shows),
]


# ----------------------------------------------------------------------------- the documents


def generate() -> dict[str, list[Line]]:
    return {claim.name: claim.build() for claim in CLAIMS}


def render(text: str, parts: dict[str, list[Line]] | None = None) -> str:
    """``text`` with each generated part's body replaced by its lines."""
    parts = parts if parts is not None else generate()

    def body(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in parts:
            raise KeyError(f"part {name!r} is not in benchmarks.claims.CLAIMS")
        return match.group(1) + "".join(line.text + "\n" for line in parts[name]) + match.group(4)

    return MARK.sub(body, text)


def quoted(text: str) -> list[str]:
    """The names of the generated parts ``text`` has markers for."""
    return [m["name"] for m in MARK.finditer(text)]


def differing(text: str, parts: dict[str, list[Line]] | None = None) -> list[str]:
    """The generated parts of ``text`` that differ from the script's output."""
    have = {m["name"]: m["body"] for m in MARK.finditer(text)}
    fresh = {m["name"]: m["body"] for m in MARK.finditer(render(text, parts))}
    return [name for name in have if have[name] != fresh[name]]


def unquoted(texts: list[str]) -> list[str]:
    """The parts of ``CLAIMS`` that none of ``texts`` has markers for."""
    names = {name for text in texts for name in quoted(text)}
    return [claim.name for claim in CLAIMS if claim.name not in names]


def name_of(document: Path) -> str:
    return str(document.relative_to(ROOT))


def stale(texts: dict[Path, str], parts: dict[str, list[Line]] | None = None) -> list[str]:
    """One line per document whose generated parts differ from the script's output, naming
    them, and one naming the parts no document quotes; empty when all is current."""
    parts = parts if parts is not None else generate()
    out = [
        f"{name_of(doc)} differs from `python -m benchmarks.claims` in: {', '.join(names)}"
        for doc, text in texts.items()
        if (names := differing(text, parts))
    ]
    missing = unquoted(list(texts.values()))
    return out + ([f"no document quotes: {', '.join(missing)}"] if missing else [])


def sources(texts: dict[Path, str], parts: dict[str, list[Line]] | None = None) -> list[str]:
    """Every generated line with a source, the documents that quote it and its data files."""
    parts = parts if parts is not None else generate()
    where = {name: [name_of(doc) for doc, text in texts.items() if name in quoted(text)] for name in parts}
    return [
        f"{', '.join(where[name]) or '(no document)'}: {name}: {line.text}\n    <- {', '.join(line.sources)}"
        for name, lines in parts.items()
        for line in lines
        if line.sources
    ]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a document differs")
    parser.add_argument("--sources", action="store_true", help="print each line's data files")
    args = parser.parse_args(argv)
    texts = {doc: doc.read_text() for doc in DOCUMENTS}
    parts = generate()
    if args.sources:
        print("\n".join(sources(texts, parts)))
        return 0
    if args.check:
        problems = stale(texts, parts)
        print("\n".join(problems), end="\n" if problems else "")
        return 1 if problems else 0
    for doc, text in texts.items():
        doc.write_text(render(text, parts))
        print(f"wrote {name_of(doc)} ({len(quoted(text))} generated parts)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
