"""Parts of the top README: its measured figures, each from the data file it names."""

from __future__ import annotations

import statistics
from typing import Any

from autotuner.noise import Verdict, compare
from benchmarks.claims.data import (
    DEFAULTS,
    HERE,
    PACKED_SINCE,
    THROUGHPUT,
    Line,
    baseline,
    f1,
    hosts_clause,
    job_of,
    load,
    measured,
    median_runs,
    obsolete,
    obsolete_line,
    runs,
    span,
    src,
    versus_single_runs,
)
from benchmarks.claims.jobs import (
    DEFAULTS_RUNS,
    PACKED_JOB,
    PROBE,
    SGLANG,
    TWIN,
    VERL_COMPARE,
    defaults_spread_pct,
    engine_pairs,
    verl_compare_headline,
    verl_runs,
)
from benchmarks.claims.search import (
    LANDSCAPE,
    landscape_best,
)
from benchmarks.gpu import report

JOB_7B = "results/qwen2-7b-grpo-8gpu-h200.json"
JOB_1P5B = "results/qwen2.5-1.5b-grpo-job-h200.json"
JOB_7B_REPLICA = "results/qwen2-7b-grpo-8gpu-job-h200.json"
JOB_7B_COMPOSED = "results/qwen2-7b-grpo-8gpu-composed-h200.json"
DYNAMIC = "actor_rollout_ref.actor.use_dynamic_bsz"
MICRO_BATCH = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"


def _job_headline(path: str, what: str, ran_on: str) -> list[Line]:
    """A finished job in the top README: its winner against verl's two baselines, each the
    median of its runs, judged against the pair's tie band; its cost, when the winner first
    ran and, where it is another trial, when the first of the search's own configs inside the
    winner's tie band did (``report.first_tied``)."""
    job = job_of(path)
    summary, trials = job["summary"], job["trials"]
    best = summary["best"]
    winner = runs(path, best)
    parts, numbers = [], [best]
    for name, entry in summary["baselines"].items():
        base = runs(path, entry["trial"])
        if not base or not winner:
            return []
        a, b = statistics.median(winner), statistics.median(base)
        band = entry["tie_band_pct"]
        verdict = compare(a, b, band)
        said = "a tie, inside" if verdict is Verdict.TIE else f"{a / b:.2f}x, {verdict} outside"
        label = "verl's defaults" if name == DEFAULTS else "verl's example command"
        parts.append(f"{label} ran at {median_runs(base)}: {said} the {band:.1f}% tie band")
        numbers.append(entry["trial"])
    oom_s = sum((t["wall_s"] or 0.0) * report.gpus(t) for t in trials if t["status"] == "oom")
    searched = sum(1 for t in measured(path) if not t["baseline"])
    tied = report.first_tied(trials, summary, proposed=True)
    found = ""
    if tied is not None and tied != best:
        found = (
            f", the search's first config inside its tie band (trial {tied}) after "
            f"{report.gpu_seconds_to(trials, tied) / 60:.0f}"
        )
        numbers.append(tied)
    return [
        Line(
            f"{what}, run on {summary['device']}s {ran_on}{hosts_clause(trials)}, finished on "
            f"{job['finished_at'][:10]} "
            f"(`benchmarks/README.md`, data in `benchmarks/{path}`): the tuner's winner, trial "
            f"{best}, ran at {median_runs(winner)} tokens/s/GPU; " + "; ".join(parts) + ". "
            f"{searched} proposals measured beside the baselines, {summary['gpu_seconds'] / 3600:.1f} "
            f"GPU-hours in all, {100 * oom_s / summary['gpu_seconds']:.1f}% of them in trials that ran "
            f"out of memory; the winner first ran after {report.gpu_seconds_to(trials, best) / 60:.0f} "
            f"GPU-minutes{found}.",
            src(path, *numbers),
        )
    ]


def job_top() -> list[Line]:
    """The Qwen2.5-1.5B job as a user runs it, in the top README."""
    return _job_headline(
        JOB_1P5B,
        "The Qwen2.5-1.5B job (`benchmarks/jobs/qwen2.5-1.5b-grpo.yaml`, 256 prompts x 8 a step)",
        "one trial per GPU",
    )


def job_7b_top() -> list[Line]:
    """The Qwen2-7B job in verl's 8-GPU layout at replica scope, in the top README."""
    return _job_headline(
        JOB_7B_REPLICA,
        "The Qwen2-7B job in verl's 8-GPU layout (`benchmarks/jobs/qwen2-7b-grpo-8gpu.yaml`, "
        "256 prompts x 8 a step; each trial one rank of the FSDP world and one rollout replica, "
        "its collectives emulated)",
        "one trial per GPU across four hosts",
    )


def job_7b_composed_top() -> list[Line]:
    """The same Qwen2-7B job run again with train sides behind a measured rollout."""
    return _job_headline(
        JOB_7B_COMPOSED,
        "The same job again, every other proposal of the sampler's training behind the fastest "
        "rollout measured so far",
        "two trials at a time on one host of two, then one at a time on hosts of one",
    )


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
