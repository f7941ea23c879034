"""The rollout phase's measurement, for any ``RolloutBackend`` already started.

A warm-up of ``spec.warmup_requests`` short requests (their own random prompts) runs
first and is excluded. Then
every request of the replica is submitted at once (as verl's rollout does) and the
makespan is the wall time until the last one finished. Each request must come back
with exactly the tokens it asked for; anything else is a ``GenerationMismatch``, or a
``KvCacheExhausted`` (an ``oom``) when the engine's KV cache could not hold the requests
(SGLang then returns short outputs instead of failing: a fast trial that did not do the
work must never pass for a fast config).
"""

from __future__ import annotations

import logging

from trials import logcapture
from trials.errors import ConfigRejected, GenerationMismatch, InvalidTrialSpec, KvCacheExhausted
from trials.failures import kv_exhaustion_marker
from trials.rollout.base import Generation, RolloutBackend
from trials.types import TrialSpec
from trials.workload import random_sequences

log = logging.getLogger(__name__)

WARMUP_PROMPT_TOKENS = 32
WARMUP_MAX_TOKENS = 8


def check_rollout_spec(spec: TrialSpec) -> None:
    """Refuse a workload the replica cannot serve as asked, before starting an engine."""
    prompts, responses = spec.prompt_lengths, spec.response_lengths
    if not prompts or len(prompts) != len(responses):
        raise InvalidTrialSpec(
            f"prompt_lengths ({len(prompts)}) and response_lengths ({len(responses)}) must "
            "be non-empty and of equal length for the rollout phase"
        )
    if min(prompts) < 1 or min(responses) < 1:
        raise InvalidTrialSpec("every prompt and response length must be >= 1")
    longest = max(p + r for p, r in zip(prompts, responses, strict=True))
    if longest > spec.rollout.max_model_len:
        raise ConfigRejected(
            f"a request needs {longest} tokens (prompt + response) but max_model_len="
            f"{spec.rollout.max_model_len}; verl requires max_model_len >= "
            "max_prompt_length + max_response_length. Raise max_model_len."
        )


def check_lengths(spec: TrialSpec, generation: Generation, kv_cache_tokens: int | None) -> None:
    """Every request must come back with exactly the tokens it asked for.

    Requests cut short because the KV cache could not hold them raise ``KvCacheExhausted``
    (an ``oom``): one needed more tokens than the cache holds, or the engine's own account
    of it (``Generation.notes``) or its log says the cache ran out. Any other difference
    raises ``GenerationMismatch``.
    """
    counts, asked = generation.generated_tokens, spec.response_lengths
    if len(counts) != len(asked):
        raise GenerationMismatch(f"engine returned {len(counts)} outputs for {len(asked)} asked")
    wrong = [i for i, (got, want) in enumerate(zip(counts, asked, strict=True)) if got != want]
    if not wrong:
        return
    first = wrong[0]
    what = (
        f"engine returned {counts[first]} tokens for a request asking {asked[first]} "
        f"(request {first}; {len(wrong)} of {len(asked)} requests came back with other "
        "lengths than asked)"
    )
    short = [i for i in wrong if counts[i] < asked[i]]
    why = _kv_exhaustion(spec, generation, short, kv_cache_tokens)
    if why is not None:
        raise KvCacheExhausted(
            f"{what}: the KV cache ran out ({why}). The engine returned short outputs instead "
            "of failing; give it a larger gpu_memory_utilization (SGLang: mem_fraction_static) "
            "or fewer concurrent sequences (max_num_seqs)."
        )
    note = next((generation.notes[i] for i in wrong if i in generation.notes), None)
    raise GenerationMismatch(what + (f"; the engine says: {note}" if note else ""))


def _kv_exhaustion(
    spec: TrialSpec, generation: Generation, short: list[int], kv_cache_tokens: int | None
) -> str | None:
    """Why the ``short`` requests ran out of KV cache, or None when nothing says they did."""
    if not short:
        return None
    if kv_cache_tokens is not None:
        for i in short:
            need = spec.prompt_lengths[i] + spec.response_lengths[i]
            if need > kv_cache_tokens:
                return (
                    f"request {i} needs {need} tokens of KV cache (prompt + response), the "
                    f"cache holds {kv_cache_tokens}"
                )
    for i in short:
        note = generation.notes.get(i)
        if note and kv_exhaustion_marker(note):
            return f"the engine says: {note}"
    line = kv_exhaustion_marker(logcapture.current_text())
    return f"the engine logged: {line}" if line else None


def replica_prompts(spec: TrialSpec) -> list[list[int]]:
    """Seeded random prompts; each group of ``samples_per_prompt`` requests shares one."""
    group = max(1, spec.samples_per_prompt)
    lengths = spec.prompt_lengths
    longest = [max(lengths[i : i + group]) for i in range(0, len(lengths), group)]
    unique = random_sequences(spec.model_config, longest, spec.seed)
    return [unique[i // group][: lengths[i]].tolist() for i in range(len(lengths))]


def measure_rollout(backend: RolloutBackend, spec: TrialSpec) -> dict[str, float]:
    """Warm up, generate the replica's requests, verify lengths; the rollout metrics."""
    prompts = replica_prompts(spec)
    if spec.warmup_requests > 0:  # own tokens, so the prefix cache gains nothing from it
        warmup = random_sequences(
            spec.model_config, [WARMUP_PROMPT_TOKENS] * spec.warmup_requests, spec.seed + 1000
        )
        backend.generate([w.tolist() for w in warmup], [WARMUP_MAX_TOKENS] * len(warmup))
    preempted_before = backend.facts().preemptions
    generation = backend.generate(prompts, list(spec.response_lengths))
    facts = backend.facts()
    check_lengths(spec, generation, facts.kv_cache_tokens)
    prompt_tokens = sum(spec.prompt_lengths)
    generated = sum(generation.generated_tokens)
    makespan = generation.elapsed_s
    metrics = {
        "rollout_requests": float(len(prompts)),
        "rollout_prompt_tokens": float(prompt_tokens),
        "rollout_generated_tokens": float(generated),
        "rollout_makespan_s": makespan,
        "rollout_generated_tokens_per_s": generated / makespan,
        "rollout_total_tokens_per_s": (prompt_tokens + generated) / makespan,
    }
    if facts.kv_cache_tokens is not None:
        metrics["kv_cache_tokens"] = float(facts.kv_cache_tokens)
    if facts.preemptions is not None and preempted_before is not None:
        metrics["rollout_preemptions"] = float(facts.preemptions - preempted_before)
    log.info(
        "rollout: %d requests, %d generated tokens in %.2f s (%.0f tok/s)",
        len(prompts),
        generated,
        makespan,
        generated / makespan,
    )
    return metrics
