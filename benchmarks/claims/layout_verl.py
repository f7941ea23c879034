"""The update's micro-batch layouts in verl itself beside the tuner's trial: configs that differ
only in the update's layout, each run by the trial and by verl's own trainer on one host
(``verl_compare.py``; the five layouts of ``benchmarks/gpu/layout-verl.sh``). Per config,
each side's update rate, its ratio to a reference row's, the probe's ratio for that row
(``docs/padding-vs-packing.md``) and how far the trial's ratio is off verl's.

An update rate is the step's tokens over the update's seconds: a trial's ``train_tokens``
over its ``update_actor`` phase (verl's cut into micro-batches counted in), each of verl's
steps after its warm-up its ``perf/total_num_tokens`` over its ``timing_s/update_actor``.

``layout_verl`` reads any ``verl_compare`` file (its ``runs`` at the top or under ``run``, as
``results/`` keeps them); ``layout_verl_steps`` sets the whole step of each config beside
verl's: its throughput, the update's seconds and the step's.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from autotuner.noise import Noise, Verdict, compare, spread_pct, tie_band_pct
from benchmarks.claims.data import (
    Line,
    error_pct,
    generated_from,
    load,
    median_runs,
    table,
    verl_steps,
)
from benchmarks.claims.strategy import _trial_figure as trial_figure
from trials.verl.trace import measured_passes

REFERENCE = "p4"
WITHIN_PCT = 10.0
# The probe's table as the layout benchmark's file holds it, and the names layout-verl.sh
# gives its configs for the probe's rows.
PROBE = "results/layout-fsdp1-h200.json"
PROBE_ROWS = {
    "p4": "packed-4",
    "p8": "packed-8",
    "p16": "packed-16",
    "dyn16384": "packed-dynamic-16384",
    "pad4": "padded-4",
}
VERL_RUN_DONE = ("ok", "partial")  # a partial run: its logged steps, rebuilt by `recover`
# The whole step's figures of ``layout_verl_steps``: a label and verl's metric (the trial's
# under the same name, ``trial_timer``; its step throughput for ``perf/throughput``).
STEP_FIGURES = (
    ("step tok/s/GPU", "perf/throughput"),
    ("update_actor s", "timing_s/update_actor"),
    ("step s", "timing_s/step"),
    ("update's peak allocated GiB", "actor/perf/max_memory_allocated_gb"),
)


def probe_ratios(reference: str = REFERENCE) -> dict[str, float]:
    """The probe's tokens/s of each row over the reference row's, by config name."""
    rows = load(PROBE)["probe"]
    base = rows[PROBE_ROWS[reference]]["tokens_per_s"]
    return {name: rows[row]["tokens_per_s"] / base for name, row in PROBE_ROWS.items()}


def update_rates(doc: dict[str, Any]) -> dict[str, dict[str, list[float]]]:
    """Per config of a ``verl_compare`` file, in its order: each ok trial's update tokens/s
    (``trial``) and each measured step's of verl's runs (``verl``)."""
    run = doc.get("run", doc)
    rates: dict[str, dict[str, list[float]]] = {c: {"trial": [], "verl": []} for c in run["configs"]}
    for r in run["runs"]:
        if r["kind"] == "trial" and r["status"] == "ok":
            rates[r["config"]]["trial"].append(_trial_rate(r))
        elif r["kind"] == "verl" and r["status"] in VERL_RUN_DONE:
            rates[r["config"]]["verl"] += _verl_step_rates(r)
    return rates


def _trial_rate(r: dict[str, Any]) -> float:
    """A trial's update tokens/s: its ``train_tokens`` over its ``update_actor`` phase."""
    return float(r["metrics"]["train_tokens"] / r["phase_timings_s"]["update_actor"])


def _verl_step_rates(r: dict[str, Any]) -> list[float]:
    """A verl run's update tokens/s in each measured step."""
    return [s["perf/total_num_tokens"] / s["timing_s/update_actor"] for s in verl_steps(r)]


