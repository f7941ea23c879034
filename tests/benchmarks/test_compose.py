"""A landscape composed from a cross design (benchmarks/search/compose.py), checked on the
recorded H200 landscape: its 24 configs were each run as a real trial, so the configs off
the cross are measured and the composition can be held against them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import optuna
import pytest

from autotuner.compose import ACTOR_PHASES
from autotuner.knobs import A, R
from autotuner.records import config_key
from autotuner.replay import Landscape, LandscapePoint, engine_seconds
from autotuner.space import SearchSpace
from benchmarks.search.compare import compare, run_strategy, true_values
from benchmarks.search.compare import main as compare_main
from benchmarks.search.compare import table as compare_table
from benchmarks.search.compose import (
    DesignError,
    choose_base,
    compose,
    compose_run,
    cross,
    engine_side_only,
    main,
    make_design,
    table,
)
from benchmarks.search.record import main as record_main
from benchmarks.search.record import recorded_design
from trials.metrics import PEAK_MEMORY, THROUGHPUT
from trials.types import BatchDraw

optuna.logging.set_verbosity(optuna.logging.ERROR)
REPO = Path(__file__).resolve().parents[2]
H200 = REPO / "benchmarks" / "search" / "landscapes" / "qwen2.5-1.5b-h200.json"
GMU, MNS = R + "gpu_memory_utilization", R + "max_num_seqs"
PPO_MB, LP_MB = A + "ppo_micro_batch_size_per_gpu", R + "log_prob_micro_batch_size_per_gpu"
# A landscape file as trials record it now (the H200 landscape's runs are older), which a
# recorder resumes.
NOW = {"train_order": BatchDraw.train_order, "logits_copied": False}


@pytest.fixture(scope="module")
def full() -> Landscape:
    return Landscape.load(H200)


@pytest.fixture(scope="module")
def space(full) -> SearchSpace:
    return SearchSpace.build(full.spec, full.arch, full.device)


def _sides_only(full: Landscape, space: SearchSpace) -> Landscape:
    """The full landscape cut down to what a cross design records (no held-out configs)."""
    grid = space.grid()
    on = {config_key(c) for c in cross(grid, choose_base(space, grid, {}))}
    return dataclasses.replace(full, points=[p for p in full.points if config_key(p.config) in on])


def test_the_cross_is_each_engine_setting_and_each_train_setting_once(space) -> None:
    grid = space.grid()
    base = choose_base(space, grid, {})
    # Of the searched values, verl's defaults hold gmu 0.5 and micro-batches of 4 (its
    # example's sizes are repaired to the nearest searched); max_num_seqs 256.
    assert (base[GMU], base[MNS], base[PPO_MB], base[LP_MB]) == (0.5, 256, 4, 4)
    sides = cross(grid, base)
    # 4 engine settings (gmu x mns) and 6 train settings (ppo x lp): 4 + 6 - 1 configs.
    assert len(grid) == 24 and len(sides) == 9
    assert {(c[GMU], c[MNS]) for c in sides if (c[PPO_MB], c[LP_MB]) == (4, 4)} == {
        (g, m) for g in (0.5, 0.8) for m in (256, 1024)
    }
    assert {(c[PPO_MB], c[LP_MB]) for c in sides if (c[GMU], c[MNS]) == (0.5, 256)} == {
        (p, lp) for p in (4, 16, 64) for lp in (4, 16)
    }
    fixed = choose_base(space, grid, {GMU: 0.8, PPO_MB: 16})
    assert (fixed[GMU], fixed[PPO_MB]) == (0.8, 16)
    with pytest.raises(DesignError, match="no config of the grid"):
        choose_base(space, grid, {GMU: 0.7})


def test_a_design_holds_out_configs_off_the_cross_drawn_by_its_seed(space) -> None:
    design, configs = make_design(space, k=4, seed=0)
    again, _ = make_design(space, k=4, seed=0)
    other, _ = make_design(space, k=4, seed=1)
    assert design == again and design["held_out"] != other["held_out"]
    keys = [config_key(c) for c in configs]
    assert len(keys) == len(set(keys)) == design["sides"] + 4
    assert keys[design["sides"] :] == design["held_out"]  # sides first: recorded first
    on = {config_key(c) for c in cross(space.grid(), design["base"])}
    assert not on & set(design["held_out"])
    _, everything = make_design(space, k=100, seed=0)
    assert len(everything) == 24


def test_a_composed_run_of_a_runs_own_two_sides_is_that_run(full) -> None:
    run = next(r for p in full.points for r in p.runs if r.ok)
    same = compose_run(run, run, "x")
    assert same.metrics[THROUGHPUT] == pytest.approx(run.metrics[THROUGHPUT], rel=1e-9)
    assert same.wall_s == pytest.approx(run.wall_s)
    assert same.phase_timings_s == run.phase_timings_s
    assert same.metrics[PEAK_MEMORY] == pytest.approx(run.metrics[PEAK_MEMORY])


def test_a_composed_run_keeps_the_engine_runs_timeline_with_the_actor_runs_training(full) -> None:
    engine, actor = (full.points[i].runs[0] for i in (12, 1))  # gmu 0.8 and 0.5: two hosts
    assert engine.ok and actor.ok
    out = compose_run(engine, actor, "x")
    m, e, a = out.metrics, engine.metrics, actor.metrics
    train = a["train_end_at_s"] - a["train_start_at_s"]
    assert m["train_end_at_s"] - m["train_start_at_s"] == pytest.approx(train)
    assert engine_seconds(out) == pytest.approx(engine_seconds(engine))
    assert out.wall_s == pytest.approx(engine.wall_s - (e["train_end_at_s"] - e["train_start_at_s"]) + train)
    assert m["rollout_peak_memory_gib"] == e["rollout_peak_memory_gib"]
    assert m["train_peak_memory_gib"] == a["train_peak_memory_gib"]
    assert out.phase_timings_s["update_actor"] == actor.phase_timings_s["update_actor"]
    assert out.phase_timings_s["rollout"] == engine.phase_timings_s["rollout"]


def test_a_side_that_did_not_fit_is_the_composed_runs_failure(full) -> None:
    ok = next(r for p in full.points for r in p.runs if r.ok)
    oom = next(r for p in full.points for r in p.runs if r.status == "oom")
    for engine, actor in ((ok, oom), (oom, ok)):
        out = compose_run(engine, actor, "x")
        assert (out.status, out.phase, out.wall_s) == (oom.status, oom.phase, oom.wall_s)
        assert THROUGHPUT not in out.metrics


def test_the_h200_landscape_composed_from_its_cross_matches_its_measured_configs(full, space) -> None:
    composed, report = compose(_sides_only(full, space))
    assert (report["sides"], report["composed"], report["held_out"]) == (9, 15, 0)
    assert len(composed.points) == 24 and len(composed.design["composed"]) == 15
    measured, guessed = true_values(full), true_values(composed)
    assert guessed.keys() == measured.keys()
    for key in composed.design["composed"]:
        # Feasibility carries over exactly: each config that did not fit has a train side
        # that did not fit (micro-batch 64); throughput within 10% where both fit.
        assert (guessed[key] > 0) == (measured[key] > 0), key
        if measured[key] > 0:
            assert guessed[key] == pytest.approx(measured[key], rel=0.10), key
    # A search replays it as it replays a recorded landscape.
    out = run_strategy(composed, "ours", seed=0)
    assert out.runs > 0 and out.reach_cost_s is not None


def test_held_out_configs_report_the_compositions_error(full, tmp_path, capsys) -> None:
    # The full landscape: every config off the cross is measured, so all 15 are held out.
    report_path, out_path = tmp_path / "report.json", tmp_path / "composed.json"
    assert main([str(H200), "--report", str(report_path), "--out", str(out_path)]) == 0
    text = capsys.readouterr().out
    report = json.loads(report_path.read_text())
    assert (report["held_out"], report["composed"], report["feasibility_mismatches"]) == (15, 0, 0)
    assert report["both_feasible"] == 9
    errors = [abs(r["error_pct"]) for r in report["configs"] if r["error_pct"] is not None]
    assert report["abs_error_pct_max"] == pytest.approx(max(errors)) and max(errors) < 10
    assert report["command"].startswith("python -m benchmarks.search.compose")
    assert "held out (measured, compared)" in text and "feasibility mismatches: 0 of 15" in text
    stored = Landscape.load(out_path)
    assert stored.design["kind"] == "composed" and len(stored.design["held_out"]) == 15
    assert len(stored.points) == 24


def _as_engine_side(run):
    """``run`` as a trial of its engine side alone would have measured it: no training
    (its parts, metrics and wall time), the step's throughput the rollout side's."""
    m = run.metrics
    train_s = m["train_end_at_s"] - m["train_start_at_s"]
    metrics = {
        k: v - train_s if k.endswith("_at_s") and v >= m["train_end_at_s"] else v
        for k, v in m.items()
        if not k.startswith(("old_log_prob", "ref_log_prob", "update_actor", "train_start", "train_end"))
        and k != "train_peak_memory_gib"
    }
    timings = {p: v for p, v in run.phase_timings_s.items() if p not in ACTOR_PHASES}
    step_s = engine_seconds(run)
    metrics |= {"engine_side_only": 1.0, "step_time_s": step_s, THROUGHPUT: m["step_tokens"] / step_s}
    return dataclasses.replace(run, metrics=metrics, phase_timings_s=timings, wall_s=run.wall_s - train_s)


def test_engine_sides_compose_with_the_bases_actor_side_as_their_whole_runs_did(full, space) -> None:
    sides = _sides_only(full, space)
    base = choose_base(space, space.grid(), {})
    arm = [p for p in sides.points if engine_side_only(p.config, base)]
    # The engine's arm: the 3 other engine settings beside the base's train setting; the
    # base and the 5 other train settings run whole.
    assert len(arm) == 3 and not engine_side_only(base, base)
    assert sum(engine_side_only(c, base) for c in make_design(space, k=15, seed=0)[1]) == 3
    as_sides = [
        LandscapePoint(p.config, [_as_engine_side(r) for r in p.runs]) if p in arm else p
        for p in sides.points
    ]
    whole, _ = compose(sides)
    composed, report = compose(dataclasses.replace(sides, points=as_sides))
    assert (report["sides"], report["engine_sides"], report["composed"]) == (9, 3, 15 + 3)
    base_run = next(p for p in sides.points if config_key(p.config) == config_key(base)).runs[0]
    for point in arm:
        key = config_key(point.config)
        got = next(p for p in composed.points if config_key(p.config) == key).runs[0]
        # What the engine side composes to is its whole run with the base's training in it
        want = compose_run(point.runs[0], base_run, "x")
        assert got.status == want.status == "ok"
        assert got.metrics[THROUGHPUT] == pytest.approx(want.metrics[THROUGHPUT], rel=1e-9)
        assert got.wall_s == pytest.approx(want.wall_s)
        assert got.phase_timings_s == want.phase_timings_s
        assert "engine_side_only" not in got.metrics
        # Its timeline has the training where a whole trial has it (the memory model reads a
        # phase's peak as finished by its mark; a reused rollout saves its engine's seconds).
        m, w = got.metrics, want.metrics
        assert m["train_start_at_s"] == pytest.approx(w["train_start_at_s"], abs=0.01)
        assert m["train_end_at_s"] == pytest.approx(w["train_end_at_s"], abs=0.01)
        assert engine_seconds(got) == pytest.approx(engine_seconds(want), abs=0.01)
        # What came after the training moved on by the base's training, not its own.
        trained = [
            r.metrics["train_end_at_s"] - r.metrics["train_start_at_s"] for r in (point.runs[0], base_run)
        ]
        assert m["engine_shutdown_at_s"] == pytest.approx(w["engine_shutdown_at_s"] - trained[0] + trained[1])
        assert key in composed.design["composed"] and key not in whole.design["composed"]
    assert "3 of them their engine side alone" in table(report)
    # A train setting measured as engine sides only (the base too) has no actor side.
    base_key = config_key(base)
    base_as_side = [
        LandscapePoint(p.config, [_as_engine_side(r) for r in p.runs])
        if p in arm or config_key(p.config) == base_key
        else p
        for p in sides.points
    ]
    with pytest.raises(DesignError, match="recorded as an engine side only"):
        compose(dataclasses.replace(sides, points=base_as_side))


def _rerun(run, scale: float):
    """``run`` measured again, its throughput ``scale`` times the first's."""
    return dataclasses.replace(run, metrics={**run.metrics, THROUGHPUT: run.metrics[THROUGHPUT] * scale})


