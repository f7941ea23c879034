"""The study loop's search logic on a recorded landscape (ReplayExecutor): memory-model
skips, feasibility inferred from measured OOMs, early stopping, re-measured finalists.

The landscape is real: every config of benchmarks/search/jobs/cpu-train-landscape.yaml
measured twice as a real trial on a CPU (benchmarks/search/record.py). The study is a real
Optuna study on SQLite, driven by the real StudyRunner; only the trials are replayed.
"""

from __future__ import annotations

import optuna
import pytest
from optuna.study._constrained_optimization import _get_feasible_trials
from optuna.trial import TrialState

from autotuner.api.schemas import TrialPublic
from autotuner.knobs import A, R
from autotuner.memory import MemoryModel
from autotuner.records import records
from autotuner.replay import Landscape, LandscapeError, ReplayExecutor
from autotuner.space import SearchSpace
from autotuner.spec import JobSpec
from autotuner.study import StudyRunner, config_key, open_study
from autotuner.summary import runs_of, summarize

from .conftest import REPO

optuna.logging.set_verbosity(optuna.logging.WARNING)
LANDSCAPE = REPO / "benchmarks" / "search" / "landscapes" / "cpu-train-mid.json"
MICRO, LOG_PROB, CKPT = (
    A + "ppo_micro_batch_size_per_gpu",
    R + "log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.model.enable_gradient_checkpointing",
)


@pytest.fixture(scope="module")
def landscape() -> Landscape:
    return Landscape.load(LANDSCAPE)


def _runner(landscape, tmp_path, *, model=False, infer=False, objectives=None, **budget):
    data = landscape.spec.model_dump(mode="json")
    data["budget"] |= {
        "max_trials": len(landscape.points),
        "patience_trials": 0,
        "remeasure_finalists": 0,
        **budget,
    }
    if objectives is not None:
        data["objectives"] = objectives
    spec = JobSpec.model_validate(data)
    space = SearchSpace.build(spec, landscape.arch, landscape.device)
    study = open_study(spec, "replayed", f"sqlite:///{tmp_path / 'db.sqlite'}")
    executor = ReplayExecutor(landscape)
    memory = (
        MemoryModel(spec, landscape.arch, "cpu", landscape.memory_cap_gib, train_order=landscape.train_order)
        if model
        else None
    )
    runner = StudyRunner(
        spec,
        study,
        space,
        executor,
        "cpu",
        landscape.memory_cap_gib,
        memory_model=memory,
        infer_feasibility=infer,
    )
    return runner, study, executor


def _outcomes(landscape):
    return {config_key(p.config): p.runs[0].status for p in landscape.points}


def test_the_landscape_is_real_and_labelled_as_cpu(landscape) -> None:
    assert landscape.device == "cpu" and landscape.label.startswith("CPU landscape")
    assert "benchmarks.search.record" in landscape.command
    assert len(landscape.points) == 36 and all(len(p.runs) == 2 for p in landscape.points)
    statuses = {r.status for p in landscape.points for r in p.runs}
    assert statuses == {"ok", "oom"}
    assert all(r.wall_s > 1 and r.device.startswith("cpu:") for p in landscape.points for r in p.runs)


def test_replay_answers_each_config_with_its_recorded_runs_in_turn(landscape) -> None:
    executor = ReplayExecutor(landscape)
    point = landscape.points[0]
    spec = MemoryModel(
        landscape.spec, landscape.arch, "cpu", 2.0, train_order=landscape.train_order
    ).trial_spec(point.config)
    for k in range(3):
        spec.trial_id = f"t{k}"
        executor.submit(spec, None, 60)  # type: ignore[arg-type]
        (result,) = executor.wait(0)
        recorded = point.runs[k % 2]
        assert result.trial_id == f"t{k}" and result.metrics == recorded.metrics
        assert result.hostname == f"replay:{recorded.hostname}"
    assert executor.cost_s == pytest.approx(2 * point.runs[0].wall_s + point.runs[1].wall_s)
    spec.train.ppo_micro_batch_size_per_gpu = 3
    with pytest.raises(LandscapeError, match="not in the landscape"):
        executor.submit(spec, None, 60)  # type: ignore[arg-type]