def paired_ratios(doc: dict[str, Any], reference: str = REFERENCE) -> dict[str, dict[str, list[float]]]:
    """Per config of a ``verl_compare`` file, in its order: each side's update rate over the
    reference's, pair by pair: a trial's over the reference's trial of the same round (on one
    host of several GPUs the lanes run their rounds at about the same time), each measured
    step of verl's over the reference's step of the same run round and index (both train the
    same drawn batch). The pairs' scatter is each side's own noise in the ratio."""
    run = doc.get("run", doc)
    trial: dict[tuple[Any, ...], float] = {}
    verl: dict[tuple[Any, ...], float] = {}
    for r in run["runs"]:
        if r["kind"] == "trial" and r["status"] == "ok":
            trial[r["config"], r.get("round")] = _trial_rate(r)
        elif r["kind"] == "verl" and r["status"] in VERL_RUN_DONE:
            for k, rate in enumerate(_verl_step_rates(r)):
                verl[r["config"], r.get("round"), k] = rate
    return {
        c: {"trial": _over(trial, c, reference), "verl": _over(verl, c, reference)} for c in run["configs"]
    }


def _over(rates: dict[tuple[Any, ...], float], config: str, reference: str) -> list[float]:
    """``config``'s rates (keyed by config, then the pair's key) over ``reference``'s of the
    same pair key, for each key both have."""
    return [
        rate / rates[(reference, *key[1:])]
        for key, rate in rates.items()
        if key[0] == config and (reference, *key[1:]) in rates
    ]


def layout_verl_paired(rel: str, reference: str = REFERENCE) -> Callable[[], list[Line]]:
    """The ratios of ``rel``'s configs to ``reference``'s taken pair by pair
    (``paired_ratios``): each side's ratios, their median and spread, the trial's median off
    verl's, and the verdict by the project's tie rule (``autotuner.noise.compare``: a
    difference no larger than the larger of the two spreads is a tie)."""

    def build() -> list[Line]:
        doc = load(rel)
        header = [
            "config",
            f"trial: ratio to {reference}, round by round",
            "trial: median (spread)",
            f"verl: ratio to {reference}, step by step",
            "verl: median (spread)",
            "trial off verl",
            "verdict",
        ]
        rows, off = [], {}
        paired = paired_ratios(doc, reference)
        for config, pairs in paired.items():
            t, v = pairs["trial"], pairs["verl"]
            if config == reference or not t or not v:
                continue
            tm, vm = statistics.median(t), statistics.median(v)
            off[config] = 100 * (tm / vm - 1)
            band = tie_band_pct(Noise(floor_pct=0.0), spread_pct(t), spread_pct(v))
            verdict = compare(tm, vm, band)
            cells = [
                config,
                ", ".join(f"{x:.2f}" for x in t),
                _ratio_cell(t),
                ", ".join(f"{x:.2f}" for x in v),
                _ratio_cell(v),
                f"{off[config]:+.1f}%",
                "tie" if verdict is Verdict.TIE else f"trial {verdict} (beyond the {band:.1f}% band)",
            ]
            rows.append((cells, (f"{rel}#{config}",)))
        compared = {c: p for c, p in paired.items() if c != reference}
        return [
            *_measured_on(doc, rel),
            *table(header, rows),
            Line(""),
            _verdict(compared, off, reference, WITHIN_PCT, rel),
            Line(""),
            generated_from(rel),
        ]

    return build


def _ratio_cell(values: list[float]) -> str:
    spread = spread_pct(values)
    tail = f" ({spread:.1f}%)" if spread is not None else " (n=1)"
    return f"{statistics.median(values):.2f}{tail}"


def _per_config(
    rel: str, steps_of: Callable[[dict[str, Any]], list[dict[str, float]]]
) -> Iterator[tuple[str, list[dict[str, Any]], list[dict[str, float]]]]:
    """Each config of ``rel`` in order: its trials that ended ok and ``steps_of`` each of its
    verl runs that logged steps, joined."""
    run = load(rel).get("run", load(rel))
    for config in run["configs"]:
        mine = [r for r in run["runs"] if r["config"] == config]
        trials = [r for r in mine if r["kind"] == "trial" and r["status"] == "ok"]
        verls = [r for r in mine if r["kind"] == "verl" and r["status"] in VERL_RUN_DONE]
        yield config, trials, [s for r in verls for s in steps_of(r)]


