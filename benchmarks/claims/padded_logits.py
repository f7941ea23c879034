"""What the padded layout (``use_remove_padding: False``) holds through the update's backward.

verl 0.9.1's padded path gathers a micro-batch's real positions from its padded logits
``(B, L, vocab)`` through a jagged view (``torch.nested.narrow``, ``unbind``, ``cat``), and
autograd keeps that view: the padded logits live until the backward, which builds their
gradient beside them. A boolean-mask gather keeps nothing of them. Two figures:

- ``padded_gather``: one padded micro-batch on one GPU (``benchmarks/gpu/padded_gather.py``),
  gathered each way: what is still allocated after the forward, and the peak through the
  backward.
- ``padded_update``: pad4's update peak (the layouts' runs) taken apart. Its largest
  micro-batch's padded logits ``P`` (rows x its longest sequence x vocab, bf16) and gathered
  rows ``R`` (its real tokens x vocab) come from the job's drawn lengths in verl's batch
  order (``trials.lengths``), the actor's resident state from the trial's
  ``actor_allocated_gib``. What is left of the peak beside ``P + R`` (mask gather) or
  ``2P + R`` (verl's gather) is the padded activations and the layers in flight, which grow
  with the micro-batch's padded positions: the same per position across runs where the
  held logits are counted right.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from benchmarks.claims.data import HERE, Line, generated_from, load, table, verl_steps

GIB = 2**30
BF16 = 2
PAD4 = "pad4"
PEAK = "update_actor_max_allocated_gib"
VERL_PEAK = "actor/perf/max_memory_allocated_gb"


def padded_gather(rel: str) -> Callable[[], list[Line]]:
    """The two gathers of ``rel`` (a ``padded_gather`` file): medians over its repeats."""

    def build() -> list[Line]:
        doc = load(rel)
        header = ["gather", "held after the forward, GiB", "peak through the backward, GiB", "runs"]
        rows = []
        for way, label in (("mask", "boolean mask"), ("nested", "verl's (nested narrow + cat)")):
            runs = [r for r in doc["runs"] if r["way"] == way]
            held = statistics.median(r["held_after_forward_gib"] for r in runs)
            peak = statistics.median(r["peak_gib"] for r in runs)
            rows.append(([label, f"{held:.2f}", f"{peak:.2f}", str(len(runs))], (rel,)))
        ce = "flash-attn's cross-entropy" if doc["flash_attn_cross_entropy"] else "a float32 log-softmax"
        lengths = ", ".join(str(n) for n in doc["lengths"])
        return [
            *table(header, rows),
            Line(""),
            Line(
                f"One micro-batch of {len(doc['lengths'])} sequences ({lengths} tokens) padded to the "
                f"longest, its padded logits {doc['padded_logits_gib']:.2f} GiB; {doc['device']}, "
                f"torch {doc['versions']['torch']}, log-probabilities through {ce}.",
                (rel,),
            ),
            generated_from(rel),
        ]

    return build


def drawn_update_micro_batches(run: dict[str, Any], config: str, steps: int = 1) -> list[list[list[int]]]:
    """For each of the first ``steps`` batches the job draws (the first is the one every trial
    trains on and verl's warm-up step), the update's micro-batches of ``config`` in ``run``'s
    workload, each as its sequences' lengths (prompt + response), cut as the trial cuts them
    (``trials.batching.update_plan``) from the batch in verl's order."""
    from autotuner.spec import load_job_spec
    from autotuner.trialspec import build_trial_spec
    from benchmarks.gpu.verl_compare import scaled
    from trials.batching import update_plan
    from trials.lengths import steps_lengths, verl_batch_order

    workload = run["workload"]
    spec = scaled(
        load_job_spec(HERE.parent / run["job"]), workload["train_batch_size"], workload["ppo_mini_batch_size"]
    )
    arch = spec.validate_model()
    knobs = run["configs"][config]
    trial = build_trial_spec(spec, arch, knobs, "lengths", "cuda", 100.0)
    batch = trial.batch
    assert batch is not None
    prompts, responses = steps_lengths(batch, steps)
    actor = "actor_rollout_ref.actor."
    dynamic = str(knobs.get(f"{actor}use_dynamic_bsz", False)).lower() == "true"
    rows = int(knobs.get(f"{actor}ppo_micro_batch_size_per_gpu") or 1)
    budget = int(knobs.get(f"{actor}ppo_max_token_len_per_gpu") or 0)
    out = []
    for step in range(steps):
        drawn = range(step * batch.prompts, (step + 1) * batch.prompts)
        step_prompts = [prompts[i] for i in drawn for _ in range(batch.samples_per_prompt)]
        step_responses = [n for i in drawn for n in responses[i]]
        order = verl_batch_order(step_prompts, step_responses, batch.train_ranks)[: batch.train_sequences]
        ordered = [step_prompts[i] + step_responses[i] for i in order]
        plan = update_plan(ordered, trial.local_mini_batch_size, rows, dynamic, budget)
        out.append([[ordered[i] for i in mb.indices] for mb in plan])
    return out


def padded_micro_batches(run: dict[str, Any], config: str, steps: int = 1) -> list[tuple[float, float, int]]:
    """For each of the first ``steps`` batches the job draws, ``P`` and ``R`` (GiB) of the
    widest padded micro-batch of ``config`` in ``run``'s workload
    (``drawn_update_micro_batches``), and its padded positions."""
    bytes_per_position = load_vocab(run) * BF16 / GIB
    out = []
    for micro_batches in drawn_update_micro_batches(run, config, steps):
        widest = max(micro_batches, key=lambda lengths: len(lengths) * max(lengths))
        positions = len(widest) * max(widest)
        out.append((positions * bytes_per_position, sum(widest) * bytes_per_position, positions))
    return out


def load_vocab(run: dict[str, Any]) -> int:
    """The vocabulary of ``run``'s model."""
    from autotuner.spec import load_job_spec

    return load_job_spec(HERE.parent / run["job"]).validate_model().vocab_size


def _run_of(rel: str, host: str | None) -> dict[str, Any]:
    doc = load(rel)
    if host is None:
        return doc.get("run", doc)
    return next(h["run"] for h in doc["hosts"] if h["name"] == host)


@dataclass(frozen=True)
class Decomposed:
    """pad4's update peak of one source, taken apart (GiB; ``left_*`` per 1,000 padded
    positions of the widest micro-batch, with ``P + R`` or ``2P + R`` of logits held)."""

    n: int
    peak: float
    state: float
    p: float
    r: float
    left_if_mask: float
    left_if_nested: float


def decompose(rel: str, host: str | None, kind: str) -> Decomposed:
    """``kind`` "trial": the median of the file's pad4 trials' ``update_actor_max_allocated_gib``;
    "verl": the median of its pad4 verl runs' measured steps' peak. The actor's resident state
    from the file's pad4 trials either way."""
    run = _run_of(rel, host)
    trials = [r for r in run["runs"] if r["config"] == PAD4 and r["kind"] == "trial" and r["status"] == "ok"]
    state = statistics.median(r["metrics"]["actor_allocated_gib"] for r in trials)
    if kind == "trial":
        peaks = [r["metrics"][PEAK] for r in trials]
    else:
        verls = [r for r in run["runs"] if r["config"] == PAD4 and r["kind"] == "verl"]
        peaks = [s[VERL_PEAK] for r in verls for s in verl_steps(r)]
    peak = statistics.median(peaks)
    ((p, r, positions),) = padded_micro_batches(run, PAD4)
    mask, nested = (1000 * (peak - state - held) / positions for held in (p + r, 2 * p + r))
    return Decomposed(len(peaks), peak, state, p, r, mask, nested)


def padded_update(sources: list[tuple[str, str, str | None, str, str]]) -> Callable[[], list[Line]]:
    """pad4's update peak taken apart (``decompose``), one row per ``(label, file, host, kind,
    gather)``. verl's peak is its process's since the start: its warm-up step's where that
    step holds the run's widest padded micro-batch, as at 32 prompts x 8 (the warm-up step
    trains on the batch the trials train on, the job's first draw). What is left beside the
    logits, per 1,000 padded positions of the widest micro-batch, under each count of the
    logits held: the count that fits the gather gives the same figure in every row."""

    def build() -> list[Line]:
        header = [
            "run",
            "gather",
            "update's peak GiB",
            "actor's state GiB",
            "P GiB",
            "R GiB",
            "left per 1,000 padded positions if P + R held, GiB",
            "if 2P + R held, GiB",
        ]
        rows = []
        for label, rel, host, kind, gather in sources:
            d = decompose(rel, host, kind)
            cells = [
                f"{label} (n={d.n})",
                gather,
                f"{d.peak:.2f}",
                f"{d.state:.2f}",
                f"{d.p:.2f}",
                f"{d.r:.2f}",
            ]
            rows.append(([*cells, f"{d.left_if_mask:.3f}", f"{d.left_if_nested:.3f}"], (rel,)))
        used = dict.fromkeys(rel for _, rel, *_ in sources)
        return [*table(header, rows), Line(""), generated_from(*used)]

    return build
