"""The GPU report's engine comparison over real result files (an H200 vLLM job, and the same
job relabelled as an SGLang one: the table's layout, not SGLang's figures, is under test)."""

from __future__ import annotations

import copy
import json
import re
import statistics
from pathlib import Path

import pytest

from benchmarks.gpu.report import compare

REPO = Path(__file__).resolve().parents[2]


def test_compare_puts_the_engines_side_by_side_and_their_baselines_together() -> None:
    vllm = json.loads((REPO / "benchmarks/results/qwen2.5-1.5b-grpo-memmodel-h200.json").read_text())
    sglang = copy.deepcopy(vllm)
    job = sglang["jobs"][0]
    job["name"], job["spec"]["workload"]["engine"] = "qwen2.5-1.5b-grpo-sglang-h200", "sglang"
    lines = compare([vllm, sglang]).splitlines()
    engines = [line.split(" | ")[0].lstrip("| ") for line in lines[2:4]]
    assert engines == ["vllm", "sglang"]
    assert "| 6770 (0) | 6770 | 6135 | 1.00 |" in lines[2]  # best, defaults, production
    baselines = [line for line in lines if line.startswith("| verl-v0.9-defaults |")]
    assert [line.split(" | ")[1] for line in baselines] == ["vllm", "sglang"]
    assert all(" | 2462928 | " in line for line in baselines)  # KV cache tokens


def test_a_multi_gpu_trial_whose_ranks_trained_out_of_step_is_listed() -> None:
    """The TP sweep of 2026-11-21 on four H200s (real data): the TP-2 trial's update took 84.9 s as
    its slowest rank saw it, about twice its fastest rank's. A result carrying the ranks'
    ratio (``train_rank_imbalance``, merged since) is listed under its own heading."""
    from benchmarks.gpu.report import report

    doc = json.loads((REPO / "benchmarks/results/qwen2-7b-grpo-8gpu-tp-sweep-4gpus-h200.json").read_text())
    assert "Ranks out of step" not in report(doc)
    tp2 = next(t for t in doc["jobs"][0]["trials"] if t["number"] == 0)
    tp2["metrics"]["train_rank_imbalance"] = 1.9
    text = report(doc)
    assert "Ranks out of step" in text and "- trial 0: 1.90x" in text


def test_an_engine_that_started_slowly_is_listed_with_its_timing_lines() -> None:
    """The TP sweep run again on 2026-11-21 on four H200s (real data): verl's defaults (TP 2)
    took 249 s to start beside another trial, against the job's median of 84 s. It is listed,
    with the engine's own timing lines where the trial kept them (recorded since)."""
    from benchmarks.gpu.report import report

    path = REPO / "benchmarks/results/qwen2-7b-grpo-8gpu-tp-sweep-4gpus-fixed-h200.json"
    doc = json.loads(path.read_text())
    text = report(doc)
    assert "Slow engine start-ups (over 2x the job's median of 84 s):" in text
    listed = [line for line in text.splitlines() if line.startswith("- trial ") and " s, " in line]
    assert len(listed) == 1 and listed[0].startswith("- trial 0: 249 s, "), listed
    assert "    (no timing lines recorded)" in text
    tp2 = next(t for t in doc["jobs"][0]["trials"] if t["number"] == 0)
    tp2["timing_lines"] = [
        "INFO 11-21 21:25:40 [core.py:403] init engine (profile, create kv cache, warmup model) took 201.30 s"
    ]
    assert "    INFO 11-21 21:25:40 [core.py:403] init engine" in report(doc)
    for t in doc["jobs"][0]["trials"]:  # the same start-ups everywhere: none is slow
        if "engine_startup_s" in (t.get("metrics") or {}):
            t["metrics"]["engine_startup_s"] = 80.0
    assert "Slow engine start-ups" not in report(doc)


def test_an_engine_start_out_of_memory_is_placed_by_its_logged_cause() -> None:
    """The 1.5B job on H200s (2026-11-27, real data): one engine refused its budget
    beside the actor (vLLM's own check), one ran out of memory warming up its sampler with
    1024 dummy requests after accepting it; a start-up failure with no cause on record says so."""
    from benchmarks.gpu.dump_results import with_cause
    from benchmarks.gpu.report import oom_place

    doc = json.loads((REPO / "benchmarks/results/qwen2.5-1.5b-grpo-job-h200.json").read_text())
    trials = {t["number"]: t for t in doc["jobs"][0]["trials"]}
    assert oom_place(trials[9]) == "startup: the engine refused gpu_memory_utilization beside the actor"
    assert oom_place(trials[3]).startswith("startup: the engine's sampler warm-up")
    untold = {k: v for k, v in trials[9].items() if k != "error_cause"}
    assert oom_place(untold) == "startup: the engine's start (its log's cause not recorded)"
    # The dump adds the cause from the trial's log, once: not where the message has it.
    log = "(EngineCore pid=7) ValueError: Free memory on device cuda:0 (1/2 GiB) on startup is less than x"
    assert with_cause(dict(untold), log)["error_cause"].startswith("ValueError: Free memory")
    told = dict(untold, error_message=f"x (the engine's log: {log[19:]})")
    assert "error_cause" not in with_cause(told, log)
    assert "error_cause" not in with_cause(trials[10], log)  # a trial that ran


