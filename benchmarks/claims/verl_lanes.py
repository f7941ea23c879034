"""Parts of benchmarks/README.md from verl's defaults, example and the winner in verl in one
run: one config per H200 of a host of four, at once (``benchmarks/gpu/verl-lanes.sh``), each
between two trials of it on its GPU; a fourth lane with the example's controls (the trials'
allocator, a profile of its update micro-batches)."""

from __future__ import annotations

import statistics
from typing import Any

from autotuner.noise import compare, spread_pct
from benchmarks.claims import data
from benchmarks.claims.data import Line, error_pct, generated_from, load, span, table
from benchmarks.claims.verl_h200 import TIMERS, VERL_H200
from benchmarks.claims.verl_h200 import _rows as one_gpu_rows
from trials.verl.trace import micro_batches

LANES = "results/verl-qwen2.5-1.5b-h200x4-lanes.json"
CONFIGS = ("defaults", "example", "winner")
ALLOC = "example_alloc_default"  # the example's trials with the allocator's default
FORWARDS = ("old_log_prob", "ref_log_prob")


THROUGHPUT = "throughput"
UPDATE = "update_actor"


def _listed(trials: list[dict[str, Any]], figure: str) -> str:
    """Each trial's step throughput (``THROUGHPUT``, no decimals) or update seconds, in order."""
    if figure == THROUGHPUT:
        return ", ".join(f"{t['throughput']:.0f}" for t in trials)
    return ", ".join(f"{t['phase_timings_s'][figure]:.2f}" for t in trials)


def _runs(kind: str, config: str) -> list[dict[str, Any]]:
    return [
        r
        for r in load(LANES)["run"]["runs"]
        if r["kind"] == kind and r["config"] == config and r["status"] == "ok"
    ]


def _verl(config: str) -> dict[str, Any]:
    (run,) = _runs("verl", config)
    return run


def _trials(config: str) -> list[dict[str, Any]]:
    """The trials of ``config`` on its verl run's GPU (all of them: one lane per config)."""
    gpus = _verl(config)["gpus"]
    return [t for t in _runs("trial", config) if t["gpus"] == gpus]


def _one_gpu_verl(config: str) -> tuple[str, dict[str, Any]]:
    """verl's run of ``config`` on a host of one H200 (``VERL_H200``)."""
    (found,) = one_gpu_rows("verl", config)
    return found


def _throughputs() -> tuple[dict[str, float], dict[str, float]]:
    verl = {c: data.verl_median(_verl(c), "perf/throughput") for c in CONFIGS}
    trial = {c: statistics.median(t["throughput"] for t in _trials(c)) for c in CONFIGS}
    return verl, trial


def verl_lanes() -> list[Line]:
    """Per config and figure: the trials on verl's GPU (median, n), verl's median of its
    measured steps, the error; beside them, verl's median on a host of one H200."""
    header = [
        "config (GPU)",
        "figure",
        "trials (median, n)",
        "verl (median of steps)",
        "error",
        "verl on a one-H200 host",
    ]
    rows = []
    for config in CONFIGS:
        verl, trials = _verl(config), _trials(config)
        measured = [s["perf/throughput"] for s in data.verl_steps(verl)]
        predicted = statistics.median(t["throughput"] for t in trials)
        host, alone = _one_gpu_verl(config)
        rows.append(
            (
                [
                    f"{config} ({verl['gpus']})",
                    "step throughput, tok/s/GPU",
                    f"{predicted:.0f} (n={len(trials)})",
                    f"{statistics.median(measured):.0f} "
                    f"(n={len(measured)}, spread {spread_pct(measured) or 0:.1f}%)",
                    error_pct(predicted, statistics.median(measured)),
                    f"{data.verl_median(alone, 'perf/throughput'):.0f} ({host})",
                ],
                (LANES, VERL_H200),
            )
        )
        for name, key in TIMERS.items():
            mine = statistics.median(data.trial_timer(t, key) for t in trials)
            theirs = data.verl_median(verl, key)
            rows.append(
                (
                    [
                        config,
                        f"{name}, s",
                        f"{mine:.2f}",
                        f"{theirs:.2f}",
                        error_pct(mine, theirs),
                        f"{data.verl_median(alone, key):.2f}",
                    ],
                    (LANES, VERL_H200),
                )
            )
    every = [f"{c} {_listed(_trials(c), THROUGHPUT)}" for c in CONFIGS]
    return [
        generated_from(LANES, VERL_H200),
        Line(""),
        *table(header, rows),
        Line(""),
        Line("Every trial, tok/s/GPU, before and after its verl run: " + "; ".join(every) + ".", (LANES,)),
    ]


def _slowdown(config: str) -> float:
    """verl's median step time here over its median on the one-H200 host, less one."""
    return (
        data.verl_median(_verl(config), "timing_s/step")
        / data.verl_median(_one_gpu_verl(config)[1], "timing_s/step")
        - 1
    )


