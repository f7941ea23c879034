"""Phase composition (autotuner.compose) and its place in the study loop, on the real H200
landscape (benchmarks/search/landscapes/qwen2.5-1.5b-h200.json: 24 configs of a
Qwen2.5-1.5B rollout + train job, each measured on an H200) replayed by ReplayExecutor."""

from __future__ import annotations

import statistics

import optuna
import pytest

from autotuner.api.schemas import TrialPublic
from autotuner.compose import (
    ACTOR_PHASES,
    ENGINE_PHASES,
    THROUGHPUT,
    best_composition,
    engine_seconds,
    next_engine_side,
    side_of,
)
from autotuner.knobs import A, R
from autotuner.proposals import (
    BaselineRepeats,
    Composition,
    EngineExploration,
    Sampler,
    fastest_rollout,
)
from autotuner.records import TrialRecord, records
from autotuner.replay import Landscape, ReplayExecutor
from autotuner.reuse import rollout_key
from autotuner.samplers import make_sampler
from autotuner.space import SearchSpace
from autotuner.spec import JobSpec
from autotuner.study import StudyRunner, config_key, open_study

from .conftest import REPO, dumped_job

optuna.logging.set_verbosity(optuna.logging.WARNING)
H200 = REPO / "benchmarks" / "search" / "landscapes" / "qwen2.5-1.5b-h200.json"
JOB_7B = REPO / "benchmarks" / "results" / "qwen2-7b-grpo-8gpu-job-h200.json"
GMU, SEQS = R + "gpu_memory_utilization", R + "max_num_seqs"
MICRO, LOG_PROB = A + "ppo_micro_batch_size_per_gpu", R + "log_prob_micro_batch_size_per_gpu"
OFFLOAD = A + "fsdp_config.param_offload"
SEARCHED = {GMU: [0.5, 0.8], MICRO: [4, 16], OFFLOAD: [False, True]}


@pytest.fixture(scope="module")
def landscape() -> Landscape:
    return Landscape.load(H200)


def _rec(
    number: int,
    gmu: float,
    micro: int,
    engine_s: float,
    actor_s: float,
    offload: bool = False,
    tokens_per_gpu: float = 1.0e6,
) -> TrialRecord:
    timings = {
        "startup": 60.0,
        "weight_sync": 0.5,
        "rollout": engine_s - 3.0,
        "rollout_poll": 0.5,  # verl's replay buffer sees the rollout at its next poll
        "engine_sleep": 1.0,
        "engine_wake": 1.0,
        "old_log_prob": actor_s / 4,
        "ref_log_prob": actor_s / 4,
        "update_actor": actor_s / 2,
        "actor_reload": 0.0,
    }
    return TrialRecord(
        number,
        "ok",
        config={GMU: gmu, MICRO: micro, OFFLOAD: offload},
        metrics={THROUGHPUT: tokens_per_gpu / (engine_s + actor_s)},
        phase_timings_s=timings,
    )


def test_the_phase_lists_cover_a_step() -> None:
    rec = _rec(0, 0.5, 4, 50.0, 100.0)
    assert sum(rec.phase_timings_s[p] for p in ENGINE_PHASES + ACTOR_PHASES) == pytest.approx(150.0)


def test_a_measured_engine_side_and_a_measured_train_side_compose_into_the_unmeasured_best() -> None:
    recs = [
        _rec(0, 0.5, 4, engine_s=60.0, actor_s=100.0),  # slow engine, fast training
        _rec(1, 0.8, 16, engine_s=40.0, actor_s=150.0),
    ]  # fast engine, slow training
    best = best_composition(recs, SEARCHED, set(), config_key)
    assert best is not None and (best.engine_from, best.actor_from) == (1, 0)
    assert best.params == {GMU: 0.8, MICRO: 4, OFFLOAD: False}
    assert best.predicted_throughput == pytest.approx(1.0e6 / (40.0 + 100.0))
    # once run (or excluded), the other unmeasured combination is next
    nxt = best_composition(recs, SEARCHED, {config_key(best.params)}, config_key)
    assert nxt is not None and nxt.params == {GMU: 0.5, MICRO: 16, OFFLOAD: False}
    assert (
        best_composition(recs, SEARCHED, {config_key(best.params), config_key(nxt.params)}, config_key)
        is None
    )


def test_sides_with_a_different_actor_offload_do_not_compose() -> None:
    recs = [_rec(0, 0.5, 4, 60.0, 100.0, offload=False), _rec(1, 0.8, 16, 40.0, 150.0, offload=True)]
    assert best_composition(recs, SEARCHED, set(), config_key) is None


