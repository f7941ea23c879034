"""Verification in verl, on a CPU: ``budget.verify_in_verl`` resolved and refused where verl
cannot run, the trials it picks and the interleaved order of their runs, each trial's verdict
and prediction error per phase, and the winner rule (the best verl-measured median).

verl cannot run a training step on a CPU: where a test needs a verl run's result, the run's
steps are written as verl's console logger prints them and read back by the runner's own
parser (``tests/verl_logs.py``); ``test_the_recorded_lines_are_what_verls_logger_prints``
checks those lines against verl's own logger where verl's environment is present."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autotuner.errors import SpecError
from autotuner.records import TrialRecord, TrialStatus
from autotuner.settings import Settings
from autotuner.spec import load_job_spec, parse_job_spec
from autotuner.summary import pick, summarize
from autotuner.verification import (
    DEFAULT_VERIFIED,
    check_verification,
    chosen_trials,
    interleave,
    resolve_verify_in_verl,
    verl_cut_env,
    verl_environment,
)
from autotuner.verl_results import (
    VerlVerdict,
    errors_phrase,
    prediction_error_pct,
    runs_phrase,
    summary_of,
    verdicts_of,
)
from trials.metrics import PEAK_MEMORY, THROUGHPUT
from trials.verl.types import VerlRunResult

from ..verl_logs import console_line, step_metrics, verl_result

ROOT = Path(__file__).resolve().parents[2]
GPU_JOB = ROOT / "benchmarks" / "jobs" / "qwen2.5-1.5b-grpo.yaml"
PHASES = {"gen": 10.0, "old_log_prob": 2.0, "ref": 1.5, "update_actor": 4.0, "update_weights": 0.5}


def _job(**budget: Any) -> dict[str, Any]:
    data: dict[str, Any] = load_job_spec(GPU_JOB).model_dump(mode="json")
    data["budget"] |= budget
    return data


# --------------------------------------------------------------------------- the knob


def test_an_explicit_count_on_a_cpu_job_is_refused_naming_the_field_and_the_fix() -> None:
    data = _job(verify_in_verl=3)
    data["cluster"]["device"] = "cpu"
    with pytest.raises(SpecError) as refused:
        parse_job_spec(data)
    assert refused.value.field == "budget.verify_in_verl"
    assert "3 trials to verify in verl, but this job's trials run on cpu" in str(refused.value)
    assert "set budget.verify_in_verl to 0 (or leave it unset), or run the job on cuda" in str(refused.value)
    data["budget"]["verify_in_verl"] = 0
    assert parse_job_spec(data).budget.verify_in_verl == 0


def test_on_a_cpu_the_default_is_off_and_an_auto_job_resolved_there_is_refused() -> None:
    found = lambda settings: sys.executable  # noqa: E731  (verl's environment is there...)
    auto = parse_job_spec(_job() | {"cluster": {"device": "auto", "n_gpus_per_node": 1}})
    assert resolve_verify_in_verl(auto, "cpu", Settings(), find=found) == 0  # ...but not verl's device
    explicit = parse_job_spec(_job(verify_in_verl=2) | {"cluster": {"device": "auto", "n_gpus_per_node": 1}})
    with pytest.raises(SpecError, match="budget.verify_in_verl: 2 trials to verify in verl, but this job's"):
        resolve_verify_in_verl(explicit, "cpu", Settings(), find=found)
    with pytest.raises(SpecError, match="run the job on cuda"):
        check_verification(explicit, "cpu")


def _verl_package(root: Path) -> Path:
    (root / "verl").mkdir(parents=True)
    (root / "verl" / "__init__.py").write_text("__version__ = '0.9.1'\n")
    return root


def test_a_gpu_job_verifies_two_when_verls_environment_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verl's environment is looked for as the job's runner looks: the per-engine settings,
    and a probe in that Python for the ``verl`` package (found, not imported)."""
    spec = parse_job_spec(_job())
    monkeypatch.setenv("AUTOTUNER_ENGINE_PYTHON__VERL", sys.executable)
    monkeypatch.setenv("AUTOTUNER_ENGINE_PYTHONPATH__VERL", str(_verl_package(tmp_path / "site")))
    assert verl_environment(Settings()) == sys.executable
    assert resolve_verify_in_verl(spec, "cuda", Settings()) == DEFAULT_VERIFIED == 2

    monkeypatch.setenv("AUTOTUNER_ENGINE_PYTHONPATH__VERL", str(tmp_path / "empty"))
    assert verl_environment(Settings()) is None
    assert resolve_verify_in_verl(spec, "cuda", Settings()) == 0
    # An explicit count stands either way (a run without verl records why it failed).
    assert resolve_verify_in_verl(parse_job_spec(_job(verify_in_verl=3)), "cuda", Settings()) == 3
    assert resolve_verify_in_verl(parse_job_spec(_job(verify_in_verl=0)), "cuda", Settings()) == 0


