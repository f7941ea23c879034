"""The tie rule: a difference inside the measured noise is a tie, wherever it is reported."""

from __future__ import annotations

import pytest

from autotuner.cli import _noise_lines
from autotuner.noise import Noise, Verdict, compare, pooled_spread_pct, spread_pct, tie_band_pct, versus
from autotuner.records import TrialRecord, TrialStatus
from autotuner.spec import JobSpec
from autotuner.summary import choose, summarize
from trials.metrics import PEAK_MEMORY, THROUGHPUT


def test_spread_is_range_over_median() -> None:
    assert spread_pct([100.0, 104.0, 102.0]) == pytest.approx(100 * 4 / 102)
    assert spread_pct([100.0]) is None and spread_pct([0.0, 0.0]) is None


def test_spreads_pool_weighted_by_runs_less_one() -> None:
    # 3 runs (weight 2) at 4/102, 2 runs (weight 1) at 10/105; a single run adds nothing.
    pooled, groups, runs = pooled_spread_pct([[100.0, 104.0, 102.0], [100.0, 110.0], [50.0]])
    assert pooled == pytest.approx((2 * 400 / 102 + 1000 / 105) / 3)
    assert (groups, runs) == (2, 5)
    assert pooled_spread_pct([[7.0]]) == (None, 0, 0)


@pytest.mark.parametrize(
    ("a", "b", "band", "verdict"),
    [
        (103.0, 100.0, 3.0, Verdict.TIE),  # 2.9% of the larger: inside
        (100.0, 103.0, 3.0, Verdict.TIE),
        (104.0, 100.0, 3.0, Verdict.FASTER),  # 3.8%: outside
        (100.0, 104.0, 3.0, Verdict.SLOWER),
        (104.0, 100.0, 4.0, Verdict.TIE),  # a wider band turns it into a tie
        (100.0, 0.0, 3.0, Verdict.FASTER),  # a baseline that ran out of memory
        (0.0, 0.0, 3.0, Verdict.TIE),
    ],
)
def test_a_difference_inside_the_band_is_a_tie(a, b, band, verdict) -> None:
    assert compare(a, b, band) is verdict


def test_the_band_is_the_largest_of_floor_measured_noise_and_the_figures_spreads() -> None:
    assert Noise(2.0).band_pct == 2.0 and "not measured" in Noise(2.0).describe()
    measured = Noise.of(2.0, [[100.0, 105.0, 102.0]])
    assert measured.band_pct == pytest.approx(500 / 102) and measured.runs == 3
    assert tie_band_pct(measured, 1.0, None) == pytest.approx(500 / 102)
    assert tie_band_pct(measured, 9.0) == 9.0
    assert versus(1.01, Verdict.TIE, 4.9, "verl's defaults").startswith("ties verl's defaults (1.01x")
    assert versus(1.25, Verdict.FASTER, 4.9, "verl's defaults") == "1.25x verl's defaults"


def _spec(floor_pct: float = 2.0) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "noise",
            "workload": {"model": "tiny", "phases": "train"},
            "cluster": {"device": "cpu"},
            "budget": {"noise_band_pct": floor_pct},
        }
    )


def _trial(number: int, tput: float, peak: float = 1.0, **attrs) -> TrialRecord:
    return TrialRecord(
        number=number,
        status=TrialStatus.OK,
        metrics={THROUGHPUT: tput, PEAK_MEMORY: peak},
        device="cpu",
        **attrs,
    )


def _job(winner: list[float], defaults: list[float], other: list[float] | None = None) -> list[TrialRecord]:
    """verl's defaults as trial 0, a finalist as trial 1 (and another as trial 2), each
    with its re-runs as later trials."""
    recs = [_trial(0, defaults[0], peak=3.0, baseline="verl-v0.9-defaults"), _trial(1, winner[0], peak=2.0)]
    if other is not None:
        recs.append(_trial(2, other[0], peak=1.5))
    number = len(recs)
    for original, values in ((0, defaults), (1, winner), (2, other or [])):
        for v in values[1:]:
            peak = recs[original].metrics[PEAK_MEMORY]
            recs.append(_trial(number, v, peak=peak, repeat_of=original))
            number += 1
    return recs