def test_the_report_states_the_run_to_run_spread_its_errors_are_read_against(full, space) -> None:
    base = choose_base(space, space.grid(), {})
    ok = [p for p in full.points if p.runs[0].ok]
    arm = next(p for p in ok if engine_side_only(p.config, base))
    side = [_as_engine_side(r) for r in arm.runs]
    twice = {  # two whole configs measured twice (10% and 4% apart), an engine side (20%)
        config_key(ok[0].config): [*ok[0].runs, _rerun(ok[0].runs[0], 1.1)],
        config_key(ok[1].config): [*ok[1].runs, _rerun(ok[1].runs[0], 0.96)],
        config_key(arm.config): [*side, _rerun(side[0], 0.8)],
    }
    points = [LandscapePoint(p.config, twice.get(config_key(p.config), p.runs)) for p in full.points]
    _, report = compose(dataclasses.replace(full, points=points))
    whole, sides = report["run_spread"]["whole"], report["run_spread"]["engine_sides"]
    assert whole["configs"] == 2 and whole["pct_max"] == pytest.approx(100 * 0.1 / 1.05)
    assert whole["pct_median"] == pytest.approx((100 * 0.1 / 1.05 + 100 * 0.04 / 0.98) / 2)
    assert sides == {
        "configs": 1,
        "pct_median": pytest.approx(100 * 0.2 / 0.9),
        "pct_max": pytest.approx(100 * 0.2 / 0.9),
    }
    assert "run-to-run spread of a config's throughput, (max - min) / median: whole configs (2): " in table(
        report
    )
    assert "engine sides (1): median 22.2%, worst 22.2%" in table(report)
    # One run a config: no spread to state.
    _, once = compose(full)
    assert once["run_spread"]["whole"] == {"configs": 0, "pct_median": None, "pct_max": None}
    assert "run-to-run spread" not in table(once)