def test_verl_installed_beside_the_tuner_is_found_without_a_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU host where verl sits beside the tuner (no ``.venv-verl``, no verl or trial
    Python set): the tuner's own Python is verl's, so a job there verifies by default and
    its trials time verl's cut of their batch."""
    import autotuner.settings

    monkeypatch.setattr(autotuner.settings, "SETUP_VERL_PYTHON", tmp_path / "no-venv" / "bin" / "python")
    monkeypatch.delenv("AUTOTUNER_ENGINE_PYTHON__VERL", raising=False)
    monkeypatch.delenv("AUTOTUNER_TRIAL_PYTHON", raising=False)
    monkeypatch.setenv("AUTOTUNER_ENGINE_PYTHONPATH__VERL", str(_verl_package(tmp_path / "site")))
    spec = parse_job_spec(_job())
    assert Settings().verl_python() == sys.executable
    assert verl_environment(Settings()) == sys.executable
    assert resolve_verify_in_verl(spec, "cuda", Settings()) == DEFAULT_VERIFIED
    assert verl_cut_env(verl_environment(Settings()), Settings())["python"] == sys.executable

    monkeypatch.delenv("AUTOTUNER_ENGINE_PYTHONPATH__VERL")  # the tuner's own Python has no verl
    assert verl_environment(Settings()) is None
    assert resolve_verify_in_verl(spec, "cuda", Settings()) == 0