def test_with_vllm_an_engine_side_composes_with_a_train_side_of_another_offload() -> None:
    """vLLM's budget is a share of the whole device, so the offload is the train side's."""
    recs = [_rec(0, 0.5, 4, 60.0, 100.0, offload=False), _rec(1, 0.8, 16, 40.0, 150.0, offload=True)]
    best = best_composition(recs, SEARCHED, set(), config_key, offload_shapes_rollout=False)
    assert best is not None and (best.engine_from, best.actor_from) == (1, 0)
    assert best.params == {GMU: 0.8, MICRO: 4, OFFLOAD: False}  # the offload of the train side
    assert best.predicted_throughput == pytest.approx(1.0e6 / (40.0 + 100.0))
    # engine sides measured beside either offload count as one side, by their median
    recs.append(_rec(2, 0.8, 4, 50.0, 120.0, offload=True))
    best = best_composition(recs, SEARCHED, set(), config_key, offload_shapes_rollout=False)
    assert best is not None and best.params == {GMU: 0.8, MICRO: 4, OFFLOAD: False}
    assert best.predicted_throughput == pytest.approx(1.0e6 / (45.0 + 100.0))


def test_on_the_7b_job_the_fastest_train_side_composes_across_the_offload_at_once() -> None:
    """The Qwen2-7B job on one H200 (real data, vLLM, 2026-11-28). Trial 5 measured the
    fastest train side of the job's first six trials (no checkpointing, the optimizer
    offloaded) behind a slow engine side, and none of the engine sides measured by then
    offloaded the optimizer. Composed only with the same offload, that train side waited for
    trial 15's engine side (trial 18, the job's best). Composed across it, it is queued at
    once behind verl's example's engine side, predicted beyond the noise band over the best
    measured, and within 1% of what trial 18 measured with it."""
    spec, recs = dumped_job(JOB_7B)
    by_number = {r.number: r for r in recs}
    # vLLM's KV cache at gpu_memory_utilization 0.6 with up to 8192 batched tokens (more
    # tokens a batch leave less for it), beside each offload: within 0.5%
    same_engine = [
        r
        for r in recs
        if r.feasible and r.config[GMU] == 0.6 and r.config[R + "max_num_batched_tokens"] <= 8192
    ]
    kv = [r.metrics["kv_cache_tokens"] for r in same_engine]
    offloads = {(r.config[OFFLOAD], r.config[A + "fsdp_config.optimizer_offload"]) for r in same_engine}
    assert len(kv) >= 3 and max(kv) / min(kv) < 1.005 and len(offloads) >= 2
    searched = {p: [] for r in recs for p in r.config if len({repr(q.config.get(p)) for q in recs}) > 1}
    first = [r for r in recs if r.number <= 5]
    taken = {config_key({p: r.config[p] for p in searched if p in r.config}) for r in first}
    best_measured = max(r.metrics[THROUGHPUT] for r in first if r.feasible)
    band = 1 + spec.budget.noise_band_pct / 100
    same = best_composition(first, searched, taken, config_key)
    assert same is None or same.predicted_throughput <= best_measured * band
    across = best_composition(first, searched, taken, config_key, offload_shapes_rollout=False)
    assert across is not None and across.actor_from == 5 and across.engine_from == 1
    assert across.predicted_throughput > best_measured * band
    winner = by_number[18]
    assert winner.composed_from == [15, 5]
    assert abs(across.predicted_throughput / winner.metrics[THROUGHPUT] - 1) < 0.01


def test_failed_runs_and_runs_without_both_sides_do_not_compose() -> None:
    oom = _rec(0, 0.8, 16, 40.0, 150.0)
    oom.status = "oom"
    train_only = _rec(1, 0.8, 16, 40.0, 150.0)
    train_only.phase_timings_s = {p: v for p, v in train_only.phase_timings_s.items() if p in ACTOR_PHASES}
    assert (
        best_composition([_rec(2, 0.5, 4, 60.0, 100.0), oom, train_only], SEARCHED, set(), config_key) is None
    )


def test_the_next_engine_side_is_untried_and_paired_with_the_best_train_side() -> None:
    recs = [_rec(0, 0.5, 16, 60.0, 150.0), _rec(1, 0.5, 4, 60.0, 100.0)]
    side, best = next_engine_side(recs, SEARCHED, [r.config for r in recs], order_seed=0)
    assert side == {GMU: 0.8} and best.number == 1
    assert next_engine_side(recs, SEARCHED, [r.config for r in recs] + [{GMU: 0.8}], 0) is None
    wide = SEARCHED | {GMU: [0.1 * k for k in range(1, 10)], SEQS: [64, 128, 256, 512]}  # 36 sides
    assert next_engine_side(recs, wide, [], 0) is None
    assert next_engine_side([], SEARCHED, [], 0) is None