def test_an_out_of_memory_waking_the_engine_is_placed_before_the_rollout() -> None:
    """The Qwen2-7B job on one H200 (2026-11-28, real data): trial 19's engine started, then
    ran out of memory waking its weights for the first rollout; trial 4's train probe ran out
    before any engine started."""
    from benchmarks.gpu.report import oom_place

    doc = json.loads((REPO / "benchmarks/results/qwen2-7b-grpo-8gpu-job-h200.json").read_text())
    trials = {t["number"]: t for t in doc["jobs"][0]["trials"]}
    assert oom_place(trials[19]) == "weight_sync (waking the engine before the rollout)"
    assert oom_place(trials[4]) == "update_actor (train probe, before the engine started)"
    assert oom_place(dict(trials[19], phase="old_log_prob")) == "old_log_prob (after the rollout)"


def test_the_report_says_what_the_job_had_spent_when_its_winner_first_ran() -> None:
    """The Qwen2.5-1.5B job of 2026-11-27 (real data, four trials at once): runs are numbered
    as they start, so what the job had spent by its winner is every run numbered up to it."""
    from benchmarks.gpu.report import gpus, report

    doc = json.loads((REPO / "benchmarks/results/qwen2.5-1.5b-grpo-job-h200.json").read_text())
    job = doc["jobs"][0]
    best = job["summary"]["best"]
    spent = [t["wall_s"] * gpus(t) for t in job["trials"]]
    to_best = sum(t["wall_s"] * gpus(t) for t in job["trials"] if t["number"] <= best)
    assert 0 < to_best < sum(spent)
    line = next(line for line in report(doc).splitlines() if "GPU-seconds in all" in line)
    assert (
        f"{sum(spent):.0f} GPU-seconds in all (the winner, trial {best}, found after {to_best:.0f}, " in line
    )


def test_the_report_splits_the_jobs_gpu_time_by_part() -> None:
    """The same job: every GPU-second falls in one part, the measured steps hold most of
    them, and a trial that took over another's rollout counts only the step it ran itself.
    A job of 2026-11-21, whose trials projected their step from sampled micro-batches, has
    no split."""
    from benchmarks.gpu.report import gpu_time_line, gpu_time_parts, gpus

    job = json.loads((REPO / "benchmarks/results/qwen2.5-1.5b-grpo-job-h200.json").read_text())["jobs"][0]
    parts = gpu_time_parts(job["trials"])
    assert parts is not None
    total = sum(t["wall_s"] * gpus(t) for t in job["trials"])
    assert sum(parts.values()) == pytest.approx(total)
    assert all(v >= 0 for v in parts.values()) and max(parts, key=parts.__getitem__) == "measured step"
    reused = [t for t in job["trials"] if "rollout_reused_from_trial" in t["metrics"] and t["status"] == "ok"]
    assert reused, "the job has trials that took over a rollout"
    whole = sum(t["metrics"]["step_time_s"] * gpus(t) for t in job["trials"] if t["status"] == "ok")
    assert parts["measured step"] < whole  # their adopted engine phases are not theirs
    shares = [float(x) for x in re.findall(r" (\d+)%", gpu_time_line(job["trials"]))]
    assert len(shares) == sum(1 for v in parts.values() if v) and abs(sum(shares) - 100) <= len(shares)
    old = json.loads((REPO / "benchmarks/results/qwen2-7b-grpo-8gpu-h200.json").read_text())["jobs"][0]
    assert gpu_time_parts(old["trials"]) is None and "not shown" in gpu_time_line(old["trials"])