def layout_verl_steps(rel: str) -> Callable[[], list[Line]]:
    """The table of ``rel`` (a ``verl_compare`` file under benchmarks/): per config and figure
    of ``STEP_FIGURES``, the trial's (median of its runs), verl's (median of its measured
    steps, n, spread) and the trial's error against verl's median."""

    def build() -> list[Line]:
        header = [
            "config",
            "figure",
            "trial (median, n, spread)",
            "verl (median of steps, n, spread)",
            "error",
        ]
        rows = []
        for config, trials, steps in _per_config(rel, verl_steps):
            for label, metric in STEP_FIGURES:
                t = [trial_figure(r, metric) for r in trials]
                v = [s[metric] for s in steps]
                digits = 0 if metric == "perf/throughput" else 1 if metric.startswith("actor/perf") else 2
                cells = [config, label, _median_cell(t, digits), _median_cell(v, digits)]
                cells.append(error_pct(statistics.median(t), statistics.median(v)) if t and v else "-")
                rows.append((cells, (f"{rel}#{config}",)))
        return [*_measured_on(load(rel), rel), *table(header, rows), Line(""), generated_from(rel)]

    return build


def _median_cell(values: list[float], digits: int) -> str:
    """``median (n=N, spread S%)``, as ``median_runs`` writes it, with ``digits`` decimals."""
    if not values:
        return "-"
    cell = median_runs(values)
    return f"{statistics.median(values):.{digits}f}{cell[cell.index(' (') :]}"


def _ratios(rates: dict[str, dict[str, list[float]]], reference: str, side: str) -> dict[str, float]:
    base = rates[reference][side]
    if not base:
        raise ValueError(f"reference row {reference!r} has no {side} update rate; choose another")
    ref = statistics.median(base)
    return {c: statistics.median(r[side]) / ref for c, r in rates.items() if r[side]}


def layout_verl(
    rel: str,
    reference: str = REFERENCE,
    probe: Mapping[str, float] | None = None,
    within_pct: float = WITHIN_PCT,
) -> Callable[[], list[Line]]:
    """The table of ``rel`` (a ``verl_compare`` file under benchmarks/): per config, the trial's
    and verl's update tokens/s (median, n, spread), each side's ratio to ``reference``'s, the
    probe's ratio where ``probe`` gives one (and verl's off it), the trial's ratio off verl's;
    then whether every row's trial ratio is within ``within_pct`` of verl's."""

    def build() -> list[Line]:
        doc = load(rel)
        rates = update_rates(doc)
        trial, verl = _ratios(rates, reference, "trial"), _ratios(rates, reference, "verl")
        sources = (rel, PROBE) if probe is not None else (rel,)
        header = [
            "config",
            "trial: update tok/s (median, n, spread)",
            "verl: update tok/s (median of steps, n, spread)",
            f"trial: ratio to {reference}",
            f"verl: ratio to {reference}",
        ]
        header += ["probe's ratio", "verl off the probe"] if probe is not None else []
        header.append("trial off verl")
        rows, off = [], {}
        for config, r in rates.items():
            t, v = trial.get(config), verl.get(config)
            cells = [
                config,
                median_runs(r["trial"]),
                median_runs(r["verl"]),
                f"{t:.2f}" if t else "-",
                f"{v:.2f}" if v else "-",
            ]
            if probe is not None:
                p = probe.get(config)
                cells += [f"{p:.2f}" if p else "-", f"{100 * (v / p - 1):+.1f}%" if v and p else "-"]
            if t and v:
                off[config] = 100 * (t / v - 1)
            cells.append(f"{off[config]:+.1f}%" if config in off else "-")
            rows.append((cells, tuple(f"{s}#{config}" if s == rel else s for s in sources)))
        verdict = _verdict(rates, off, reference, within_pct, rel)
        elsewhere = doc.get("verl_runs_from")
        if elsewhere:  # the trials ran on one host, verl on another: a ratio moves with its host
            where = f"verl's runs are `{elsewhere['file']}`'s, from another host than the trials'."
            verdict = Line(f"{verdict.text} {where}", verdict.sources)
        return [
            *_measured_on(doc, rel),
            *table(header, rows),
            Line(""),
            verdict,
            Line(""),
            generated_from(*sources),
        ]

    return build