def _replayed(landscape: Landscape, seed: int, sources=None, **budget):
    data = landscape.spec.model_dump(mode="json") | {"seed": seed}
    data["budget"] |= {"max_trials": len(landscape.points), "max_minutes": 7 * 24 * 60, **budget}
    spec = JobSpec.model_validate(data)
    space = SearchSpace.build(spec, landscape.arch, landscape.device)
    study = optuna.create_study(
        storage=optuna.storages.InMemoryStorage(),
        directions=[o.resolved_direction for o in spec.objectives],
        sampler=make_sampler(spec.sampler, spec.seed),
    )
    executor = ReplayExecutor(landscape)
    runner = StudyRunner(
        spec,
        study,
        space,
        executor,
        landscape.device,
        landscape.memory_cap_gib,
        memory_model=StudyRunner.default_memory_model(spec, space, landscape.memory_cap_gib),
        infer_feasibility=True,
        **({"sources": sources} if sources is not None else {}),
    )
    runner.enqueue_baseline()
    return runner, study, executor


def _cost_to_best(landscape: Landscape, executor: ReplayExecutor) -> float:
    best = max(p.runs[0].metrics.get(THROUGHPUT) or 0.0 for p in landscape.points)
    cost = 0.0
    for _, _point, run, trial_cost in executor.history:
        cost += trial_cost
        if (run.metrics.get(THROUGHPUT) or 0.0) >= best:
            return cost
    return float("inf")


def test_on_the_h200_landscape_the_study_composes_its_way_to_the_best_in_a_quarter_of_the_grid(
    landscape,
) -> None:
    grid = sum(p.runs[0].wall_s for p in landscape.points)
    costs = []
    for seed in range(5):
        runner, study, executor = _replayed(landscape, seed)
        runner.run()
        costs.append(_cost_to_best(landscape, executor))
        recs = records(study)
        composed = [r for r in recs if r.composed_from or r.explores_with is not None]
        assert composed, f"seed {seed}: nothing was composed or explored"
        for r in composed:  # each names measured trials, and says so in the API
            named = r.composed_from or [r.explores_with]
            assert all(recs[n].status == "ok" for n in named), (r.number, named)
            public = TrialPublic.of(r)
            assert (public.composed_from, public.explores_with) == (r.composed_from, r.explores_with)
    assert statistics.median(costs) <= 0.25 * grid, costs


def test_without_composition_the_same_study_needs_more(landscape) -> None:
    grid = sum(p.runs[0].wall_s for p in landscape.points)
    costs = []
    for seed in range(5):
        runner, study, executor = _replayed(landscape, seed, compose_phases=False)
        runner.run()
        costs.append(_cost_to_best(landscape, executor))
        assert not [t for t in study.get_trials(deepcopy=False) if "composed_from" in t.user_attrs]
    assert statistics.median(costs) > 0.25 * grid, costs


def _swapped_train_sides(landscape: Landscape) -> Landscape:
    """The H200 landscape with the train sides of micro-batches (4, 4) and (16, 16) swapped
    under every engine setting (phase timings, step time and throughput recomputed), so that
    verl's defaults' train side is no longer the fastest: the engine-side exploration pairs
    every engine setting with a slow train side, and only a composition finds the best."""
    out = Landscape.from_dict(landscape.to_dict())
    sides = {}
    for point in out.points:
        c = point.config
        sides[(c[GMU], c[SEQS], c[MICRO], c[LOG_PROB])] = point
    for (gmu, seqs, micro, lp), point in sides.items():
        if (micro, lp) != (4, 4):
            continue
        other = sides[(gmu, seqs, 16, 16)]
        a, b = point.runs[0], other.runs[0]
        for p in ACTOR_PHASES:
            ta, tb = a.phase_timings_s.get(p, 0.0), b.phase_timings_s.get(p, 0.0)
            a.phase_timings_s[p], b.phase_timings_s[p] = tb, ta
        for run in (a, b):
            tokens_per_gpu = run.metrics[THROUGHPUT] * run.metrics["step_time_s"]
            run.metrics["step_time_s"] = sum(v for k, v in run.phase_timings_s.items() if k != "startup")
            run.metrics[THROUGHPUT] = tokens_per_gpu / run.metrics["step_time_s"]
    return out


