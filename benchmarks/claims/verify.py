"""Parts of the READMEs from a tuning job that verified its trials in verl
(``budget.verify_in_verl``; ``tests/autotuner/test_gpu_verification.py`` run by
``benchmarks/gpu/gpu-tests.sh``): each verified trial beside verl's run of its config."""

from __future__ import annotations

from collections.abc import Callable

from autotuner.noise import spread_pct
from autotuner.summary import JobSummary
from benchmarks.claims.data import Line, f1, generated_from, job_of, load, table

GPU_VERIFY = "results/gpu-verify-qwen2.5-0.5b-h100.json"
# The same test job, every verl step on the trials' batch (``VerlRunSpec.repeat_batch``).
GPU_VERIFY_SAME_BATCH = "results/gpu-verify-qwen2.5-0.5b-h100-same-batch.json"
# The trial's error per phase against verl's, as ``autotuner.verl_results.prediction_error_pct``
# names them, and the column each gets.
PHASES = {
    "rollout": "rollout",
    "old_log_prob": "old-logp",
    "ref_log_prob": "ref",
    "update_actor": "update",
    "weight_sync": "weight sync",
    "step": "step",
    "throughput": "throughput",
}


def _signed(value: float | None) -> str:
    return "" if value is None else f"{value:+.1f}%"


def _steps(rel: str) -> list[Line]:
    """verl's measured steps of each run (after its warm-up): throughput, the rollout's
    seconds and the step's tokens, and their spread, where the file keeps them."""
    runs = job_of(rel).get("verl_runs")
    if not runs:
        return []
    lines = [Line(""), Line("verl's measured steps, run by run (after the warm-up):"), Line("")]
    for run in runs:
        measured = run["steps"][run["warmup_steps"] :]
        rates = [s["perf/throughput"] for s in measured]
        gens = ", ".join(f"{s['timing_s/gen']:.2f}" for s in measured)
        tokens = sorted({int(s["perf/total_num_tokens"]) for s in measured})
        lines.append(
            Line(
                f"- trial {run['trial']}, round {run['round']}: "
                f"{', '.join(f1(r) for r in rates)} tok/s/GPU (spread {spread_pct(rates) or 0:.1f}%); "
                f"rollout (`timing_s/gen`) {gens} s; {', '.join(map(str, tokens))} tokens a step",
                (f"{rel}#{run['trial']}",),
            )
        )
    return lines


def verify_in_verl(rel: str) -> Callable[[], list[Line]]:
    """One row per verified trial of the dump ``rel``: its config's name, the trial's
    throughput, verl's median (with its runs), and the trial's error per phase against verl;
    then the winner, verl's steps where the file keeps them, the software and the command."""

    def build() -> list[Line]:
        job = job_of(rel)
        trials = {t["number"]: t for t in job["trials"] if t.get("repeat_of") is None}
        rows = []
        for key, verdict in sorted(job["verl"].items(), key=lambda kv: int(kv[0])):
            number = int(key)
            trial = trials[number]
            errors = verdict["prediction_error_pct"]
            cells = [
                f"{number} ({trial['baseline'] or 'searched'})",
                f1(trial["metrics"]["throughput_tokens_per_s_per_gpu"]),
                f"{f1(verdict['throughput_median'])} ({verdict['ok_runs']} of {verdict['runs']} runs ok)",
                *(_signed(errors.get(phase)) for phase in PHASES),
            ]
            rows.append((cells, (f"{rel}#{number}",)))
            spreads = verdict.get("phase_spread_pct") or {}
            if spreads:  # verl's own spread over its steps, against which the errors read
                steps = f"{verdict['steps']} steps" if verdict.get("steps") else ""
                cells = [f"{number}: verl's spread over its steps", "", steps]
                cells += [f"{spreads[phase]:.1f}%" if phase in spreads else "" for phase in PHASES]
                rows.append((cells, (f"{rel}#{number}",)))
        header = ["trial (config)", "trial tok/s/GPU", "verl tok/s/GPU"]
        header += [f"{label} error" for label in PHASES.values()]
        summary = job["summary"]
        best = summary["best"]
        versions = next(iter(job["verl"].values()))["versions"]
        software = trials[best]["software"]
        return (
            table(header, rows)
            + [
                Line(""),
                Line(
                    f"Winner: trial {best} ({trials[best]['baseline'] or 'searched'}), picked by "
                    f"{summary['winner_source']}. Errors are (trial - verl) / verl: a phase's time, or "
                    "the step's throughput. Under each, verl's own spread over its measured steps "
                    "((max - min) / median): an error smaller than that is inside verl's noise.",
                    (f"{rel}#{best}",),
                ),
                Line(""),
                Line(f"What the job says of it: {JobSummary(**summary).verl_gain_line()}.", (rel,)),
            ]
            + _steps(rel)
            + [
                Line(""),
                Line(
                    f"Device: {software['gpu']}, driver {software['driver']}, CUDA {software['cuda']}; "
                    f"trials: torch {software['torch']}, vLLM {software['vllm']}, transformers "
                    f"{software['transformers']}; verl {versions['verl']} with torch {versions['torch']}, "
                    f"vLLM {versions['vllm']}, transformers {versions['transformers']}.",
                    (rel,),
                ),
                Line(""),
                Line(f"Command: {load(rel)['command']}", (rel,)),
                Line(""),
                generated_from(rel),
            ]
        )

    return build