def test_a_gain_inside_the_baselines_noise_is_reported_as_a_tie() -> None:
    # The defaults' three runs spread 6%; the winner's median is 4% above theirs.
    summary = summarize(_spec(), _job([104.0, 104.5, 103.5], [100.0, 97.0, 103.0]), "done")
    assert summary.noise_pct == pytest.approx(6.0) and summary.noise_runs == 3
    assert summary.tie_band_pct == pytest.approx(6.0)
    assert summary.gain_over_baseline == pytest.approx(1.04)
    assert summary.verdict_over_baseline == Verdict.TIE
    assert "ties it" in summary.versus_lines()[0]
    assert "median of 3 runs" in summary.versus_lines()[0]


def test_a_gain_beyond_the_noise_is_a_gain() -> None:
    summary = summarize(_spec(), _job([125.0, 126.0, 124.0], [100.0, 97.0, 103.0]), "done")
    assert summary.verdict_over_baseline == Verdict.FASTER
    assert summary.baselines["verl-v0.9-defaults"]["verdict"] == Verdict.FASTER
    assert "1.25x" in summary.versus_lines()[0]


def test_without_repeats_the_floor_decides_and_the_noise_is_unmeasured() -> None:
    summary = summarize(_spec(floor_pct=2.0), _job([101.0], [100.0]), "done")
    assert summary.noise_pct is None and summary.tie_band_pct == 2.0
    assert summary.verdict_over_baseline == Verdict.TIE
    assert "not measured" in summary.noise_line()


def test_finalists_inside_the_measured_noise_tie_and_the_best_median_still_wins() -> None:
    # Finalists 1 (median 100, 2.0 GiB) and 2 (median 96, 1.5 GiB): 4% apart. The floor (2%)
    # and their own spreads (1%) separate them; the baselines' 6% spread ties them. A tie is
    # reported, but memory decides only within the floor: the best median wins.
    recs = _job([100.0, 100.5, 99.5], [80.0, 77.6, 82.4], other=[96.0, 96.5, 95.5])
    winner, tied = choose(_spec(), recs)
    assert winner is not None and winner.trial.number == 1 and tied == [2]
    quiet = _job([100.0, 100.5, 99.5], [80.0, 80.4, 79.6], other=[96.0, 96.5, 95.5])
    winner, tied = choose(_spec(), quiet)
    assert winner is not None and winner.trial.number == 1 and tied == []


def test_the_summary_names_the_band_each_tie_was_called_in() -> None:
    # The baselines' noise is 4%; the best median's own runs (trial 1: 100 +- 5) spread
    # 10%, so the finalists tie within 10% of it: trial 2 (92, the least memory) wins, tied
    # with trial 1 and verl's defaults (94). The page names that 10% band, not the job's 4%.
    recs = _job([100.0, 105.0, 95.0], [94.0, 92.0, 95.76], other=[92.0, 92.5, 91.5])
    summary = summarize(_spec(), recs, "done")
    assert summary.tie_band_pct == pytest.approx(4.0, abs=0.1)
    assert summary.best == 2 and summary.tied_with == [0, 1]
    assert summary.tied_band_pct == pytest.approx(10.0)
    # Against verl's defaults, the band of that comparison (here the job's).
    defaults = summary.baselines["verl-v0.9-defaults"]
    assert summary.verdict_over_baseline == Verdict.TIE
    assert summary.band_over_baseline == pytest.approx(defaults["tie_band_pct"])
    # Without a tie there is no tied band.
    alone = summarize(_spec(), _job([125.0, 126.0, 124.0], [100.0, 97.0, 103.0]), "done")
    assert alone.tied_with == [] and alone.tied_band_pct is None


def test_within_the_floor_the_smaller_finalist_wins() -> None:
    # 1% apart, inside the 2% floor the user is indifferent to: the least memory wins.
    recs = _job([100.0, 100.5, 99.5], [80.0, 80.4, 79.6], other=[99.0, 99.5, 98.5])
    winner, tied = choose(_spec(), recs)
    assert winner is not None and winner.trial.number == 2 and tied == [1]


def _costed(defaults: list[float]) -> list[TrialRecord]:
    """verl's defaults (trial 0, re-run as trials 4 and 5), a slow trial 1, trial 2 at 96 and
    the winner, trial 3, at 100 (one run each); trial n's run cost 10 x (n + 1) GPU-seconds."""
    values = [(defaults[0], {"baseline": "verl-v0.9-defaults"}), (90.0, {}), (96.0, {}), (100.0, {})]
    values += [(v, {"repeat_of": 0}) for v in defaults[1:]]
    return [_trial(n, v, wall_s=10.0 * (n + 1), gpus=1, **attrs) for n, (v, attrs) in enumerate(values)]


