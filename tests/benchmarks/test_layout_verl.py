"""The layouts' table (``benchmarks.claims.layout_verl``) on a real comparison: verl's defaults,
example and winner, the example's controls, on a host of four H200 (2026-11-27), with verl's
defaults as the reference row. The expected figures are computed here from each side's own
record of its update rate: the trial's ``update_actor_tokens_per_s``, verl's
``timing_per_token_ms/update_actor`` of each step after its warm-up."""

from __future__ import annotations

import json
import statistics

import pytest

from benchmarks.claims.data import HERE
from benchmarks.claims.layout_verl import (
    layout_verl,
    layout_verl_hosts,
    layout_verl_paired,
    layout_verl_steps,
    layout_verl_update,
    probe_ratios,
    update_rates,
)

LANES = "results/verl-qwen2.5-1.5b-h200x4-lanes.json"
RAW = json.loads((HERE / LANES).read_text())["run"]


def _own_rates(config: str) -> tuple[list[float], list[float]]:
    runs = [r for r in RAW["runs"] if r["config"] == config]
    trial = [r["metrics"]["update_actor_tokens_per_s"] for r in runs if r["kind"] == "trial"]
    verl = [
        1000 / s["timing_per_token_ms/update_actor"]
        for r in runs
        if r["kind"] == "verl"
        for s in r["steps"][r["warmup_steps"] :]
    ]
    return trial, verl


def _ratio(config: str, side: int) -> float:
    return statistics.median(_own_rates(config)[side]) / statistics.median(_own_rates("defaults")[side])


def _rows(lines: list[str]) -> dict[str, list[str]]:
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith("| ")]
    return {row[0]: row[1:] for row in cells[1:]}


def test_each_sides_ratio_to_the_reference_and_the_trials_error_come_from_the_raw_records() -> None:
    lines = [line.text for line in layout_verl(LANES, reference="defaults")()]
    rows = _rows(lines)
    assert list(rows) == ["defaults", "example", "winner", "example_alloc_default", "example_profiled"]
    assert lines[2].startswith("| config |") and "probe" not in lines[2]  # no probe column
    for config in ("example", "winner", "example_profiled"):
        trial, verl = _ratio(config, 0), _ratio(config, 1)
        tokens, _, trial_ratio, verl_ratio, off = rows[config]
        assert (trial_ratio, verl_ratio) == (f"{trial:.2f}", f"{verl:.2f}")
        assert off == f"{100 * (trial / verl - 1):+.1f}%"
        assert tokens.startswith(f"{statistics.median(_own_rates(config)[0]):.0f} (n=")
    assert rows["defaults"][2:] == ["1.00", "1.00", "+0.0%"]
    rates = update_rates({"run": RAW})
    for config in rows:
        trial, verl = _own_rates(config)
        assert rates[config]["trial"] == pytest.approx(trial, rel=1e-9)
        assert rates[config]["verl"] == pytest.approx(verl, rel=1e-9)
    assert len(rates["defaults"]["verl"]) == 3  # the warm-up step left out


def test_a_row_beyond_ten_percent_is_reported_off_and_a_row_without_verl_is_named() -> None:
    lines = [line.text for line in layout_verl(LANES, reference="defaults")()]
    rows = _rows(lines)
    profiled = 100 * (_ratio("example_profiled", 0) / _ratio("example_profiled", 1) - 1)
    assert profiled < -10  # its trial ran under torch's profiler
    assert all(abs(100 * (_ratio(c, 0) / _ratio(c, 1) - 1)) <= 10 for c in ("example", "winner"))
    assert rows["example_alloc_default"][1:] == ["-", rows["example_alloc_default"][2], "-", "-"]
    (verdict,) = [line for line in lines if line.startswith("The trial's ratio")]
    assert verdict == (
        "The trial's ratio within 10% of verl's: 2 of 3 rows (example, winner); off by more: "
        f"example_profiled ({profiled:+.1f}%); not measured by both: example_alloc_default. "
        "Every row within 10%: no."
    )
    winner = 100 * (_ratio("winner", 0) / _ratio("winner", 1) - 1)
    assert -10 < winner < -5  # beyond a band of 5%, inside one of 10%
    tight = [line.text for line in layout_verl(LANES, reference="defaults", within_pct=5)()]
    assert f"within 5% of verl's: 1 of 3 rows (example); off by more: winner ({winner:+.1f}%)" in tight[-3]
    loose = [line.text for line in layout_verl(LANES, reference="defaults", within_pct=60)()]
    assert "off by more: none" in next(line for line in loose if line.startswith("The trial's ratio"))
    assert loose[-3].endswith("Every row within 60%: no.")  # a row still lacks verl's side