def _measured_on(doc: dict[str, Any], rel: str) -> list[Line]:
    if "date" not in doc or "device" not in doc:
        return []
    return [Line(f"{doc['date']}, {doc['device']}.", (rel,)), Line("")]


def _verdict(
    rates: dict[str, dict[str, list[float]]],
    off: dict[str, float],
    reference: str,
    within_pct: float,
    rel: str,
) -> Line:
    """Which rows' trial ratio lies within ``within_pct`` of verl's, which beyond, which lack
    a side; every row within only when some row beside the reference was compared and none
    lacks a side."""
    compared = {c: pct for c, pct in off.items() if c != reference}
    within = [c for c, pct in compared.items() if abs(pct) <= within_pct]
    beyond = [f"{c} ({pct:+.1f}%)" for c, pct in compared.items() if abs(pct) > within_pct]
    missing = [c for c in rates if c not in off]
    text = (
        f"The trial's ratio within {within_pct:.0f}% of verl's: {len(within)} of {len(compared)} rows"
        f" ({', '.join(within) or 'none'}); off by more: {', '.join(beyond) or 'none'}"
    )
    if missing:
        text += f"; not measured by both: {', '.join(missing)}"
    every = bool(compared) and not beyond and not missing
    return Line(f"{text}. Every row within {within_pct:.0f}%: {'yes' if every else 'no'}.", (rel,))


def _verl_update_steps(run: dict[str, Any]) -> list[dict[str, float]]:
    """Per measured step of a traced verl run: its update's micro-batches, their seconds, the
    update's seconds outside them and the full collections in its passes."""
    steps = verl_steps(run)
    warmup = run.get("warmup_steps", 1)
    passes = measured_passes(run.get("trace") or [], warmup + len(steps), warmup).get("update_actor", [])
    if not passes or len(passes) % len(steps):
        return []
    per = len(passes) // len(steps)
    out = []
    for k, step in enumerate(steps):
        mine = passes[k * per : (k + 1) * per]
        seconds = [s for p in mine for s in p["micro_batch_s"]]
        out.append(
            {
                "micro_batches": float(len(seconds)),
                "micro_batch_s": statistics.median(seconds),
                "outside_s": step["timing_s/update_actor"] - sum(seconds),
                "full_gcs": float(sum(p.get("pass_full_gcs", 0) for p in mine)),
            }
        )
    return out


def layout_verl_update(rel: str) -> Callable[[], list[Line]]:
    """The update of each config of ``rel`` (a traced ``verl_compare`` file), the trial's
    beside verl's (medians over its measured steps): micro-batches a step, a micro-batch's
    median seconds, the update's seconds outside its micro-batches (its optimizer steps, the
    cut, the collector), and full collections of Python's collector in its passes."""

    def build() -> list[Line]:
        header = [
            "config",
            "micro-batches a step: trial, verl",
            "micro-batch s (median): trial, verl",
            "outside the micro-batches, s: trial, verl",
            "full collections: trial, verl",
        ]
        rows = []
        for config, trials, steps in _per_config(rel, _verl_update_steps):
            if not trials or not steps:
                continue
            m = trials[0]["metrics"]
            count = m["update_actor_micro_batches"]
            outside = (
                trials[0]["phase_timings_s"]["update_actor"] - count * m["update_actor_micro_batch_s_mean"]
            )
            mine = {
                "micro_batches": count,
                "micro_batch_s": m["update_actor_micro_batch_s_median"],
                "outside_s": outside,
                "full_gcs": m.get("update_actor_full_gcs", 0.0),
            }
            cells = [config]
            for key, digits in (
                ("micro_batches", 0),
                ("micro_batch_s", 3),
                ("outside_s", 2),
                ("full_gcs", 0),
            ):
                verl = statistics.median(s[key] for s in steps)
                cells.append(f"{mine[key]:.{digits}f}, {verl:.{digits}f}")
            rows.append((cells, (f"{rel}#{config}",)))
        note = Line(
            f"The trial's first run of each config; verl's medians over its {len(steps)} measured steps.",
            (rel,),
        )
        return [*table(header, rows), Line(""), note, Line(""), generated_from(rel)]

    return build


