"""The measured figures of the project's documents, generated from the data files they come from.

usage: python -m benchmarks.claims            # rewrite the documents' generated parts
       python -m benchmarks.claims --check    # exit 1, naming the document and parts that differ
       python -m benchmarks.claims --sources  # every generated line with its document(s) and data file(s)

The documents are ``DOCUMENTS``: the top README.md, benchmarks/README.md and
benchmarks/search/README.md. A generated part sits between ``<!-- claims:NAME -->`` and
``<!-- /claims:NAME -->`` in any of them (the same part may sit in several); the text outside
the markers is written by hand and kept as it is, with no measured figure (but for the few
benchmarks/README.md marks *untraced*). Each part is one function that returns its lines, each
line with the data files (and trials) its figures come from, paths under benchmarks/:
``jobs.py`` holds those of the GPU jobs and runs (``results/``), ``search.py`` those of the
recorded landscapes and the search comparisons, ``top.py`` the top README's, on the helpers of
``data.py``; ``CLAIMS`` below lists them. A new figure is one more function and one more row
of ``CLAIMS``, then its markers in a document and a run of ``python -m benchmarks.claims``.

Comparisons follow ``autotuner.noise``: a difference inside the noise is a tie, and a gap
between single runs of a job that measured no noise is no claim. Figures measured before the
packed-sequence layout (2026-11-24: trials without ``use_remove_padding``) are marked obsolete.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from benchmarks.claims.collector import cut_gc, cut_gc_headline
from benchmarks.claims.data import (
    HERE,
    Claim,
    Line,
)
from benchmarks.claims.jobs import (
    SWEEP,
    SWEEP_BEFORE,
    defaults_run_to_run,
    defaults_spread,
    engine_train_probe,
    engines_headline,
    engines_same_configs,
    job_report,
    layout,
    packed_job,
    packed_job_headline,
    packed_job_software,
    tp_hosts,
    tp_sweep,
    tp_sweep_headline,
    trials_per_hour,
    verl_compare,
    verl_compare_headline,
)
from benchmarks.claims.layout_verl import (
    layout_verl,
    layout_verl_hosts,
    layout_verl_log_prob_peaks,
    layout_verl_order,
    layout_verl_paired,
    layout_verl_steps,
    layout_verl_update,
    layout_verl_warmup_peaks,
    probe_ratios,
)
from benchmarks.claims.padded_logits import padded_gather, padded_update
from benchmarks.claims.search import (
    CPU_LANDSCAPE,
    CPU_SEARCH,
    LANDSCAPE,
    SEARCH,
    compare_table,
    cross_host_work,
    cross_hosts,
    landscape_facts,
    search_compare,
    search_cpu_shows,
    search_h200_composition,
    search_h200_headline,
    search_h200_shows,
)
from benchmarks.claims.strategy import (
    EXAMPLE,
    STRATEGY,
    layout_fsdp1,
    strategy_compare,
    strategy_headline,
    verl_outside_micro_batches,
)
from benchmarks.claims.top import (
    engines_top,
    first_pass_slowdown,
    job_7b_composed_top,
    job_7b_top,
    job_top,
    load_test,
    packed_job_top,
    padded_figures,
    verl_compare_top,
)
from benchmarks.claims.update_weights_gc import hand_over_after, hand_over_code_ab, update_weights_gc
from benchmarks.claims.verify import GPU_VERIFY, GPU_VERIFY_SAME_BATCH, verify_in_verl
from benchmarks.claims.verl_clock import verl_clock, verl_clock_passes, verl_clock_transformers
from benchmarks.claims.verl_h200 import verl_h200, verl_h200_headline, verl_h200_micro_batches, verl_h200_top
from benchmarks.claims.verl_lanes import (
    host_speed,
    host_speed_headline,
    verl_lanes,
    verl_lanes_controls,
    verl_lanes_forwards,
    verl_lanes_headline,
    verl_lanes_top,
)
from benchmarks.claims.verl_spread import verl_interleaved, verl_spread
from benchmarks.claims.verl_three import verl_three, verl_three_headline, verl_three_top
from benchmarks.claims.verl_trace import (
    verl_batching,
    verl_batching_entries,
    verl_batching_headline,
    verl_cut_check,
    verl_cut_counted,
    verl_cut_headline,
    verl_trace,
    verl_trace_headline,
)
from benchmarks.claims.weight_sync import WEIGHT_SYNC_H100, WEIGHT_SYNC_H100_GC, weight_sync
from benchmarks.claims.world import world_x4, world_x4_verl

ROOT = HERE.parent
README = HERE / "README.md"
# The documents whose generated parts this script writes; a part may sit in any of them.
DOCUMENTS = (ROOT / "README.md", README, HERE / "search" / "README.md")
MARK = re.compile(r"(<!-- claims:(?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /claims:(?P=name) -->)", re.S)


LAYOUTS = "results/verl-qwen2.5-1.5b-h200x4-layouts.json"
# The trials again in verl's batch order, three rounds each, beside LAYOUTS' verl runs.
LAYOUTS_ORDER = "results/verl-qwen2.5-1.5b-h200x4-layouts-order.json"
# The trials again with the logits kept at temperature 1.0 and the entropy compiled.
LAYOUTS_COMPILED = "results/verl-qwen2.5-1.5b-h200x4-layouts-compiled.json"
# Between the two: the logits kept at temperature 1.0, the entropy still eager (a part run).
LAYOUTS_UNIT_TEMPERATURE = "results/verl-qwen2.5-1.5b-h200x4-layouts-unit-temperature.json"
# The trials with the padded layout gathered as verl gathers it, at 16 prompts x 8, two hosts.
LAYOUTS_B16 = "results/verl-qwen2.5-1.5b-h200x4-layouts-b16-trials.json"
# verl's runs and three rounds of trials of each layout on one host, at 16 prompts x 8.
LAYOUTS_B16_VERL = "results/verl-qwen2.5-1.5b-h200x4-layouts-b16.json"
PADDED_GATHER = "results/padded-gather-h200-2026-11-28.json"

CLAIMS: list[Claim] = [
    # benchmarks/README.md
    Claim("defaults-spread", defaults_spread),
    Claim("defaults-run-to-run", defaults_run_to_run),
    Claim("packed-job-software", packed_job_software),
    Claim("packed-job", packed_job),
    Claim("packed-job-headline", packed_job_headline),
    Claim("layout", layout),
    Claim("layout-verl-b16", layout_verl(LAYOUTS_B16_VERL, probe=probe_ratios())),
    Claim("layout-verl-b16-paired", layout_verl_paired(LAYOUTS_B16_VERL)),
    Claim("layout-verl-b16-steps", layout_verl_steps(LAYOUTS_B16_VERL)),
    Claim("layout-verl-b16-peaks", layout_verl_warmup_peaks(LAYOUTS_B16_VERL)),
    Claim("layout-verl-b16-order", layout_verl_order(LAYOUTS_B16_VERL, "p4")),
    Claim("layout-verl-32-order", layout_verl_order(LAYOUTS, "p4")),
    Claim("layout-verl-b16-hosts", layout_verl_hosts(LAYOUTS_B16_VERL)),
    Claim("padded-gather", padded_gather(PADDED_GATHER)),
    Claim(
        "padded-update",
        padded_update(
            [
                ("verl, 32 prompts x 8", LAYOUTS, None, "verl", "verl's"),
                ("trial, 32 prompts x 8", LAYOUTS_COMPILED, None, "trial", "mask"),
                ("trial, 16 prompts x 8, host 1", LAYOUTS_B16, "host 1", "trial", "verl's"),
                ("trial, 16 prompts x 8, host 2", LAYOUTS_B16, "host 2", "trial", "verl's"),
            ]
        ),
    ),
    Claim("layout-verl-compiled", layout_verl(LAYOUTS_COMPILED, probe=probe_ratios())),
    Claim("layout-verl-compiled-steps", layout_verl_steps(LAYOUTS_COMPILED)),
    Claim(
        "layout-verl-compiled-log-probs",
        layout_verl_log_prob_peaks(
            [
                ("logits copied, entropy eager", LAYOUTS_ORDER),
                ("logits kept, entropy eager", LAYOUTS_UNIT_TEMPERATURE),
                ("logits kept, entropy compiled", LAYOUTS_COMPILED),
            ],
            LAYOUTS_COMPILED,
        ),
    ),
    Claim("layout-verl-compiled-hosts", layout_verl_hosts(LAYOUTS_COMPILED)),
    Claim("layout-verl-order", layout_verl(LAYOUTS_ORDER, probe=probe_ratios())),
    Claim("layout-verl-order-steps", layout_verl_steps(LAYOUTS_ORDER)),
    Claim("layout-verl-order-update", layout_verl_update(LAYOUTS_ORDER)),
    Claim("layout-verl-order-hosts", layout_verl_hosts(LAYOUTS_ORDER)),
    Claim("layout-verl", layout_verl(LAYOUTS, probe=probe_ratios())),
    Claim("layout-verl-steps", layout_verl_steps(LAYOUTS)),
    Claim("layout-verl-update", layout_verl_update(LAYOUTS)),
    Claim("layout-verl-hosts", layout_verl_hosts(LAYOUTS)),
    Claim("verl-lanes", verl_lanes),
    Claim("verl-lanes-headline", verl_lanes_headline),
    Claim("verl-lanes-forwards", verl_lanes_forwards),
    Claim("verl-lanes-controls", verl_lanes_controls),
    Claim("host-speed", host_speed),
    Claim("host-speed-headline", host_speed_headline),
    Claim("verl-h200", verl_h200),
    Claim("verl-h200-headline", verl_h200_headline),
    Claim("verl-h200-micro-batches", verl_h200_micro_batches),
    Claim("verl-clock", verl_clock),
    Claim("verl-clock-transformers", verl_clock_transformers),
    Claim("verl-clock-passes", verl_clock_passes),
    Claim("strategy-compare", strategy_compare(STRATEGY)),
    Claim("strategy-example", strategy_compare(EXAMPLE)),
    Claim("verl-outside-micro-batches", verl_outside_micro_batches),
    Claim("strategy-headline", strategy_headline),
    Claim("layout-fsdp1", layout_fsdp1),
    Claim("world-x4", world_x4),
    Claim("world-x4-verl", world_x4_verl),
    Claim("cut-gc", cut_gc),
    Claim("cut-gc-headline", cut_gc_headline),
    Claim("report-1.5b-job", job_report("results/qwen2.5-1.5b-grpo-job-h200.json")),
    Claim("report-1.5b", job_report("results/qwen2.5-1.5b-grpo-h200.json")),
    Claim("report-7b-job", job_report("results/qwen2-7b-grpo-8gpu-job-h200.json")),
    Claim("report-7b-job-composed", job_report("results/qwen2-7b-grpo-8gpu-composed-h200.json")),
    Claim("report-7b-8gpu", job_report("results/qwen2-7b-grpo-8gpu-h200.json")),
    Claim("report-7b-1gpu", job_report("results/qwen2-7b-grpo-1gpu-h200.json")),
    Claim("report-memmodel", job_report("results/qwen2.5-1.5b-grpo-memmodel-h200.json")),
    Claim("tp-hosts", tp_hosts),
    Claim("engine-train-probe-before-fix", engine_train_probe("before-fix")),
    Claim("engine-train-probe-after-fix", engine_train_probe("after-fix")),
    Claim("search-compare", search_compare),
    Claim("tp-sweep-before-fix", tp_sweep(SWEEP_BEFORE)),
    Claim("tp-sweep", tp_sweep(SWEEP)),
    Claim("tp-sweep-headline", tp_sweep_headline),
    Claim("trials-per-hour", trials_per_hour),
    Claim("engines-same-configs", engines_same_configs),
    Claim("engines-headline", engines_headline),
    Claim("verl-compare", verl_compare),
    Claim("verl-compare-headline", verl_compare_headline),
    Claim("verl-trace", verl_trace),
    Claim("verl-trace-headline", verl_trace_headline),
    Claim("verl-batching", verl_batching),
    Claim("verl-batching-headline", verl_batching_headline),
    Claim("verl-cut-counted", verl_cut_counted),
    Claim("verl-cut-check", verl_cut_check),
    Claim("verl-cut-headline", verl_cut_headline),
    Claim("verl-batching-entries", verl_batching_entries),
    Claim("verl-three", verl_three),
    Claim("verl-three-headline", verl_three_headline),
    Claim("verify-in-verl", verify_in_verl(GPU_VERIFY)),
    Claim("verify-in-verl-same-batch", verify_in_verl(GPU_VERIFY_SAME_BATCH)),
    Claim("weight-sync-h100", weight_sync(WEIGHT_SYNC_H100)),
    Claim("weight-sync-h100-gc", weight_sync(WEIGHT_SYNC_H100_GC)),
    Claim("update-weights-gc-h200", update_weights_gc),
    Claim("hand-over-h100", hand_over_after),
    Claim("hand-over-code-ab-h100", hand_over_code_ab),
    Claim("verl-spread-h100", verl_spread),
    Claim("verl-interleaved-h100", verl_interleaved),
    # README.md
    Claim("search-h200-headline", search_h200_headline),
    Claim("job-top", job_top),
    Claim("job-7b-top", job_7b_top),
    Claim("job-7b-composed-top", job_7b_composed_top),
    Claim("packed-job-top", packed_job_top),
    Claim("padded-figures", padded_figures),
    Claim("first-pass-slowdown", first_pass_slowdown),
    Claim("engines-top", engines_top),
    Claim("verl-compare-top", verl_compare_top),
    Claim("verl-h200-top", verl_h200_top),
    Claim("verl-lanes-top", verl_lanes_top),
    Claim("verl-three-top", verl_three_top),
    Claim("load-test", load_test),
    # search/README.md
    Claim("search-cpu-landscape", lambda: landscape_facts(CPU_LANDSCAPE)),
    Claim("search-cpu-compare", lambda: compare_table(CPU_SEARCH)),
    Claim("search-cpu-shows", search_cpu_shows),
    Claim("search-h200-landscape", lambda: landscape_facts(LANDSCAPE)),
    Claim("search-h200-compare", lambda: compare_table(SEARCH)),
    Claim("search-h200-shows", search_h200_shows),
    Claim("search-h200-composition", search_h200_composition),
    Claim("search-cross-hosts", cross_hosts),
    Claim("search-cross-host-work", cross_host_work),
]


# ----------------------------------------------------------------------------- the documents


def generate() -> dict[str, list[Line]]:
    return {claim.name: claim.build() for claim in CLAIMS}


def render(text: str, parts: dict[str, list[Line]] | None = None) -> str:
    """``text`` with each generated part's body replaced by its lines."""
    parts = parts if parts is not None else generate()

    def body(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in parts:
            raise KeyError(f"part {name!r} is not in benchmarks.claims.CLAIMS")
        return match.group(1) + "".join(line.text + "\n" for line in parts[name]) + match.group(4)

    return MARK.sub(body, text)


def quoted(text: str) -> list[str]:
    """The names of the generated parts ``text`` has markers for."""
    return [m["name"] for m in MARK.finditer(text)]


def differing(text: str, parts: dict[str, list[Line]] | None = None) -> list[str]:
    """The generated parts of ``text`` that differ from the script's output."""
    have = {m["name"]: m["body"] for m in MARK.finditer(text)}
    fresh = {m["name"]: m["body"] for m in MARK.finditer(render(text, parts))}
    return [name for name in have if have[name] != fresh[name]]


def unquoted(texts: list[str]) -> list[str]:
    """The parts of ``CLAIMS`` that none of ``texts`` has markers for."""
    names = {name for text in texts for name in quoted(text)}
    return [claim.name for claim in CLAIMS if claim.name not in names]


def name_of(document: Path) -> str:
    return str(document.relative_to(ROOT))


def stale(texts: dict[Path, str], parts: dict[str, list[Line]] | None = None) -> list[str]:
    """One line per document whose generated parts differ from the script's output, naming
    them, and one naming the parts no document quotes; empty when all is current."""
    parts = parts if parts is not None else generate()
    out = [
        f"{name_of(doc)} differs from `python -m benchmarks.claims` in: {', '.join(names)}"
        for doc, text in texts.items()
        if (names := differing(text, parts))
    ]
    missing = unquoted(list(texts.values()))
    return out + ([f"no document quotes: {', '.join(missing)}"] if missing else [])


def sources(texts: dict[Path, str], parts: dict[str, list[Line]] | None = None) -> list[str]:
    """Every generated line with a source, the documents that quote it and its data files."""
    parts = parts if parts is not None else generate()
    where = {name: [name_of(doc) for doc, text in texts.items() if name in quoted(text)] for name in parts}
    return [
        f"{', '.join(where[name]) or '(no document)'}: {name}: {line.text}\n    <- {', '.join(line.sources)}"
        for name, lines in parts.items()
        for line in lines
        if line.sources
    ]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a document differs")
    parser.add_argument("--sources", action="store_true", help="print each line's data files")
    args = parser.parse_args(argv)
    texts = {doc: doc.read_text() for doc in DOCUMENTS}
    parts = generate()
    if args.sources:
        print("\n".join(sources(texts, parts)))
        return 0
    if args.check:
        problems = stale(texts, parts)
        print("\n".join(problems), end="\n" if problems else "")
        return 1 if problems else 0
    for doc, text in texts.items():
        doc.write_text(render(text, parts))
        print(f"wrote {name_of(doc)} ({len(quoted(text))} generated parts)")
    return 0