def test_the_probe_column_gives_verls_ratio_off_the_probes() -> None:
    lines = [line.text for line in layout_verl(LANES, reference="defaults", probe={"winner": 4.0})()]
    rows = _rows(lines)
    verl = _ratio("winner", 1)
    assert rows["winner"][4:6] == ["4.00", f"{100 * (verl / 4.0 - 1):+.1f}%"]
    assert rows["example"][4:6] == ["-", "-"]
    assert lines[-1].endswith("`results/layout-fsdp1-h200.json`.")


def test_the_probes_ratios_are_those_of_its_table() -> None:
    # docs/padding-vs-packing.md: packed 4, 8, 16: 14,038, 23,643, 28,617; dynamic 16,384
    # tokens: 29,632; padded to the micro-batch's longest at 4: 14,651 tokens/s.
    ratios = {name: round(r, 2) for name, r in probe_ratios().items()}
    assert ratios == {"p4": 1.0, "p8": 1.68, "p16": 2.04, "dyn16384": 2.11, "pad4": 1.04}
    assert probe_ratios("p8")["p16"] == pytest.approx(28617 / 23643)


def test_a_reference_row_without_a_measurement_is_refused() -> None:
    with pytest.raises(ValueError, match="reference row 'example_alloc_default' has no verl update rate"):
        layout_verl(LANES, reference="example_alloc_default")()


LAYOUTS = "results/verl-qwen2.5-1.5b-h200x4-layouts.json"


def test_the_layouts_whole_steps_come_from_each_sides_raw_records() -> None:
    raw = json.loads((HERE / LAYOUTS).read_text())["run"]
    lines = [line.text for line in layout_verl_steps(LAYOUTS)()]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith("| ")]
    rows = {(row[0], row[1]): row[2:] for row in cells[1:]}
    assert [c for c, _ in rows][::4] == ["p4", "p16", "dyn16384", "pad4"]
    for config in ("p4", "p16", "dyn16384", "pad4"):
        (trial,) = [r for r in raw["runs"] if r["config"] == config and r["kind"] == "trial"]
        (verl,) = [r for r in raw["runs"] if r["config"] == config and r["kind"] == "verl"]
        steps = verl["steps"][verl["warmup_steps"] :]
        assert len(steps) == 3
        update = statistics.median(s["timing_s/update_actor"] for s in steps)
        mine = trial["phase_timings_s"]["update_actor"]
        t, v, error = rows[(config, "update_actor s")]
        assert t == f"{mine:.2f} (n=1)" and v.startswith(f"{update:.2f} (n=3, spread ")
        assert error == f"{100 * (mine / update - 1):+.1f}%"
        throughput = statistics.median(s["perf/throughput"] for s in steps)
        t, v, error = rows[(config, "step tok/s/GPU")]
        assert t == f"{trial['throughput']:.0f} (n=1)" and v.startswith(f"{throughput:.0f} (n=3")
        step = statistics.median(s["timing_s/step"] for s in steps)
        assert rows[(config, "step s")][2] == f"{100 * (trial['step_time_s'] / step - 1):+.1f}%"
        peak = statistics.median(s["actor/perf/max_memory_allocated_gb"] for s in steps)
        mine = trial["metrics"]["update_actor_max_allocated_gib"]
        assert rows[(config, "update's peak allocated GiB")][2] == f"{100 * (mine / peak - 1):+.1f}%"


def test_the_layouts_in_verl_are_set_against_the_probe_and_verl() -> None:
    lines = [line.text for line in layout_verl(LAYOUTS, probe=probe_ratios())()]
    rows = _rows(lines)
    probe = probe_ratios()
    rates = update_rates(json.loads((HERE / LAYOUTS).read_text()))
    base = statistics.median(rates["p4"]["verl"])
    for config in ("p16", "dyn16384", "pad4"):
        verl = statistics.median(rates[config]["verl"]) / base
        assert rows[config][3] == f"{verl:.2f}" and rows[config][4] == f"{probe[config]:.2f}"
        assert rows[config][5] == f"{100 * (verl / probe[config] - 1):+.1f}%"
    assert "p8" not in rows  # the file holds four of the five layouts