def layout_verl_hosts(rel: str) -> Callable[[], list[Line]]:
    """How fast each lane's host drove its GPU before and after its runs
    (``benchmarks/gpu/host_speed.py``, the medians of its turns, in the file's ``host_speed``
    by GPU): a step paced by the host moves with it."""

    def build() -> list[Line]:
        doc = load(rel)
        run = doc.get("run", doc)
        configs = {r["gpus"]: r["config"] for r in run["runs"]}
        parts = []
        for gpu, speed in sorted(doc["host_speed"].items()):
            read = {w: speed[w]["median_us_per_op"] for w in ("before", "after") if w in speed}

            def op(kind: str, read: dict[str, dict[str, float]] = read) -> str:
                return " / ".join(
                    f"{read[w][kind]:.1f}" if w in read else "not read" for w in ("before", "after")
                )

            gpu_op, cpu_op = f"{op('torch_cuda')} us a GPU op", f"{op('torch_cpu')} us a CPU op"
            parts.append(f"{configs.get(gpu, '-')} (GPU {gpu}) {gpu_op}, {cpu_op}")
        return [Line("Each lane's host, before / after its runs: " + "; ".join(parts) + ".", (rel,))]

    return build


def _verl_pass_bound(run: dict[str, Any], role: str) -> float | None:
    """The most verl's process had allocated at the end of its first forward-only pass of
    ``role`` (its trace's ``max_allocated_gib``: the process's peak since it started, never
    reset in verl's step, so an upper bound on that pass's own peak)."""
    for record in run.get("trace") or []:
        if record["role"] == role and record.get("forward_only"):
            return float(record["max_allocated_gib"])
    return None


def layout_verl_log_prob_peaks(stages: list[tuple[str, str]], verl: str) -> Callable[[], list[Line]]:
    """The log-prob passes' peak allocated memory of each config, the trials of each of
    ``stages`` (``(label, verl_compare file)`` of the same configs, in order; medians of their
    runs' ``<pass>_max_allocated_gib``) beside verl's bound on the same pass
    (``_verl_pass_bound``, from ``verl``'s traced verl runs)."""

    def build() -> list[Line]:
        run = load(verl).get("run", load(verl))
        header = ["config"]
        for name in ("old-log-prob", "ref"):
            header += [f"{name} peak GiB, trial: {label}" for label, _ in stages] + ["verl: at most"]
        trials_of = {rel: {c: t for c, t, _ in _per_config(rel, lambda r: [])} for _, rel in stages}
        sources = list(dict.fromkeys([*(rel for _, rel in stages), verl]))
        rows = []
        for config in run["configs"]:
            verls = [r for r in run["runs"] if r["config"] == config and r["kind"] == "verl"]
            cells = [config]
            for name, role in (("old_log_prob", "actor"), ("ref_log_prob", "ref")):
                key = f"{name}_max_allocated_gib"
                for _, rel in stages:
                    values = [
                        r["metrics"][key] for r in trials_of[rel].get(config, []) if key in r["metrics"]
                    ]
                    cells.append(f"{statistics.median(values):.1f} (n={len(values)})" if values else "-")
                bounds = [b for b in (_verl_pass_bound(r, role) for r in verls) if b is not None]
                cells.append(f"{max(bounds):.1f}" if bounds else "-")
            rows.append((cells, tuple(f"{rel}#{config}" for rel in sources)))
        return [*table(header, rows), Line(""), generated_from(*sources)]

    return build