def test_predicted_ooms_are_never_run_cost_nothing_and_are_infeasible_for_the_sampler(
    landscape, tmp_path
) -> None:
    runner, study, executor = _runner(landscape, tmp_path, model=True, max_trials=20)
    runner.run()
    recs = records(study)
    skipped = [r for r in recs if r.status == "predicted_oom"]
    assert skipped, [r.status for r in recs]
    ran = {config_key(point.config) for _, point, _, _ in executor.history}
    truth = _outcomes(landscape)
    for r in skipped:
        assert config_key(r.config) not in ran and r.wall_s == 0 and not r.measured
        assert "exceeds the device's 2.00 GiB" in (r.error_message or "")
        assert r.predicted_memory_gib["train"] > 2.0 * 1.15
        # A wrong model would cost the optimum: every skipped config really runs out of memory.
        assert truth[config_key(r.config)] == "oom", r.config
    frozen = {t.number: t for t in study.get_trials()}
    feasible = {t.number for t in _get_feasible_trials(study.get_trials())}
    assert all(frozen[r.number].state == TrialState.COMPLETE and r.number not in feasible for r in skipped)
    # Every trial that ran carries the prediction made before it and its error.
    measured = [r for r in recs if r.measured]
    assert measured and all(r.predicted_memory_gib and "startup" in r.memory_error_gib for r in measured)
    summary = summarize(runner.spec, recs, "")
    assert summary.counts["predicted_oom"] == len(skipped)
    assert summary.memory_model_errors["train"]["trials"] >= 1
    assert summary.gpu_seconds == pytest.approx(executor.cost_s)
    # What the job had spent when the winner's first run ended: the runs numbered up to it.
    assert summary.best is not None
    to_best = sum(
        cost for trial_id, *_, cost in executor.history if int(trial_id.rsplit("-", 1)[1]) <= summary.best
    )
    assert summary.gpu_seconds_to_best == pytest.approx(to_best)
    assert 0 < to_best < executor.cost_s, "the winner is not the last run here"
    assert (
        f"the winner (trial {summary.best}) was found after {to_best:.0f} GPU-seconds" in summary.cost_line()
    )
    public = TrialPublic.of(skipped[0])
    assert public.status == "predicted_oom" and public.skipped and not public.measured


def test_a_measured_oom_rules_out_its_larger_neighbours_and_not_the_others(landscape, tmp_path) -> None:
    runner, study, executor = _runner(landscape, tmp_path, infer=True, max_trials=4)
    oom = {MICRO: 16, LOG_PROB: 32, CKPT: True}
    truth = _outcomes(landscape)
    assert truth[config_key(runner.space.full_config(oom))] == "oom"
    # Larger in every memory knob; smaller in one (log-prob micro-batch 8); smaller in the
    # other (micro-batch 8); another checkpointing choice (not a memory knob): only the
    # first is implied.
    for params in (
        oom,
        oom | {MICRO: 32},
        oom | {MICRO: 32, LOG_PROB: 8},
        oom | {MICRO: 8},
        oom | {MICRO: 32, CKPT: False},
    ):
        study.enqueue_trial(params)
    summary = runner.run()
    recs = {r.number: r for r in records(study)}
    assert recs[0].status == "oom"
    assert recs[1].status == "inferred_oom" and recs[1].inferred_from == 0
    assert not recs[1].measured and recs[1].wall_s == 0
    for n in (2, 3, 4):
        assert recs[n].measured and recs[n].status == truth[config_key(recs[n].config)], n
    assert summary.measured == 4 and len(executor.history) == 4
    assert "reached max_trials (4)" in summary.stop_reason
    assert TrialPublic.of(recs[1]).inferred_from == 0


def test_patience_stops_the_job_early_and_says_why(landscape, tmp_path) -> None:
    throughput_only = [{"metric": "throughput_tokens_per_s_per_gpu"}]
    runner, study, _ = _runner(
        landscape, tmp_path, objectives=throughput_only, patience_trials=3, noise_band_pct=50
    )
    summary = runner.run()
    assert summary.stop_reason.startswith("stopped early: the Pareto front has not improved")
    assert "50% noise band" in summary.stop_reason and "patience_trials = 3" in summary.stop_reason
    measured = [r for r in records(study) if r.measured]
    first_ok = next(i for i, r in enumerate(measured) if r.status == "ok")
    # Nothing beats the first feasible trial by 50% here: 3 more trials, then the job stops.
    assert len(measured) == first_ok + 1 + 3 < len(landscape.points)


def test_finalists_are_remeasured_and_the_winner_is_their_best_median(landscape, tmp_path) -> None:
    runner, study, executor = _runner(
        landscape, tmp_path, max_trials=8, remeasure_finalists=2, remeasure_runs=3
    )
    summary = runner.run()
    assert summary.measured == 8 and "measured 3 times each" in summary.stop_reason
    recs = records(study)
    repeats = [r for r in recs if r.repeat_of is not None]
    assert len(repeats) == 4 and not any(r.measured for r in repeats) and all(r.ran for r in repeats)
    finalists = sorted({r.repeat_of for r in repeats})
    by_number = {r.number: r for r in recs}
    assert all(by_number[n].config == r.config for r in repeats for n in [r.repeat_of])
    runs = runs_of(recs)
    assert all(runs[n].n == 3 for n in finalists)
    result = summarize(runner.spec, recs, summary.stop_reason)
    assert result.best in finalists and result.best_runs == 3
    winner = runs[result.best]
    assert result.best_throughput == pytest.approx(winner.median)
    assert result.best_spread_pct == pytest.approx(winner.spread_pct)
    others = [runs[n] for n in finalists if n != result.best]
    assert all(o.median < winner.median * (1 - 0.02) or o.peak_gib >= winner.peak_gib for o in others)
    # Resuming does not measure the finalists again.
    again, _, executor2 = _runner(landscape, tmp_path, max_trials=8, remeasure_finalists=2, remeasure_runs=3)
    again.run()
    assert executor2.history == []