def test_the_report_names_the_first_trial_inside_the_winners_tie_band() -> None:
    """The composed Qwen2-7B job (real data): verl's example (trial 1) is inside the tie band
    of the winner's median, so the report says what the job had spent once it ran."""
    from benchmarks.gpu.report import first_tied, gpu_seconds_to, report, runs_by_trial

    doc = json.loads((REPO / "benchmarks/results/qwen2-7b-grpo-8gpu-composed-h200.json").read_text())
    job = doc["jobs"][0]
    summary, trials = job["summary"], job["trials"]
    best = summary["best"]
    median = {n: statistics.median(runs) for n, runs in runs_by_trial(trials).items()}
    floor = median[best] * (1 - summary["tie_band_pct"] / 100)
    assert median[1] >= floor > median[0]
    assert first_tied(trials, summary) == 1 < best
    # verl's example is a baseline: the search's own first config inside the band is the
    # earliest proposal whose median clears the same floor.
    proposals = [n for n in sorted(median) if not next(t for t in trials if t["number"] == n)["baseline"]]
    found = next(n for n in proposals if median[n] >= floor)
    assert first_tied(trials, summary, proposed=True) == found not in (1, best)
    line = next(line for line in report(doc).splitlines() if "GPU-seconds in all" in line)
    assert f"; trial 1, inside its tie band, after {gpu_seconds_to(trials, 1):.0f};" in line, line
    assert (
        f"; trial {found}, the search's first inside it, after {gpu_seconds_to(trials, found):.0f})" in line
    ), line
    # Without a band (older data files) nothing is claimed.
    assert first_tied(trials, dict(summary, tie_band_pct=None)) is None


def test_dump_results_keeps_each_verl_run_step_by_step(tmp_path, monkeypatch) -> None:
    """From the database of the GPU verification run of 2026-12-06 16:36 UTC (every verl step
    on the trials' batch): each stored verl run comes back with every step verl logged, and the
    verdicts' medians are those steps' medians after the warm-up."""
    import shutil
    import sqlite3

    from autotuner.settings import get_settings
    from benchmarks.gpu import dump_results

    db = REPO / "benchmarks/results/logs/2026-12-06-h100-verify-in-verl-3/gpu-verify.db"
    shutil.copy(db, tmp_path / "autotuner.db")
    monkeypatch.setenv("AUTOTUNER_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("AUTOTUNER_DATABASE_URL", raising=False)
    get_settings.cache_clear()
    try:
        dump_results.main(str(tmp_path / "out.json"), ["the", "command"])
    finally:
        get_settings.cache_clear()
    (job,) = json.loads((tmp_path / "out.json").read_text())["jobs"]
    assert job["summary"]["verify_in_verl"] == 1  # budget.verify_in_verl as the job's runner resolved it
    with sqlite3.connect(db) as conn:
        stored = conn.execute("SELECT trial_number, round, result FROM verl_runs ORDER BY id").fetchall()
    assert (
        [(r["trial"], r["round"]) for r in job["verl_runs"]]
        == [(t, r) for t, r, _ in stored]
        == [(0, 0), (1, 0)]
    )
    for run, (_, _, result) in zip(job["verl_runs"], stored, strict=True):
        logged = json.loads(result)["steps"]
        assert run["status"] == "ok" and run["warmup_steps"] == 1 and len(run["steps"]) == len(logged) == 4
        assert [s["timing_s/gen"] for s in run["steps"]] == [s["timing_s/gen"] for s in logged]
        assert {s["perf/total_num_tokens"] for s in run["steps"]} == {5453.0}  # the trials' batch
        verdict = job["verl"][str(run["trial"])]
        for key in ("perf/throughput", "timing_s/gen", "timing_s/update_actor"):
            measured = [s[key] for s in run["steps"][run["warmup_steps"] :]]
            assert verdict["medians"][key] == pytest.approx(statistics.median(measured))


def test_the_report_sets_each_verl_run_beside_its_trial_and_says_who_picked() -> None:
    """The GPU verification job of 2026-12-06 16:36 UTC: both baselines ran in verl, whose two
    medians lie inside the noise of verl's own steps, so the report names a tie, not a winner
    faster in verl."""
    from benchmarks.gpu.report import job_report

    doc = json.loads((REPO / "benchmarks/results/gpu-verify-qwen2.5-0.5b-h100-same-batch.json").read_text())
    (job,) = doc["jobs"]
    lines = job_report(job)
    start = lines.index("In verl itself (each config's runs in verl's trainer, `budget.verify_in_verl`):")
    rows = [line for line in lines[start:] if line.startswith("- trial ")]
    for row, (key, verdict) in zip(rows, sorted(job["verl"].items()), strict=True):
        median = round(verdict["throughput_median"])
        spread = verdict["steps_spread_pct"]
        assert row.startswith(f"- trial {key} (verl-v0.9-")
        assert f": {median} tok/s/GPU (1 run, 3 steps, spread {spread:.1f}%)" in row
        assert f"rollout {verdict['prediction_error_pct']['rollout']:+.1f}%" in row
    assert len(rows) == 2
    floor = job["spec"].get("budget", {}).get("noise_band_pct", 0.0)
    band = max(floor, *(v["noise_pct"] for v in job["verl"].values()))
    medians = [v["throughput_median"] for v in job["verl"].values()]
    assert max(medians) - min(medians) <= max(medians) * band / 100  # inside verl's noise
    said = f"Winner picked by verl. In verl, trial 0: ties trial 1 inside the {band:.1f}% noise band."
    assert said in lines