def test_a_recorder_says_what_is_left_by_kind_and_its_cost_at_the_medians_so_far(
    full, space, tmp_path, capsys
) -> None:
    job, out = tmp_path / "job.json", tmp_path / "sides.json"
    job.write_text(full.spec.model_dump_json())
    design, configs = recorded_design(out, space, 3, full.spec.seed, {})
    base = choose_base(space, space.grid(), {})
    measured = {config_key(p.config): p for p in full.points}
    arm = next(c for c in configs if engine_side_only(c, base))
    side = LandscapePoint(arm, [_as_engine_side(measured[config_key(arm)].runs[0])])
    whole = measured[config_key(base)]
    dataclasses.replace(full, points=[side, whole], design=design, **NOW).save(out)
    args = [str(job), str(out), "--design", "cross", "--held-out", "3", "--repeats", "2", "--left"]
    assert record_main(args) == 0
    said = capsys.readouterr().out
    # The cross of 9 (the base, 3 engine settings beside it, 5 train settings) and 3 held
    # out, twice each: 24 runs, 2 recorded; the 3 engine settings' runs are engine sides.
    assert "22 runs left: 5 engine sides, 17 whole" in said
    cost = 5 * side.runs[0].wall_s + 17 * whole.runs[0].wall_s
    assert f"about {cost:,.0f} GPU-seconds ({cost / 3600:.1f} GPU-hours)" in said
    # Every config runs once before any twice: 10 runs give each its first.
    first = 2 * side.runs[0].wall_s + 8 * whole.runs[0].wall_s
    assert f"Of them, 10 (2 engine sides, 8 whole, about {first:,.0f} GPU-seconds) give every config" in said
    assert Landscape.load(out).points[0].runs[0].wall_s == side.runs[0].wall_s  # nothing ran
    once = [  # every config run once: the second runs are left, no first one
        LandscapePoint(c, [_as_engine_side(measured[config_key(c)].runs[0])])
        if engine_side_only(c, base)
        else LandscapePoint(c, measured[config_key(c)].runs[:1])
        for c in configs
    ]
    dataclasses.replace(full, points=once, design=design, **NOW).save(out)
    assert record_main(args) == 0
    said = capsys.readouterr().out
    assert "12 runs left: 3 engine sides, 9 whole" in said and "Of them" not in said
    dataclasses.replace(full, points=[whole], design=design, **NOW).save(out)
    assert record_main(args) == 0
    assert (
        "23 runs left: 6 engine sides, 17 whole (no run of each kind recorded yet" in capsys.readouterr().out
    )