def _update_passes(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The update passes of a traced verl run, in order (one per mini-batch, every step)."""
    return [
        r
        for r in run.get("trace") or []
        if r.get("call") == "forward_backward_batch" and not r.get("forward_only")
    ]


def _verl_update_peaks(run: dict[str, Any]) -> tuple[float, int, float, int] | None:
    """A traced verl run's update: its warm-up step's peak allocated GiB and largest
    micro-batch (tokens), then the run's peak through all its steps and its largest
    micro-batch. verl's process peak is never reset, so each pass records the peak since the
    run started: at the warm-up step's last update pass it is that step's own (the log-prob
    passes before it hold less), later only the run's."""
    warmup = run.get("warmup_steps", 1)
    steps = warmup + len(verl_steps(run))
    passes = _update_passes(run)
    if not passes or len(passes) % steps:
        return None
    first = passes[: len(passes) // steps * warmup]
    return (
        first[-1]["max_allocated_gib"],
        max(n for r in first for n in r["micro_batch_tokens"]),
        max(r["max_allocated_gib"] for r in passes),
        max(n for r in passes for n in r["micro_batch_tokens"]),
    )


def layout_verl_warmup_peaks(rel: str) -> Callable[[], list[Line]]:
    """The update's peak of each config of ``rel`` (a traced ``verl_compare`` file), the
    trials' beside verl's warm-up step's, which trains on the batch the trials train on (the
    job's first draw), and beside verl's whole run's, which holds its later steps' batches too;
    each with its largest micro-batch's tokens (the trials': as they cut the first draw,
    ``drawn_update_micro_batches``)."""
    from benchmarks.claims.padded_logits import drawn_update_micro_batches

    def build() -> list[Line]:
        run = load(rel).get("run", load(rel))
        header = [
            "config",
            "trial: update's peak GiB (median, n)",
            "trial: largest micro-batch, tokens",
            "verl's warm-up step: peak GiB",
            "verl's warm-up step: largest micro-batch, tokens",
            "trial off verl's warm-up step",
            "verl's run, all its steps: peak GiB",
            "verl's run: largest micro-batch, tokens",
        ]
        rows = []
        for config in run["configs"]:
            trials = [
                r
                for r in run["runs"]
                if r["config"] == config and r["kind"] == "trial" and r["status"] == "ok"
            ]
            verls = [r for r in run["runs"] if r["config"] == config and r["kind"] == "verl"]
            peaks = [r["metrics"]["update_actor_max_allocated_gib"] for r in trials]
            verl = _verl_update_peaks(verls[0]) if verls else None
            if not peaks or verl is None:
                continue
            (first_draw,) = drawn_update_micro_batches(run, config)
            trial_peak = statistics.median(peaks)
            cells = [
                config,
                f"{trial_peak:.2f} (n={len(peaks)})",
                str(max(sum(mb) for mb in first_draw)),
                f"{verl[0]:.2f}",
                str(verl[1]),
                error_pct(trial_peak, verl[0]),
                f"{verl[2]:.2f}",
                str(verl[3]),
            ]
            rows.append((cells, (f"{rel}#{config}",)))
        return [*_measured_on(load(rel), rel), *table(header, rows), Line(""), generated_from(rel)]

    return build


def layout_verl_order(rel: str, config: str) -> Callable[[], list[Line]]:
    """Per step of ``config``'s traced verl run in ``rel`` (the warm-up first): the largest
    update micro-batch verl cut (tokens), the most a micro-batch of that many sequences could
    hold (the step's longest sequences together: what a batch sorted by length puts last), and
    the largest of the trial's cut of the same drawn lengths in the order the trial gives them
    (``drawn_update_micro_batches``)."""
    from benchmarks.claims.padded_logits import drawn_update_micro_batches

    def build() -> list[Line]:
        run = load(rel).get("run", load(rel))
        (verl,) = [r for r in run["runs"] if r["config"] == config and r["kind"] == "verl"]
        warmup = verl.get("warmup_steps", 1)
        steps = warmup + len(verl_steps(verl))
        passes = _update_passes(verl)
        per = len(passes) // steps
        drawn = drawn_update_micro_batches(run, config, steps)
        header = [
            "step",
            "verl: largest micro-batch, tokens",
            "the step's longest sequences together, tokens",
            "trial's cut: largest micro-batch, tokens",
        ]
        rows = []
        for k in range(steps):
            verl_largest = max(n for r in passes[k * per : (k + 1) * per] for n in r["micro_batch_tokens"])
            micro_batches = drawn[k]
            size = max(len(mb) for mb in micro_batches)
            longest = sum(sorted((n for mb in micro_batches for n in mb), reverse=True)[:size])
            label = f"{k} (warm-up)" if k < warmup else str(k)
            cells = [label, str(verl_largest), str(longest), str(max(sum(mb) for mb in micro_batches))]
            rows.append((cells, (f"{rel}#{config}",)))
        return [*table(header, rows), Line(""), generated_from(rel)]

    return build