def test_baselines_run_first_mid_job_and_last_and_their_spread_is_the_noise(landscape, tmp_path) -> None:
    ok = [p for p in landscape.points if p.runs[0].status == "ok"]
    job_baselines = {"landscape-a": ok[1].config, "landscape-b": ok[2].config}
    runner, study, _ = _runner(landscape, tmp_path, max_trials=12, remeasure_finalists=1)
    runner.spec.baselines.update(job_baselines)
    runner.enqueue_baseline()
    summary = runner.run()
    assert "measured 3 times each" in summary.stop_reason  # the finalist's note
    recs = records(study)
    baselines = [r for r in recs if r.baseline and r.feasible]
    assert {"landscape-a", "landscape-b"} <= {r.baseline for r in baselines}
    measured = [r.number for r in recs if r.measured]
    half = measured[len(measured) // 2 - 1]  # the trial that used half the budget
    first = [r.number for r in recs if r.baseline and r.measured]
    assert first == measured[: len(first)]  # first: before the search's own trials
    for base in baselines:
        again = [r.number for r in recs if r.repeat_of == base.number and r.ran]
        assert len(again) == 2, (base.baseline, again)
        middle, end = again
        # middle: once half the trials were measured, with search trials still after it
        assert half < middle < measured[-1]
        assert end > measured[-1]  # last: after the search, with the finalists
    runs = runs_of(recs)
    spreads = []
    for base in baselines:
        values = runs[base.number].throughputs
        spreads.append((max(values) - min(values)) / sorted(values)[1] * 100)
    result = summarize(runner.spec, recs, summary.stop_reason)
    assert result.noise_pct == pytest.approx(sum(spreads) / len(spreads))  # 3 runs each: equal weights
    assert result.noise_runs == 3 * len(baselines)
    assert result.tie_band_pct == pytest.approx(max(2.0, result.noise_pct))
    for base in baselines:
        reported = result.baselines[base.baseline]
        assert reported["runs"] == 3 and reported["spread_pct"] == pytest.approx(runs[base.number].spread_pct)
        assert reported["tie_band_pct"] >= result.tie_band_pct
    # Resuming measures nothing again: every baseline has its three runs.
    again, _, executor2 = _runner(landscape, tmp_path, max_trials=12, remeasure_finalists=1)
    again.spec.baselines.update(job_baselines)
    again.run()
    assert executor2.history == []


def test_once_a_baseline_ran_twice_the_patience_band_is_the_measured_noise(landscape, tmp_path) -> None:
    """A job whose baselines' repeats spread wider than the assumed floor stops early on the
    measured band: a gain inside the noise does not keep it searching."""
    throughput = "throughput_tokens_per_s_per_gpu"
    ok = [p for p in landscape.points if all(r.status == "ok" for r in p.runs)]
    slowest = min(ok, key=lambda p: sum(r.metrics[throughput] for r in p.runs))
    runner, study, _ = _runner(
        landscape,
        tmp_path,
        objectives=[{"metric": throughput}],
        patience_trials=5,
        noise_band_pct=0.5,
        max_trials=8,
    )
    runner.spec.baselines.update({"slowest": slowest.config})
    runner.enqueue_baseline()
    summary = runner.run()
    recs = records(study)
    baselines = [r for r in recs if r.baseline and r.repeat_of is None]
    assert len(baselines) == 2
    # The band when the job stopped: the baselines' first two runs (the end-of-job runs follow).
    pairs = [
        [
            r.metric(throughput)
            for r in sorted(recs, key=lambda r: r.number)
            if base.number in (r.number, r.repeat_of)
        ][:2]
        for base in baselines
    ]
    band = sum((max(p) - min(p)) / (sum(p) / 2) for p in pairs) / len(pairs) * 100
    assert band > 0.5
    assert summary.stop_reason.startswith(
        f"stopped early: the Pareto front has not improved beyond the {band:.3g}% noise band "
        "(measured on 4 runs of 2 baseline(s)) in the last 5 measured trials"
    ), summary.stop_reason


def test_each_trial_gets_verls_environment_to_time_its_cut(landscape, tmp_path) -> None:
    runner, study, executor = _runner(landscape, tmp_path, max_trials=3)
    runner.verl_cut_env = {"python": "/opt/verl/bin/python", "cache_dir": "/data/verl-cut"}
    sent: list[dict[str, str]] = []
    submit = executor.submit

    def recorded(spec, resources, timeout_s):
        sent.append(dict(spec.verl_cut_env))
        submit(spec, resources, timeout_s)

    executor.submit = recorded
    runner.enqueue_baseline()
    runner.run()
    assert len(sent) >= 3 and all(env == runner.verl_cut_env for env in sent)