def test_a_composition_pairs_a_measured_engine_side_with_a_train_side_found_later(landscape) -> None:
    swapped = _swapped_train_sides(landscape)
    best = max(swapped.points, key=lambda p: p.runs[0].metrics.get(THROUGHPUT) or 0.0)
    assert (best.config[MICRO], best.config[LOG_PROB]) == (16, 16)
    hits = []
    for seed in (1, 2, 4):
        # without the train-side exploration, which would run some of these configs itself
        sources = [BaselineRepeats(), Composition(), EngineExploration(), Sampler()]
        runner, study, executor = _replayed(swapped, seed, sources)
        runner.run()
        recs = records(study)
        composed = [r for r in recs if r.composed_from]
        assert composed, f"seed {seed}: nothing composed"
        for r in composed:
            engine_from, actor_from = (recs[n] for n in r.composed_from)
            assert engine_from.status == actor_from.status == "ok"
            assert max(r.composed_from) < r.number
            assert (r.config[GMU], r.config[SEQS]) == (engine_from.config[GMU], engine_from.config[SEQS])
            train = (actor_from.config[MICRO], actor_from.config[LOG_PROB])
            assert (r.config[MICRO], r.config[LOG_PROB]) == train
            assert TrialPublic.of(r).composed_from == r.composed_from
        hits += [r for r in composed if config_key(r.config) == config_key(best.config)]
    assert hits  # seed 4: the best config, run as a composition


def test_the_fastest_rollout_is_the_reusable_engine_side_with_the_least_engine_time() -> None:
    asleep = {"engine_asleep_gib": 1.0, "rollout_makespan_s": 10.0}
    slow, fast, fast_again = (
        _rec(0, 0.5, 4, 40.0, 30.0),
        _rec(1, 0.8, 4, 20.0, 30.0),
        _rec(2, 0.8, 16, 24.0, 9.0),
    )
    cannot = _rec(3, 0.6, 4, 5.0, 30.0)  # no rollout metrics: its rollout cannot be taken over
    failed = _rec(4, 0.7, 4, 5.0, 30.0)
    failed.status = "oom"
    for rec in (slow, fast, fast_again, failed):
        rec.metrics |= asleep
    assert fastest_rollout([slow, cannot, failed]).number == 0
    # trials 1 and 2 share an engine side: the median of their engine times, and the first of them
    assert fastest_rollout([slow, fast, fast_again, cannot, failed]).number == 1
    assert fastest_rollout([cannot, failed]) is None


def _kinds(recs: list[TrialRecord]) -> str:
    """The trials in order, one letter each: why each ran (B: baseline, E: a new engine side,
    C: a composition, T: the sampler's train side behind a measured rollout, S: the sampler's,
    R: a re-measurement or a re-run)."""
    out = ""
    for r in recs:
        if r.baseline:
            out += "B"
        elif r.repeat_of is not None or r.retry_of is not None:
            out += "R"
        elif r.explores_with is not None:
            out += "E"
        elif r.composed_from:
            out += "C"
        elif r.trains_behind is not None:
            out += "T"
        else:
            out += "S"
    return out


def test_the_samplers_train_sides_run_behind_the_fastest_rollout_every_other_time(landscape) -> None:
    """Once every engine side was tried, every other proposal of the sampler's runs with the
    fastest rollout's engine knobs (and the actor's offload) and the sampler's train knobs; it
    reuses that rollout and costs its training only. On the landscape whose best train side
    is not verl's defaults', the study reaches the best as often as without it."""
    swapped = _swapped_train_sides(landscape)
    best = max(p.runs[0].metrics.get(THROUGHPUT) or 0.0 for p in swapped.points)
    walls = {config_key(p.config): p.runs[0].wall_s for p in swapped.points}
    behind_total = reached = 0
    for seed in range(4):
        runner, study, executor = _replayed(swapped, seed)
        runner.run()
        recs = records(study)
        kinds = _kinds(recs)
        # after the engine-side exploration, alternating with the sampler's own proposals
        searched = kinds[kinds.rindex("E") + 1 :].replace("C", "").replace("R", "")
        assert "TT" not in searched and "SS" not in searched, kinds
        costs: dict[str, list[float]] = {}  # a config's runs' costs (a finalist's re-runs are full)
        for _, point, _, cost in executor.history:
            costs.setdefault(config_key(point.config), []).append(cost)
        for r in recs:
            if r.trains_behind is None:
                continue
            behind_total += 1
            donor = recs[r.trains_behind]
            assert TrialPublic.of(r).trains_behind == donor.number
            assert {p: v for p, v in r.config.items() if side_of(p) != "actor"} == {
                p: v for p, v in donor.config.items() if side_of(p) != "actor"
            }
            sides: dict[str, list[float]] = {}  # the rollouts measured before: their medians
            for q in recs[: r.number]:
                if q.status == "ok" and "engine_asleep_gib" in q.metrics:
                    sides.setdefault(rollout_key(q.config), []).append(engine_seconds(q))
            medians = {key: statistics.median(seconds) for key, seconds in sides.items()}
            assert medians[rollout_key(donor.config)] == min(medians.values())
            if r.status == "ok":  # it took over a rollout of the same engine side, for less
                taken = recs[int(r.metrics["rollout_reused_from_trial"])]
                assert rollout_key(taken.config) == rollout_key(r.config)
                assert min(costs[config_key(r.config)]) < walls[config_key(r.config)]
        found = max(r.metrics.get(THROUGHPUT) or 0.0 for r in recs if r.status == "ok")
        reached += found >= 0.97 * best
    assert behind_total >= 8
    assert reached >= 3  # as without it: one seed of these four finds no config within 3%