def test_missing_sides_are_named(full, space) -> None:
    sides = _sides_only(full, space)
    cut = dataclasses.replace(sides, points=sides.points[1:])
    with pytest.raises(DesignError, match="1 of the 9 configs on the cross are not recorded"):
        compose(cut)
    with pytest.raises(SystemExit):
        main([str(H200), "--base", "no.such.knob=1"])


def test_a_landscape_file_that_cannot_be_read_is_a_usage_error(tmp_path, capsys) -> None:
    missing, other = tmp_path / "missing.json", tmp_path / "other.json"
    other.write_text('{"runs": []}')
    for cli in (main, compare_main):
        with pytest.raises(SystemExit) as refused:
            cli([str(missing)])
        assert refused.value.code == 2
        assert f"cannot read landscape {missing}" in capsys.readouterr().err
        with pytest.raises(SystemExit):
            cli([str(other)])
        assert "not a landscape (format None, want 'autotuner-landscape')" in capsys.readouterr().err


def test_a_resumed_recording_keeps_its_design_and_refuses_another(full, space, tmp_path) -> None:
    out = tmp_path / "sides.json"
    design, configs = recorded_design(out, space, 3, 0, {})
    assert design["kind"] == "cross" and len(configs) == 9 + 3
    dataclasses.replace(full, points=[], design=design).save(out)
    assert Landscape.load(out).design == design
    assert recorded_design(out, space, 3, 0, {})[0] == design
    with pytest.raises(DesignError, match="another cross design"):
        recorded_design(out, space, 3, 1, {})
    full.save(tmp_path / "full.json")
    with pytest.raises(DesignError, match="holds no cross design"):
        recorded_design(tmp_path / "full.json", space, 3, 0, {})