def test_the_layouts_update_from_the_inside_comes_from_the_trial_clock_and_verls_trace() -> None:
    raw = json.loads((HERE / LAYOUTS).read_text())["run"]
    lines = [line.text for line in layout_verl_update(LAYOUTS)()]
    rows = _rows(lines)
    assert list(rows) == ["p4", "p16", "dyn16384", "pad4"]
    for config, row in rows.items():
        (trial,) = [r for r in raw["runs"] if r["config"] == config and r["kind"] == "trial"]
        (verl,) = [r for r in raw["runs"] if r["config"] == config and r["kind"] == "verl"]
        m = trial["metrics"]
        # verl's update passes, in order: the warm-up step's first, then as many a step.
        updates = [
            r
            for r in verl["trace"]
            if r.get("call") == "forward_backward_batch"
            and r.get("role") == "actor"
            and not r["forward_only"]
        ]
        per_step = len(updates) // 4
        measured = [updates[k * per_step : (k + 1) * per_step] for k in range(1, 4)]
        counts = [sum(p["micro_batches"] for p in step) for step in measured]
        assert row[0] == f"{m['update_actor_micro_batches']:.0f}, {statistics.median(counts):.0f}"
        seconds = [statistics.median([s for p in step for s in p["micro_batch_s"]]) for step in measured]
        assert row[1] == f"{m['update_actor_micro_batch_s_median']:.3f}, {statistics.median(seconds):.3f}"
        outside = [
            s["timing_s/update_actor"] - sum(x for p in step for x in p["micro_batch_s"])
            for s, step in zip(verl["steps"][1:], measured, strict=True)
        ]
        assert row[2].endswith(f", {statistics.median(outside):.2f}")
    # 256 sequences a step: 4 mini-batches of 64, each in micro-batches of 16
    assert rows["p16"][0] == "16, 16"


def test_each_lanes_host_speed_is_read_from_the_file_by_its_gpu() -> None:
    raw = json.loads((HERE / LAYOUTS).read_text())
    (line,) = [line.text for line in layout_verl_hosts(LAYOUTS)()]
    for gpu, config in (("0", "p4"), ("3", "pad4")):
        speed = raw["host_speed"][gpu]
        before = speed["before"]["median_us_per_op"]["torch_cuda"]
        after = speed["after"]["median_us_per_op"]["torch_cuda"]
        assert f"{config} (GPU {gpu}) {before:.1f} / {after:.1f} us a GPU op" in line


ORDER = "results/verl-qwen2.5-1.5b-h200x4-layouts-order.json"


def test_the_trials_in_verls_order_stand_beside_the_layouts_verl_runs_unchanged() -> None:
    order = json.loads((HERE / ORDER).read_text())["run"]
    earlier = json.loads((HERE / LAYOUTS).read_text())["run"]
    verl = [r for r in order["runs"] if r["kind"] == "verl"]
    assert verl == [r for r in earlier["runs"] if r["kind"] == "verl"]
    trials = [r for r in order["runs"] if r["kind"] == "trial"]
    assert sorted(r["config"] for r in trials) == sorted(["p4", "p16", "dyn16384", "pad4"] * 3)
    assert all(r["status"] == "ok" for r in trials)
    # In verl's order the dynamic batches' trials cut a step as verl's measured steps did.
    rows = _rows([line.text for line in layout_verl_update(ORDER)()])
    assert rows["dyn16384"][0] == "16, 16"
    dynamic = [r["metrics"]["update_actor_micro_batches"] for r in trials if r["config"] == "dyn16384"]
    assert dynamic == [16.0, 16.0, 16.0]
    # The trials' ratio to p4: the median of their three rates each.
    rates = update_rates(json.loads((HERE / ORDER).read_text()))
    ratios = _rows([line.text for line in layout_verl(ORDER, probe=probe_ratios())()])
    for config in ("p16", "dyn16384", "pad4"):
        trial = statistics.median(rates[config]["trial"]) / statistics.median(rates["p4"]["trial"])
        assert len(rates[config]["trial"]) == 3 and ratios[config][2] == f"{trial:.2f}"


B16 = "results/verl-qwen2.5-1.5b-h200x4-layouts-b16.json"