def test_the_cost_to_a_config_inside_the_winners_tie_band_is_reported() -> None:
    # The defaults' runs spread 6%: trial 2, 4% below the winner, ties it; the slower 1 does not.
    summary = summarize(_spec(), _costed([80.0, 77.6, 82.4]), "done")
    assert summary.best == 3 and summary.first_tied == 2
    assert summary.gpu_seconds_to_best == pytest.approx(10 + 20 + 30 + 40)
    assert summary.gpu_seconds_to_tie == pytest.approx(10 + 20 + 30)
    assert "a config inside its tie band (trial 2) after 60 (1.0 GPU-minutes)" in summary.cost_line()
    # Quiet baselines (1% spread) leave the 2% floor: 4% apart is no tie, the winner is the first.
    quiet = summarize(_spec(), _costed([80.0, 80.4, 79.6]), "done")
    assert quiet.best == 3 and quiet.first_tied == 3
    assert quiet.gpu_seconds_to_tie == quiet.gpu_seconds_to_best
    assert "tie band (trial" not in quiet.cost_line()
    # A figure's own spread widens its band too: trial 2 at 96 with runs 92-100 (8.3%) ties.
    spread = _costed([80.0, 80.4, 79.6]) + [
        _trial(6, 92.0, wall_s=5.0, repeat_of=2),
        _trial(7, 100.0, repeat_of=2),
    ]
    assert summarize(_spec(), spread, "done").first_tied == 2


def test_where_a_baseline_ties_the_winner_the_searchs_own_first_tied_config_is_reported() -> None:
    # verl's defaults at 99 (runs 95-100, a 5% band) tie the winner, trial 3 at 100: the first
    # config inside its band is that baseline; the search's own first is trial 2 at 96.
    summary = summarize(_spec(), _costed([99.0, 95.0, 100.0]), "done")
    assert (summary.best, summary.first_tied, summary.first_tied_proposed) == (3, 0, 2)
    assert summary.gpu_seconds_to_tie == pytest.approx(10)
    assert summary.gpu_seconds_to_tie_proposed == pytest.approx(10 + 20 + 30)
    line = summary.cost_line()
    assert "a config inside its tie band (trial 0) after 10 (0.2 GPU-minutes)" in line, line
    assert "the search's first config inside the winner's tie band (trial 2) after 60 (1.0" in line, line
    # The winner is verl's defaults (median 101): the search's first config inside its band.
    won = summarize(_spec(), _costed([101.0, 99.0, 103.0]), "done")
    assert (won.best, won.first_tied, won.first_tied_proposed) == (0, 0, 3)
    assert "the search's first config inside the winner's tie band (trial 3) after 100" in won.cost_line()
    # Where the first tied config is the search's own, nothing more is said.
    own = summarize(_spec(), _costed([80.0, 77.6, 82.4]), "done")
    assert own.first_tied == own.first_tied_proposed == 2
    assert "the search's first" not in own.cost_line()


def test_runs_from_several_kinds_of_host_are_named() -> None:
    def on(cpus: str) -> dict[str, str]:
        return {"cpu": "Test CPU", "host_cpus": cpus, "cpu_cores": cpus}

    recs = _job([125.0, 126.0, 124.0], [100.0, 97.0, 103.0])
    alone = summarize(_spec(), recs, "done")
    assert alone.hosts == {} and alone.hosts_line() is None  # no run recorded its host
    for r in recs:
        r.software = on("32" if r.number % 2 else "16")
    skipped = TrialRecord(number=len(recs), status=TrialStatus.PREDICTED_OOM, software=on("64"))
    recs.append(skipped)  # never ran: no host's run
    summary = summarize(_spec(), recs, "done")
    assert summary.hosts == {"Test CPU, 16 CPUs": 3, "Test CPU, 32 CPUs": 3}
    line = summary.hosts_line()
    assert line is not None and line.startswith(
        "hosts: the runs came from 2 kinds of host (Test CPU, 16 CPUs: 3"
    )
    # `autotuner jobs ID` says so too, from the server's JSON.
    shown = {"noise": {"measured_pct": 3.0, "runs": 3, "band_pct": 3.0}, "hosts": summary.hosts}
    assert f"  {line}" in _noise_lines(shown)
    for r in recs:
        r.software = on("16")
    assert summarize(_spec(), recs, "done").hosts_line() is None  # one kind: nothing to say