def test_the_recorder_refuses_to_fill_a_cross_design_with_the_whole_grid(full, tmp_path, capsys) -> None:
    job, out = tmp_path / "job.json", tmp_path / "sides.json"
    job.write_text(full.spec.model_dump_json())
    dataclasses.replace(full, points=[], design={"kind": "cross"}).save(out)
    with pytest.raises(SystemExit):
        record_main([str(job), str(out)])
    assert "holds a cross design; record into it with --design cross" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        record_main([str(job), str(tmp_path / "new.json"), "--base", f"{GMU}=0.8"])
    assert "add --design cross" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        record_main([str(job), str(tmp_path / "new.json"), "--design", "cross", "--held-out", "-1"])
    assert "--held-out -1: want 0 or more" in capsys.readouterr().err


def test_a_comparison_on_a_composed_landscape_names_the_composition(full, space) -> None:
    sides = _sides_only(full, space)
    # Two held-out configs measured beside the sides, as a cross design records them.
    held = [p for p in full.points if p not in sides.points and p.runs[0].ok][:2]
    composed, report = compose(dataclasses.replace(sides, points=sides.points + held))
    assert (report["composed"], report["held_out"]) == (13, 2)
    result = compare(composed, ["random"], seeds=1)
    assert result["landscape"]["composed"] == 13
    assert result["landscape"]["composition"]["held_out"] == 2
    assert "composed: 13 of 24 configs from measured sides; on 2 held-out configs" in compare_table(result)
    plain = compare(full, ["random"], seeds=1)
    assert plain["landscape"]["composed"] == 0 and "composed:" not in compare_table(plain)


def test_the_report_names_the_kinds_of_host_its_runs_come_from(full) -> None:
    _, once = compose(full)  # runs that recorded no host: one kind, nothing to say
    assert once["hosts"] == {"not recorded": sum(len(p.runs) for p in full.points)}
    assert "kinds of host" not in table(once)

    def on(run, cpus: str):
        return dataclasses.replace(run, software={"cpu": "Test CPU", "host_cpus": cpus, "cpu_cores": cpus})

    points = [
        LandscapePoint(p.config, [on(r, "16" if n < 5 else "32") for r in p.runs])
        for n, p in enumerate(full.points)
    ]
    _, report = compose(dataclasses.replace(full, points=points))
    small = sum(len(p.runs) for p in full.points[:5])
    assert report["hosts"] == {
        "Test CPU, 16 CPUs": small,
        "Test CPU, 32 CPUs": sum(len(p.runs) for p in full.points) - small,
    }
    assert f"runs from 2 kinds of host (Test CPU, 16 CPUs: {small}; Test CPU, 32 CPUs: " in table(report)