def _update_seconds(doc: dict, config: str) -> tuple[dict[int, float], list[float], int]:
    """``config``'s trials' update seconds by round, its verl run's update seconds per
    measured step, and the tokens of the batch every trial trains on."""
    runs = [r for r in doc["run"]["runs"] if r["config"] == config]
    trials = {r["round"]: r["phase_timings_s"]["update_actor"] for r in runs if r["kind"] == "trial"}
    (verl,) = [r for r in runs if r["kind"] == "verl"]
    steps = [s["timing_s/update_actor"] for s in verl["steps"][verl["warmup_steps"] :]]
    (tokens,) = {r["metrics"]["train_tokens"] for r in runs if r["kind"] == "trial"}
    return trials, steps, tokens


def test_the_paired_ratios_are_each_runs_seconds_against_the_references_run_beside_it() -> None:
    # Every trial of the file trains on one batch and verl's step k on the same batch in every
    # config, so each pair's ratio of rates is the reference's seconds over the config's.
    doc = json.loads((HERE / B16).read_text())
    lines = [line.text for line in layout_verl_paired(B16)()]
    rows = _rows(lines)
    assert list(rows) == ["p16", "dyn16384", "pad4"]  # the reference row is not its own pair
    ref_trials, ref_steps, ref_tokens = _update_seconds(doc, "p4")
    for config, row in rows.items():
        trials, steps, tokens = _update_seconds(doc, config)
        assert tokens == ref_tokens
        by_round = [ref_trials[k] / trials[k] for k in sorted(trials)]
        by_step = [a / b for a, b in zip(ref_steps, steps, strict=True)]
        assert row[0] == ", ".join(f"{x:.2f}" for x in by_round)
        assert row[2] == ", ".join(f"{x:.2f}" for x in by_step)
        t, v = statistics.median(by_round), statistics.median(by_step)
        assert row[1].startswith(f"{t:.2f} (") and row[3].startswith(f"{v:.2f} (")
        assert row[4] == f"{100 * (t / v - 1):+.1f}%"
        band = max(100 * (max(x) - min(x)) / statistics.median(x) for x in (by_round, by_step))
        beyond = f"trial {'faster' if t > v else 'slower'} (beyond the {band:.1f}% band)"
        assert row[5] == ("tie" if abs(t - v) <= max(t, v) * band / 100 else beyond)
    # Paired, the three rows lie within 10% of verl's; as a ratio of medians two did not.
    assert lines[-3].endswith("Every row within 10%: yes.")
    medians = _rows([line.text for line in layout_verl(B16)()])
    assert [abs(float(medians[c][-1].rstrip("%"))) > 10 for c in ("p16", "dyn16384")] == [True, True]


def test_a_paired_difference_beyond_both_spreads_is_named_with_its_band(tmp_path) -> None:
    def trial(config: str, round_: int, seconds: float) -> dict:
        return {
            "config": config,
            "kind": "trial",
            "status": "ok",
            "round": round_,
            "metrics": {"train_tokens": 1000.0},
            "phase_timings_s": {"update_actor": seconds},
        }

    def verl(config: str, seconds: list[float]) -> dict:
        steps = [{"perf/total_num_tokens": 1000.0, "timing_s/update_actor": s} for s in [9.9, *seconds]]
        return {
            "config": config,
            "kind": "verl",
            "status": "ok",
            "round": 0,
            "warmup_steps": 1,
            "steps": steps,
        }

    runs = [trial("p4", k, s) for k, s in enumerate([10.0, 10.0, 10.0])]
    runs += [trial("fast", k, s) for k, s in enumerate([4.0, 4.0, 4.1])]  # ratios 2.50, 2.50, 2.44
    runs += [trial("same", k, s) for k, s in enumerate([5.0, 5.0, 5.0])]
    runs += [verl("p4", [10.0, 10.0, 10.0]), verl("fast", [5.0, 5.0, 5.0]), verl("same", [5.0, 4.5, 5.0])]
    runs.append(trial("lonely", 5, 3.0))  # no p4 trial of its round, no verl run
    doc = {"run": {"configs": {"p4": {}, "fast": {}, "same": {}, "lonely": {}}, "runs": runs}}
    path = tmp_path / "pairs.json"
    path.write_text(json.dumps(doc))
    lines = [line.text for line in layout_verl_paired(str(path))()]
    rows = _rows(lines)
    assert rows["fast"][4:] == ["+25.0%", "trial faster (beyond the 2.4% band)"]
    assert rows["same"][4:] == ["+0.0%", "tie"]  # verl's 11.1% spread makes the band
    assert "lonely" not in rows
    assert lines[-3] == (
        "The trial's ratio within 10% of verl's: 1 of 2 rows (same); off by more: fast (+25.0%); "
        "not measured by both: lonely. Every row within 10%: no."
    )