def test_without_rollout_reuse_no_train_side_runs_behind_another_rollout(landscape) -> None:
    runner, study, _ = _replayed(_swapped_train_sides(landscape), 0, reuse_rollouts=False)
    runner.run()
    recs = records(study)
    assert len(recs) > 10 and all(r.trains_behind is None for r in recs)
    assert "T" not in _kinds(recs)


class _SlowReplay(ReplayExecutor):
    """Replays as ReplayExecutor does, each trial answering only at its ``polls``-th wait:
    trials stay in flight while the loop proposes."""

    polls: int = 3

    def __post_init__(self) -> None:
        super().__post_init__()
        self._in_flight: list[list] = []

    def wait(self, timeout_s: float) -> list:
        for result in super().wait(0.0):
            self._in_flight.append([result, self.polls])
        done = [r for r, n in self._in_flight if n <= 1]
        self._in_flight = [[r, n - 1] for r, n in self._in_flight if n > 1]
        return done


def _four_configs(landscape: Landscape, tmp_path, executor: ReplayExecutor):
    data = landscape.spec.model_dump(mode="json")
    data["search"] |= {MICRO: {"fixed": 4}, LOG_PROB: {"fixed": 4}}
    data["budget"] |= {
        "max_trials": 6,
        "max_concurrent_trials": 4,
        "patience_trials": 0,
        "remeasure_finalists": 0,
        "compose_phases": False,
    }
    spec = JobSpec.model_validate(data)
    space = SearchSpace.build(spec, landscape.arch, landscape.device)
    assert len(space.grid()) == 4
    study = open_study(spec, "in-flight", f"sqlite:///{tmp_path / 'db.sqlite'}")
    runner = StudyRunner(
        spec, study, space, executor, landscape.device, landscape.memory_cap_gib, infer_feasibility=False
    )
    return runner, study


def test_a_small_space_ends_once_every_config_is_measured_without_duplicate_proposals(
    landscape, tmp_path
) -> None:
    """Four configs, four trials at once, six allowed: the loop stops proposing once all
    four are in flight and ends when they are measured, with a few duplicate records at most
    (a proposal equal to a trial in flight makes it wait for a result); it used to ask the
    sampler until 200 proposals in a row repeated a config, recording each."""
    runner, study = _four_configs(landscape, tmp_path, _SlowReplay(landscape))
    summary = runner.run()
    recs = records(study)
    assert summary.measured == 4
    assert summary.stop_reason.startswith("search space exhausted: all 4 configs"), summary.stop_reason
    assert len({config_key(r.config) for r in recs if r.measured}) == 4
    duplicates = [r for r in recs if r.status == "duplicate"]
    assert len(duplicates) <= 8, len(duplicates)


def test_proposals_equal_to_trials_in_flight_wait_for_a_result(landscape, tmp_path, monkeypatch) -> None:
    """The same, the space too large to list (as a real one often is): a proposal equal to a
    trial in flight is one ``duplicate`` record, then the loop waits for a result before
    asking again; it measures all four (it used to ask on, up to 200 times in a row, and
    could call the space exhausted with configs unmeasured)."""
    monkeypatch.setattr("autotuner.study.GRID_LISTED_UP_TO", 0)
    runner, study = _four_configs(landscape, tmp_path, _SlowReplay(landscape))
    summary = runner.run()
    recs = records(study)
    assert summary.measured == 4
    in_flight = [r for r in recs if r.status == "duplicate" and r.duplicate_of is None]
    assert len(in_flight) <= 4, len(in_flight)