def _trial_change(config: str) -> float:
    """The trials' median step time here over those beside verl's run on the one-H200 host."""
    host, _ = _one_gpu_verl(config)
    there = [row["step_time_s"] for _, row in one_gpu_rows("trial", config, host)]
    return statistics.median(t["step_time_s"] for t in _trials(config)) / statistics.median(there) - 1


def verl_lanes_headline() -> list[Line]:
    verl, trial = _throughputs()
    verl_order, trial_order, errors, within = data.ranked(verl, trial, CONFIGS)
    phases = [name for name in TIMERS if name not in ("step", "update_weights (weight sync + wake)")]
    off = {
        c: {
            name: statistics.median(data.trial_timer(t, TIMERS[name]) for t in _trials(c))
            / data.verl_median(_verl(c), TIMERS[name])
            - 1
            for name in phases
        }
        for c in CONFIGS
    }
    worst = {c: max(off[c], key=lambda name: abs(off[c][name])) for c in CONFIGS}
    runs = [_verl(c) for c in CONFIGS]
    return [
        Line(
            f"In verl, in one run: the winner {verl['winner']:.0f}, verl's example {verl['example']:.0f} and "
            f"verl's defaults {verl['defaults']:.0f} tokens/s/GPU (medians of the steps after the warm-up). "
            f"The winner is {verl['winner'] / verl['defaults']:.2f}x verl's defaults and "
            f"{verl['winner'] / verl['example']:.2f}x verl's example in verl.",
            (LANES,),
        ),
        Line(""),
        Line(
            f"The trials rank the configs {', '.join(trial_order)}; verl ranks them {', '.join(verl_order)} "
            f"({'the same order' if trial_order == verl_order else 'not the same order'}). "
            "The trials on each config's GPU predicted "
            + ", ".join(f"{c} {100 * errors[c]:+.1f}%" for c in CONFIGS)
            + "; each config's phase most off: "
            + ", ".join(f"{c} {worst[c]} ({100 * off[c][worst[c]]:+.0f}%)" for c in CONFIGS)
            + ".",
            (LANES,),
        ),
        Line(""),
        Line(
            data.targets(verl, trial_order == verl_order, within, CONFIGS),
            (LANES,),
        ),
        Line(""),
        Line(
            "verl's step here against its step on the one-H200 hosts: "
            + ", ".join(f"{c} {100 * _slowdown(c):+.0f}%" for c in CONFIGS)
            + "; the trials' step here against the trials beside those runs: "
            + ", ".join(f"{c} {100 * _trial_change(c):+.0f}%" for c in CONFIGS)
            + ".",
            (LANES, VERL_H200),
        ),
        Line(""),
        Line(
            f"verl's runs took {span([r['wall_s'] / 60 for r in runs], '.1f')} minutes each, "
            f"{span([r['startup_s'] / 60 for r in runs], '.1f')} of them before the first step.",
            (LANES,),
        ),
    ]


def verl_lanes_forwards() -> list[Line]:
    """The forward passes' micro-batches: verl's (its trace, measured steps) against the
    trials' (timed as verl's trace times them), here and on the one-H200 hosts."""
    rows = []
    for config in CONFIGS:
        for label, verl, trials, rel in (
            ("4 x H200, one lane each", _verl(config), _trials(config), LANES),
            (
                f"one H200 ({_one_gpu_verl(config)[0]})",
                _one_gpu_verl(config)[1],
                [row for _, row in one_gpu_rows("trial", config, _one_gpu_verl(config)[0])],
                VERL_H200,
            ),
        ):
            found = micro_batches(verl["trace"], len(verl["steps"]), verl.get("warmup_steps", 1))
            cells = []
            for phase in FORWARDS:
                theirs = statistics.mean(found[phase][0])
                key = f"{phase}_micro_batch_s_mean"
                mine = [t["metrics"][key] for t in trials if key in t["metrics"]]
                cells.append(f"{span(mine, '.3f')} / {theirs:.3f}" if mine else f"- / {theirs:.3f}")
            rows.append(([config, label, *cells], (rel,)))
    header = ["config", "host", *(f"{p}: s per micro-batch, trials / verl (mean)" for p in FORWARDS)]
    return [generated_from(LANES, VERL_H200), Line(""), *table(header, rows)]


def _allocator_verdict(default: list[dict[str, Any]], expandable: list[dict[str, Any]]) -> str:
    """Expandable segments against the default by the tie rule (``autotuner.noise``): the band
    is the larger of the two groups' spreads."""
    a = [t["throughput"] for t in expandable]
    b = [t["throughput"] for t in default]
    band = max(spread_pct(a) or 0.0, spread_pct(b) or 0.0)
    verdict = compare(statistics.median(a), statistics.median(b), band)
    ratio = statistics.median(a) / statistics.median(b)
    return (
        f"Medians {statistics.median(a):.0f} against {statistics.median(b):.0f} ({ratio:.3f}x), "
        f"the band their spreads give {band:.1f}%: {'a tie' if verdict == 'tie' else verdict}."
    )