def test_trials_get_verls_environment_to_time_its_cut_where_it_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trials of a job whose runner found verl get its Python, its PYTHONPATH and a
    folder for the cuts already timed, beside the compile caches; without verl, nothing."""
    monkeypatch.setenv("AUTOTUNER_COMPILE_CACHE_DIR", str(tmp_path / "cc"))
    monkeypatch.setenv("AUTOTUNER_ENGINE_PYTHONPATH__VERL", str(tmp_path / "site"))
    assert verl_cut_env(None, Settings()) == {}
    assert verl_cut_env("/opt/verl/bin/python", Settings()) == {
        "python": "/opt/verl/bin/python",
        "PYTHONPATH": str(tmp_path / "site"),
        "cache_dir": str(tmp_path / "cc" / "verl-cut"),
    }


def test_a_world_of_several_nodes_is_not_verified() -> None:
    data = _job(verify_in_verl=1)
    data["cluster"] |= {"nnodes": 2}
    with pytest.raises(
        SpecError, match="verl runs the job's whole world on one node and cluster.nnodes is 2"
    ):
        check_verification(parse_job_spec(data), "cuda")
    data["budget"]["verify_in_verl"] = None
    assert resolve_verify_in_verl(parse_job_spec(data), "cuda", Settings(), find=lambda s: "python") == 0


# --------------------------------------------------------------------------- what runs


def _trial(number: int, throughput: float, peak: float = 40.0, **kwargs: Any) -> TrialRecord:
    return TrialRecord(
        number,
        TrialStatus.OK,
        config={"knob": number},
        metrics={THROUGHPUT: throughput, PEAK_MEMORY: peak, "step_time_s": 20.0},
        **kwargs,
    )


def test_the_baselines_and_the_fastest_front_trials_are_chosen() -> None:
    spec = parse_job_spec(_job())
    recs = [
        _trial(0, 1000.0, 30.0, baseline="verl-v0.9-defaults"),
        _trial(1, 1200.0, 38.0, baseline="verl-example"),
        _trial(2, 3000.0, 60.0),  # the front, fastest first: 2, 4, 3
        _trial(3, 1500.0, 31.0),
        _trial(4, 2500.0, 45.0),
        _trial(5, 900.0, 70.0),  # dominated
        TrialRecord(6, TrialStatus.OOM, config={"knob": 6}),
    ]
    assert [r.number for r in chosen_trials(spec, recs, 2)] == [0, 1, 2, 4]
    assert [r.number for r in chosen_trials(spec, recs, 0)] == [0, 1]


def test_runs_are_interleaved_round_by_round() -> None:
    a, b, c = _trial(0, 1.0), _trial(4, 1.0), _trial(9, 1.0)
    order = [(r.number, k) for r, k in interleave([a, b, c], 2, {})]
    assert order == [(0, 0), (4, 0), (9, 0), (0, 1), (4, 1), (9, 1)]  # A-B-C-A-B-C
    resumed = [(r.number, k) for r, k in interleave([a, b, c], 2, {0: 2, 4: 1})]
    assert resumed == [(9, 0), (4, 1), (9, 1)]  # only what a stopped job had not run
    again = [(r.number, k) for r, k in interleave([a, b], 2, {0: 2}, again=True)]
    assert again == [(0, 2), (4, 0), (0, 3), (4, 1)]


# --------------------------------------------------------------------------- verdicts


def _run(run_id: str, throughputs: list[float], phases: dict[str, float] = PHASES) -> VerlRunResult:
    return verl_result(run_id, [step_metrics(t, phases) for t in throughputs])


def test_a_verdict_takes_medians_over_runs_and_shows_the_error_per_phase() -> None:
    # Warm-up steps (first) are slow and excluded; each run's figure is its median step.
    runs = [_run("a", [100.0, 1900.0, 2100.0, 2000.0]), _run("b", [50.0, 2150.0, 2250.0, 2200.0])]
    failed = VerlRunResult("c", "oom", error_type="OutOfMemoryError", error_message="CUDA OOM")
    verdict = verdicts_of([(3, runs[0]), (3, failed), (3, runs[1])])[3]
    assert verdict.status == "ok" and len(verdict.runs) == 3 and len(verdict.ok_runs) == 2
    assert verdict.throughputs == [2000.0, 2200.0]
    assert verdict.median == 2100.0
    assert verdict.spread_pct == pytest.approx(100 * 200 / 2100)
    medians = verdict.medians()
    assert medians["timing_s/gen"] == 10.0 and medians["timing_s/update_weights"] == 0.5
    assert medians["timing_s/step"] == pytest.approx(sum(PHASES.values()))
    assert verdict.peak_memory_gb() == {
        "perf/max_memory_allocated_gb": 30.5,
        "perf/max_memory_reserved_gb": 34.0,
    }
    assert verdict.versions()["verl"] == "0.9.1"
    # The measured steps (warm-ups left out), pooled over the runs, are its other spread.
    assert verdict.step_throughputs == [1900.0, 2100.0, 2000.0, 2150.0, 2250.0, 2200.0]
    assert verdict.steps_spread_pct == pytest.approx(100 * 350 / 2125)
    assert verdict.noise_pct == verdict.steps_spread_pct  # the wider of the two
    assert verdict.describe() == (
        "2100.0 tok/s/GPU in verl (median of 2 runs, spread 9.5%; 6 steps, spread 16.5%)"
    )
    spreads = verdict.phase_spreads_pct()  # every step's phases were the same here
    assert spreads.pop("throughput") == pytest.approx(verdict.steps_spread_pct)
    assert spreads == dict.fromkeys(
        ("rollout", "old_log_prob", "ref_log_prob", "update_actor", "weight_sync", "step"), 0.0
    )
    one = VerlVerdict(3, [runs[0]])
    assert one.spread_pct is None and one.noise_pct == pytest.approx(100 * 200 / 2000)
    assert one.describe() == "2000.0 tok/s/GPU in verl (1 run, 3 steps, spread 10.0%)"

    trial = _trial(3, 2310.0)
    trial.phase_timings_s = {"rollout": 12.0, "old_log_prob": 1.0, "ref_log_prob": 1.5, "weight_sync": 0.6}
    errors = prediction_error_pct(trial, verdict)
    assert errors["rollout"] == pytest.approx(20.0)  # 12 s predicted, 10 s in verl
    assert errors["old_log_prob"] == pytest.approx(-50.0)
    assert errors["ref_log_prob"] == pytest.approx(0.0)
    assert errors["weight_sync"] == pytest.approx(20.0)
    assert "update_actor" not in errors  # the trial did not time it
    assert errors["step"] == pytest.approx(100 * (20.0 - 18.0) / 18.0)
    assert errors["throughput"] == pytest.approx(10.0)
    assert prediction_error_pct(trial, verdict, trial_throughput=2100.0)["throughput"] == pytest.approx(0.0)


def test_verls_own_spread_is_given_per_phase_beside_the_trials_error() -> None:
    # verl's replay buffer polls every 2 s: one batch's gen took 2 s twice and 4 s once.
    gens = [8.0, 2.07, 4.1, 2.09]  # the first a warm-up
    steps = [step_metrics(1000.0, PHASES | {"gen": g}) for g in gens]
    verdict = VerlVerdict(0, [verl_result("r", steps)])
    spreads = verdict.phase_spreads_pct()
    assert spreads["rollout"] == pytest.approx(100 * (4.1 - 2.07) / 2.09)
    assert spreads["old_log_prob"] == 0.0 and spreads["weight_sync"] == 0.0
    step_s = [sum((PHASES | {"gen": g}).values()) for g in gens[1:]]
    assert spreads["step"] == pytest.approx(100 * (max(step_s) - min(step_s)) / sorted(step_s)[1])
    trial = _trial(0, 1000.0)
    trial.phase_timings_s = {"rollout": 3.9}
    shown = summary_of(verdict, trial, None)
    assert shown["phase_spread_pct"] == spreads
    assert shown["prediction_error_pct"]["rollout"] == pytest.approx(100 * (3.9 + 0.1 - 2.09) / 2.09)
    # +91.4% off, inside verl's own 97% over one batch; the step error is not, nor the
    # throughput's 0% against steps that did not move (a spread of 0 holds nothing).
    said = errors_phrase(shown).split(", ")
    assert said[0] == f"rollout {shown['prediction_error_pct']['rollout']:+.1f}% (inside verl's 97%)"
    assert all("inside" not in part for part in said[1:]), said


def test_how_a_verl_figure_was_measured_reads_for_any_stored_verdict() -> None:
    # A verdict stored before verdicts counted their steps has no "steps": its runs alone.
    assert runs_phrase({"ok_runs": 2, "spread_pct": 1.25}) == "median of 2 runs, spread 1.2%"
    assert runs_phrase({"ok_runs": 1}) == "1 run"
    assert runs_phrase({"ok_runs": 1, "steps": 1, "steps_spread_pct": None}) == "1 run, 1 step"
    assert runs_phrase({"ok_runs": 3, "spread_pct": 2.0, "steps": 9, "steps_spread_pct": 7.5}) == (
        "median of 3 runs, spread 2.0%; 9 steps, spread 7.5%"
    )


def test_a_trial_whose_verl_runs_all_failed_has_no_median() -> None:
    timeout = VerlRunResult("t", "timeout", error_type="VerlTimeout", error_message="killed")
    verdict = VerlVerdict(2, [timeout])
    assert verdict.status == "timeout" and verdict.median is None and verdict.medians() == {}
    assert verdict.describe() == "not measured in verl (timeout: VerlTimeout)"


# --------------------------------------------------------------------------- the winner


def test_the_best_verl_median_wins_once_a_verified_run_finished() -> None:
    spec = parse_job_spec(_job())
    recs = [
        _trial(0, 1000.0, 30.0, baseline="verl-v0.9-defaults"),
        _trial(1, 3000.0, 60.0),  # fastest as a trial
        _trial(2, 2800.0, 50.0),
    ]
    verl = verdicts_of(
        [
            (0, _run("d", [0.0, 900.0, 900.0, 900.0])),
            (1, _run("x", [0.0, 2000.0, 2000.0, 2000.0])),
            (2, _run("y", [0.0, 2400.0, 2400.0, 2400.0])),  # fastest in verl
        ]
    )
    assert pick(spec, recs)[0].trial.number == 1  # without verl: as before
    winner, tied, source = pick(spec, recs, verl=verl)
    assert (winner.trial.number, tied, source) == (2, [], "verl")
    assert pick(spec, recs, max_peak_memory_gib=55.0, verl=verl)[0].trial.number == 2
    assert pick(spec, recs, max_peak_memory_gib=45.0, verl=verl)[0].trial.number == 0

    summary = summarize(spec, recs, "done", verl)
    assert (summary.best, summary.winner_source) == (2, "verl")
    assert summary.verl_gain_over_baseline == pytest.approx(2400.0 / 900.0)
    assert summary.verl[2]["throughput_median"] == 2400.0
    assert summary.verl[2]["prediction_error_pct"]["throughput"] == pytest.approx(100 * (2800 - 2400) / 2400)
    assert "picked in verl: 2400.0 tok/s/GPU measured in verl" in summary.best_line()

    # Steady steps: no noise of their own, so the job's floor band decides; far apart: faster.
    assert summary.verl_gain_verdict == "faster" and summary.verl_tied_with == []
    assert summary.verl_gain_band_pct == spec.budget.noise_band_pct
    assert summary.verl_gain_line() == (
        "in verl, trial 2: 2.67x verl's defaults; "
        "faster than every other trial verl measured, beyond their noise"
    )

    failed = {1: VerlVerdict(1, [VerlRunResult("f", "error", error_type="VerlRunFailed")])}
    summary = summarize(spec, recs, "done", failed)
    assert (summary.best, summary.winner_source) == (1, "trials")  # no verified run finished
    assert summary.verl[1]["status"] == "error" and summary.verl[1]["throughput_median"] is None


def test_verl_medians_inside_verls_own_noise_are_reported_as_ties() -> None:
    """Trial 2 has the best verl median, but trial 1's steps spread 12.5% and its median is
    within that of trial 2's: a tie. Over verl's defaults, 1.10x inside the defaults' own 20%
    spread is a tie too. Nothing changes the pick: the best verl median still wins."""
    spec = parse_job_spec(_job())
    assert spec.budget.noise_band_pct < 10
    recs = [_trial(0, 1000.0, 30.0, baseline="verl-v0.9-defaults"), _trial(1, 3000.0), _trial(2, 2800.0)]
    verl = verdicts_of(
        [
            (0, _run("d", [0.0, 2000.0, 1800.0, 2200.0])),  # spread 20%
            (1, _run("x", [0.0, 2000.0, 2100.0, 2250.0])),  # spread 250 / 2100 = 11.9%
            (2, _run("y", [0.0, 2200.0, 2200.0, 2200.0])),
            (0, _run("d2", [0.0, 2000.0, 2000.0, 2000.0])),
        ]
    )
    summary = summarize(spec, recs, "done", verl)
    assert (summary.best, summary.winner_source) == (2, "verl")
    assert summary.verl_gain_over_baseline == pytest.approx(1.1)
    assert summary.verl_gain_verdict == "tie"
    assert summary.verl_gain_band_pct == pytest.approx(verl[0].noise_pct) == pytest.approx(20.0)
    assert summary.verl_tied_with == [0, 1]
    assert summary.verl_tie_band_pct == pytest.approx(20.0)
    line = summary.verl_gain_line()
    assert line == (
        "in verl, trial 2: ties verl's defaults (1.10x, inside the 20.0% noise band); "
        "ties trial 1 inside the 11.9% noise band"
    )
    assert "tied in verl with [0, 1] inside the 20.0% noise band" in summary.best_line()
    # Steadier steps beside the defaults' own: 10% apart is then beyond the band.
    verl[0] = VerlVerdict(0, [_run("d3", [0.0, 2000.0, 2000.0, 2000.0])])
    verl[1] = VerlVerdict(1, [_run("x2", [0.0, 1900.0, 1900.0, 1900.0])])
    summary = summarize(spec, recs, "done", verl)
    assert (summary.verl_gain_verdict, summary.verl_tied_with) == ("faster", [])


# --------------------------------------------------------------------------- verl's own logger

_PRINT_WITH_VERLS_LOGGER = """
import sys, numpy as np
sys.path.insert(0, sys.argv[1])
from verl_logs import step_metrics
from verl.utils.logger.aggregate_logger import LocalLogger
LocalLogger(print_to_console=True).log(step_metrics(2048.5, {"gen": 9.25, "update_weights": 0.5}), 3)
"""


def test_the_recorded_lines_are_what_verls_logger_prints() -> None:
    """The lines ``tests/verl_logs.py`` writes are verl's console logger's, byte for byte."""
    sys.path.insert(0, str(ROOT / "tests" / "trials"))
    from verl_helpers import verl_python

    python = verl_python()
    env = dict(os.environ) | {"PYTHONPATH": str(ROOT)}
    printed = subprocess.run(
        [python, "-c", _PRINT_WITH_VERLS_LOGGER, str(ROOT / "tests")],
        capture_output=True, text=True, env=env, check=True,
    ).stdout.strip().splitlines()[-1]  # fmt: skip
    assert printed == console_line(3, step_metrics(2048.5, {"gen": 9.25, "update_weights": 0.5}))


def test_a_submitted_job_asking_for_verl_on_this_cpu_gets_a_422_naming_the_field() -> None:
    """The service resolves ``cluster.device: auto`` on its own host (a CPU here): an explicit
    count is refused before anything is stored."""
    from autotuner.api.errors import InvalidInputError
    from autotuner.api.submission import validate_job
    from autotuner.hardware import detect_device

    if detect_device() == "cuda":
        pytest.skip("this host has a GPU: cluster.device auto resolves to cuda")
    data = _job(verify_in_verl=1)
    data["workload"] |= {"model": "tiny", "dtype": "float32", "max_response_length": 128}
    data["workload"] |= {"response_length": {"kind": "uniform", "low": 16, "high": 128}}
    data["cluster"] = {"device": "auto"}
    with pytest.raises(InvalidInputError) as refused:
        validate_job(data, Settings())
    (item,) = refused.value.errors
    assert item["loc"] == ["body", "budget", "verify_in_verl"]
    assert "1 trials to verify in verl, but this job's trials run on cpu" in item["msg"]
    data["budget"]["verify_in_verl"] = None
    assert validate_job(data, Settings()).budget.verify_in_verl is None  # the default: resolved at run