def verl_lanes_controls() -> list[Line]:
    """The example's trials with the allocator's default against those with expandable
    segments; the profiled update micro-batches of the example, trial and verl."""
    alloc = _runs("trial", ALLOC)
    verl_alloc = _trials("example")
    profiles = load(LANES)["profiles"]
    per = {k: len(p["micro_batches"]) for k, p in profiles.items()}

    def ms(key: str, name: str) -> str:
        return f"{1000 * profiles[key][name] / per[key]:.0f}"

    annotations = sum(
        op["self_device_s"] for op in profiles["verl"]["ops"] if op["name"].startswith("micro_batch")
    )
    verl_kernels = 1000 * (profiles["verl"]["device_kernel_s"] - annotations) / per["verl"]
    alloc_gpus = {t["gpus"] for t in alloc}
    return [
        Line(
            f"The example's trials with the allocator's default (GPU {', '.join(sorted(alloc_gpus))}): "
            f"{_listed(alloc, THROUGHPUT)} tok/s/GPU, update {_listed(alloc, UPDATE)} s; with verl's "
            f"expandable segments (GPU {verl_alloc[0]['gpus']}): {_listed(verl_alloc, THROUGHPUT)} "
            f"tok/s/GPU, update {_listed(verl_alloc, UPDATE)} s. {_allocator_verdict(alloc, verl_alloc)} "
            f"The train phase's device peak (the sleeping engine's memory in it): "
            f"{span([t['train_peak_memory_gib'] for t in alloc], '.1f')} GiB with the default, "
            f"{span([t['train_peak_memory_gib'] for t in verl_alloc], '.1f')} GiB with expandable segments.",
            (LANES,),
        ),
        Line(""),
        Line(
            f"Update micro-batches {profiles['trial']['micro_batches'][0] + 1} to "
            f"{profiles['trial']['micro_batches'][-1] + 1} of the example under torch's profiler, per "
            f"micro-batch, trial / verl: wall {ms('trial', 'wall_s')} / {ms('verl', 'wall_s')} ms; the "
            f"GPU's kernels {ms('trial', 'device_kernel_s')} / {verl_kernels:.0f} ms (verl's without "
            f"its micro-batch ranges, which the profiler counts among the kernels too); the host's own "
            f"time in ops {ms('trial', 'self_host_s')} / {ms('verl', 'self_host_s')} ms.",
            (LANES,),
        ),
    ]


def verl_lanes_top() -> list[Line]:
    verl, trial = _throughputs()
    verl_order, trial_order, ratios, _ = data.ranked(verl, trial, CONFIGS)
    same = verl_order == trial_order
    errors = {c: 100 * ratios[c] for c in CONFIGS}
    slower = [100 * _slowdown(c) for c in CONFIGS]
    return [
        Line(
            f"On 2026-11-27 the three ran in verl in one run, one per H200 of a host of four (data in "
            f"`benchmarks/{LANES}`): the winner is {verl['winner'] / verl['defaults']:.2f}x verl's defaults "
            f"in verl, the trials rank the three {'as verl does' if same else 'unlike verl'}, "
            "and they are off by "
            + ", ".join(f"{errors[c]:+.0f}% ({c})" for c in CONFIGS)
            + f": verl's step there took {span(slower, '.0f')}% longer than on the hosts of one H200, the "
            f"trials' {span([100 * _trial_change(c) for c in CONFIGS], '.0f')}% "
            "(`benchmarks/README.md` says why).",
            (LANES, VERL_H200),
        )
    ]


HOST_SPEED = "results/host-speed-h200.json"


def host_speed() -> list[Line]:
    """Each run of ``benchmarks/gpu/host_speed.py``: the host's microseconds per small op on
    the GPU and on the CPU (median of the run's turns, each turn), in the order they ran."""
    doc = load(HOST_SPEED)
    rows = []
    for run in doc["runs"]:
        cells = []
        for path in ("torch_cuda", "torch_cpu"):
            each = ", ".join(f"{v:.1f}" for v in run["us_per_op"][path])
            cells.append(f"{run['median_us_per_op'][path]:.1f} ({each})")
        rows.append(([run["kind"], str(run["order"]), run["label"], *cells], (HOST_SPEED,)))
    header = ["host", "order", "run", "GPU op, us (median; each turn)", "CPU op, us (median; each turn)"]
    return [generated_from(HOST_SPEED), Line(""), *table(header, rows)]


def host_speed_headline() -> list[Line]:
    runs = [r for r in load(HOST_SPEED)["runs"] if r["kind"] == "nvidia-h200-x2" and r["order"] > 1]
    alone = [r["median_us_per_op"]["torch_cuda"] for r in runs if r["label"].startswith("alone")]
    pairs = [r["median_us_per_op"]["torch_cuda"] for r in runs if r["label"].startswith("pair")]
    return [
        Line(
            f"On the host of two H200, a run on 16 CPUs alone took {span(alone, '.1f')} us per GPU op "
            f"(medians of its {len(alone)} runs); in pairs, each on its own GPU and 16 CPUs, "
            f"{span(pairs, '.1f')} us.",
            (HOST_SPEED,),
        )
    ]
